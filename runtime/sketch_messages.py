"""Conversion of the sketch catalogue's messages, shared by the curator, the owners and consumers.

Specs travel curator -> owners and consumers as ``SketchSpec``; sketches travel owner -> curator ->
consumers as ``PrivateSketch`` (inside ``PublishedSketch``). Arrays are packed float64 / int64
(:mod:`dpmarket.runtime.arrays`), so every value crosses the wire exactly and a sketch read back
equals, bit for bit, the one sent. Every ``*_from_proto`` validates what it builds: a sketch through
:meth:`~dpmarket.common.sketches.sketch.PrivateSketch.validate` (scales recomputed from the public
parameters, shapes, finiteness), a spec by recomputing its key. One module converts them for every
service (as :mod:`dpmarket.runtime.cape_messages` does for CAPE).
"""

from __future__ import annotations

from typing import cast

import numpy as np

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.feature_maps import FeatureMap, HISTMap, RACEMap, RFFMap
from dpmarket.common.sketches.marginals import (
    MarginalsMap,
    MarginalsMechanism,
    MarginalsSketch,
    Measurement,
)
from dpmarket.common.sketches.marginals_fit import FittedTree, MarginalsFit, carried_fit
from dpmarket.common.sketches.sketch import PrivateSketch, SketchMechanism
from dpmarket.common.sketches.spec import (
    AnyMechanism,
    AnySketch,
    Noise,
    PublishedSketch,
    SketchSpec,
)
from dpmarket.runtime.arrays import array_from_proto, array_to_proto
from dpmarket.v1 import sketch_pb2

_NOISES: dict[sketch_pb2.SketchNoise.ValueType, Noise] = {
    sketch_pb2.SKETCH_NOISE_LAPLACE: "laplace",
    sketch_pb2.SKETCH_NOISE_GAUSSIAN: "gaussian",
}
_NOISES_TO_PROTO = {v: k for k, v in _NOISES.items()}


def _invalid(exc: ValueError, what: str) -> InvalidArgumentError:
    if isinstance(exc, InvalidArgumentError):
        return exc
    return InvalidArgumentError(f"{what}: {exc}")


def noise_to_proto(noise: str) -> sketch_pb2.SketchNoise.ValueType:
    """``"laplace"`` / ``"gaussian"`` -> SketchNoise.

    Raises
    ------
    InvalidArgumentError
        For any other mechanism (the exact sketch is never sent).
    """
    value = _NOISES_TO_PROTO.get(cast(Noise, noise))
    if value is None:
        raise InvalidArgumentError(
            f"only private sketches travel (Laplace or Gaussian noise), got mechanism {noise!r}"
        )
    return value


def noise_from_proto(value: sketch_pb2.SketchNoise.ValueType) -> Noise:
    """SketchNoise -> ``"laplace"`` / ``"gaussian"``; InvalidArgumentError otherwise."""
    noise = _NOISES.get(value)
    if noise is None:
        raise InvalidArgumentError(f"the sketch's noise is missing or unknown ({value})")
    return noise


def domain_to_proto(domain: Domain) -> sketch_pb2.SketchDomain:
    """Domain -> SketchDomain (column names: the domain's, or ``column j``)."""
    columns = []
    for j in range(domain.n_attributes):
        levels = domain.level_values(j)
        columns.append(
            sketch_pb2.SketchColumn(
                name=domain.names[j] if domain.names else "",
                low=float(domain.low[j]),
                high=float(domain.high[j]),
                levels=[] if levels is None else levels.tolist(),
                integer=domain.is_integer(j),
            )
        )
    return sketch_pb2.SketchDomain(columns=columns)


def domain_from_proto(message: sketch_pb2.SketchDomain) -> Domain:
    """SketchDomain -> Domain.

    Raises
    ------
    InvalidArgumentError
        For no column, bounds with ``low >= high`` or not finite, or bad levels.
    """
    columns = list(message.columns)
    if not columns:
        raise InvalidArgumentError("the domain has no column")
    names = tuple(c.name for c in columns)
    levels = tuple(np.array(c.levels) if c.levels else None for c in columns)
    try:
        return Domain(
            np.array([c.low for c in columns]),
            np.array([c.high for c in columns]),
            names=names if all(names) else (),
            levels=levels if any(lv is not None for lv in levels) else (),
            integers=tuple(bool(c.integer) for c in columns),
        )
    except ValueError as exc:
        raise _invalid(exc, "domain") from None


def feature_map_to_proto(fmap: FeatureMap) -> sketch_pb2.FeatureMap:
    """RFFMap / RACEMap / HISTMap / MarginalsMap -> FeatureMap (parameters as packed arrays)."""
    if isinstance(fmap, MarginalsMap):
        return sketch_pb2.FeatureMap(
            marginals=sketch_pb2.MarginalsMap(
                low=array_to_proto(fmap.low),
                high=array_to_proto(fmap.high),
                cuts=array_to_proto(fmap.cuts),
                cells=array_to_proto(np.asarray(fmap.cells, dtype=np.int64)),
                rounds=fmap.rounds,
                measurements=fmap.measurements,
                max_cells=fmap.max_cells,
                rows=fmap.rows,
            )
        )
    if isinstance(fmap, RFFMap):
        return sketch_pb2.FeatureMap(
            rff=sketch_pb2.RffMap(omega=array_to_proto(fmap.omega), sigma=fmap.sigma)
        )
    if isinstance(fmap, RACEMap):
        return sketch_pb2.FeatureMap(
            race=sketch_pb2.RaceMap(
                projections=array_to_proto(fmap.projections),
                offsets=array_to_proto(fmap.offsets),
                bucket_width=fmap.bucket_width,
                buckets=fmap.n_buckets,
            )
        )
    if isinstance(fmap, HISTMap):
        return sketch_pb2.FeatureMap(
            hist=sketch_pb2.HistMap(
                low=array_to_proto(fmap.low),
                high=array_to_proto(fmap.high),
                bins=array_to_proto(np.asarray(fmap.n_bins, dtype=np.int64)),
            )
        )
    raise TypeError(f"no message for feature map {type(fmap).__name__}")


def feature_map_from_proto(message: sketch_pb2.FeatureMap) -> FeatureMap:
    """FeatureMap -> RFFMap / RACEMap / HISTMap / MarginalsMap, validated by its constructor.

    Raises
    ------
    InvalidArgumentError
        For no map, malformed arrays, or invalid parameters.
    """
    kind = message.WhichOneof("kind")
    try:
        if kind == "rff":
            rff = message.rff
            return RFFMap(array_from_proto(rff.omega, "omega", ndim=2, dtype=np.float64), rff.sigma)
        if kind == "race":
            race = message.race
            return RACEMap(
                array_from_proto(race.projections, "projections", ndim=2, dtype=np.float64),
                array_from_proto(race.offsets, "offsets", ndim=1, dtype=np.float64),
                race.bucket_width,
                int(race.buckets),
            )
        if kind == "hist":
            hist = message.hist
            return HISTMap(
                array_from_proto(hist.low, "low", ndim=1, dtype=np.float64),
                array_from_proto(hist.high, "high", ndim=1, dtype=np.float64),
                array_from_proto(hist.bins, "bins", ndim=1, dtype=np.int64),
            )
        if kind == "marginals":
            marg = message.marginals
            return MarginalsMap(
                array_from_proto(marg.low, "low", ndim=1, dtype=np.float64),
                array_from_proto(marg.high, "high", ndim=1, dtype=np.float64),
                array_from_proto(marg.cuts, "cuts", ndim=1, dtype=np.float64),
                array_from_proto(marg.cells, "cells", ndim=1, dtype=np.int64),
                rounds=int(marg.rounds),
                measurements=int(marg.measurements),
                max_cells=int(marg.max_cells),
                rows=int(marg.rows),
            )
    except ValueError as exc:
        raise _invalid(exc, f"{kind} feature map") from None
    raise InvalidArgumentError("the feature map is missing (rff, race, hist or marginals)")


def mechanism_to_proto(mechanism: AnyMechanism) -> sketch_pb2.SketchMechanism:
    """SketchMechanism / MarginalsMechanism -> SketchMechanism message (a private one only)."""
    if isinstance(mechanism, MarginalsMechanism):
        return sketch_pb2.SketchMechanism(
            feature_map=feature_map_to_proto(mechanism.feature_map),
            domain=domain_to_proto(mechanism.domain),
            noise=noise_to_proto(mechanism.mechanism),
            epsilon=mechanism.epsilon,
            delta=mechanism.delta,
        )
    assert mechanism.sum_scale is not None and mechanism.count_scale is not None
    return sketch_pb2.SketchMechanism(
        feature_map=feature_map_to_proto(mechanism.feature_map),
        domain=domain_to_proto(mechanism.domain),
        noise=noise_to_proto(mechanism.mechanism),
        epsilon=mechanism.epsilon,
        delta=mechanism.delta,
        numerator_share=mechanism.numerator_share,
        sum_scale=mechanism.sum_scale,
        count_scale=mechanism.count_scale,
    )


def mechanism_from_proto(message: sketch_pb2.SketchMechanism) -> AnyMechanism:
    """SketchMechanism message -> SketchMechanism (the received scales must match the ones the
    other fields imply) or, for a marginals map, MarginalsMechanism (Gaussian, no scales).

    Raises
    ------
    InvalidArgumentError
        For a missing or malformed part, or scales that do not match.
    """
    fmap = feature_map_from_proto(message.feature_map)
    domain = domain_from_proto(message.domain)
    try:
        if isinstance(fmap, MarginalsMap):
            if noise_from_proto(message.noise) != "gaussian" or (
                message.numerator_share or message.sum_scale or message.count_scale
            ):
                raise InvalidArgumentError(
                    "a marginals sketch is Gaussian, without numerator_share or scales"
                )
            return MarginalsMechanism(fmap, domain, message.epsilon, message.delta)
        return SketchMechanism(
            fmap,
            domain,
            message.epsilon,
            noise_from_proto(message.noise),
            message.delta,
            message.numerator_share,
            message.sum_scale,
            message.count_scale,
        )
    except ValueError as exc:
        raise _invalid(exc, "sketch mechanism") from None


def sketch_to_proto(sketch: AnySketch) -> sketch_pb2.PrivateSketch:
    """PrivateSketch / MarginalsSketch -> PrivateSketch message."""
    if isinstance(sketch, MarginalsSketch):
        return sketch_pb2.PrivateSketch(
            mechanism=mechanism_to_proto(sketch.mechanism),
            marginals=sketch_pb2.MarginalsRelease(
                measurements=[
                    sketch_pb2.NoisyMarginal(
                        clique=list(m.clique), values=array_to_proto(m.values), sigma=m.sigma
                    )
                    for m in sketch.measurements
                ],
                selection_epsilons=list(sketch.selections),
                fit=None if (fit := carried_fit(sketch)) is None else fit_to_proto(fit),
            ),
        )
    return sketch_pb2.PrivateSketch(
        mechanism=mechanism_to_proto(sketch.mechanism),
        noisy_sum=array_to_proto(np.asarray(sketch.noisy_sum, dtype=np.float64)),
        noisy_count=sketch.noisy_count,
    )


def sketch_from_proto(message: sketch_pb2.PrivateSketch) -> AnySketch:
    """PrivateSketch message -> PrivateSketch or MarginalsSketch, validated
    (:meth:`PrivateSketch.validate`, :meth:`MarginalsSketch.validate`).

    Raises
    ------
    InvalidArgumentError
        For anything malformed or self-inconsistent, naming it.
    """
    mechanism = mechanism_from_proto(message.mechanism)
    if isinstance(mechanism, MarginalsMechanism) != message.HasField("marginals"):
        raise InvalidArgumentError(
            "a sketch carries marginals exactly when its feature map is a marginals map"
        )
    try:
        if isinstance(mechanism, MarginalsMechanism):
            if message.HasField("noisy_sum") or message.noisy_count:
                raise InvalidArgumentError("a marginals sketch has no noisy_sum or noisy_count")
            return MarginalsSketch(
                mechanism,
                tuple(
                    Measurement(
                        tuple(int(c) for c in m.clique),
                        array_from_proto(m.values, "values", ndim=1, dtype=np.float64),
                        m.sigma,
                    )
                    for m in message.marginals.measurements
                ),
                tuple(message.marginals.selection_epsilons),
                fit_from_proto(message.marginals.fit)
                if message.marginals.HasField("fit")
                else None,
            )
        total = array_from_proto(message.noisy_sum, "noisy_sum", ndim=1, dtype=np.float64)
        return PrivateSketch(mechanism, total, message.noisy_count)
    except ValueError as exc:
        raise _invalid(exc, "sketch") from None


def _tree_to_proto(tree: FittedTree) -> sketch_pb2.FittedTree:
    return sketch_pb2.FittedTree(
        total=tree.total,
        beliefs=[
            sketch_pb2.FittedBelief(
                columns=list(columns), axes=list(axes), table=array_to_proto(table)
            )
            for columns, axes, table in tree.beliefs
        ],
        edges=[int(k) for edge in tree.edges for k in edge],
    )


def _tree_from_proto(message: sketch_pb2.FittedTree) -> FittedTree:
    edges = list(message.edges)
    if len(edges) % 2:
        raise InvalidArgumentError(f"a fitted tree's edges must be pairs, got {len(edges)} values")
    return FittedTree(
        message.total,
        tuple(
            (
                tuple(int(c) for c in b.columns),
                tuple(int(c) for c in b.axes),
                array_from_proto(b.table, "table", dtype=np.float64),
            )
            for b in message.beliefs
        ),
        tuple(zip(edges[0::2], edges[1::2], strict=True)),
    )


def fit_to_proto(fit: MarginalsFit) -> sketch_pb2.MarginalsFit:
    """MarginalsFit -> MarginalsFit message (tables as packed float64)."""
    return sketch_pb2.MarginalsFit(
        sketch_digest=fit.digest,
        bootstrap=fit.bootstrap,
        seed=fit.seed,
        model=_tree_to_proto(fit.model),
        replicates=[_tree_to_proto(r) for r in fit.replicates],
    )


def fit_from_proto(message: sketch_pb2.MarginalsFit) -> MarginalsFit:
    """MarginalsFit message -> MarginalsFit (its size and counts checked here; its trees when a
    consumer builds the models: :meth:`MarginalsFit.models`).

    Raises
    ------
    InvalidArgumentError
        For a malformed fit, naming what.
    """
    try:
        return MarginalsFit(
            message.sketch_digest,
            message.bootstrap,
            message.seed,
            _tree_from_proto(message.model),
            tuple(_tree_from_proto(r) for r in message.replicates),
        )
    except ValueError as exc:
        raise _invalid(exc, "marginals fit") from None


def sketch_bytes(sketch: AnySketch) -> bytes:
    """The sketch's message, serialized deterministically (what owners and the catalogue store)."""
    return sketch_to_proto(sketch).SerializeToString(deterministic=True)


def sketch_from_bytes(data: bytes) -> AnySketch:
    """The inverse of :func:`sketch_bytes`, validated."""
    message = sketch_pb2.PrivateSketch()
    message.ParseFromString(data)
    return sketch_from_proto(message)


def spec_to_proto(spec: SketchSpec) -> sketch_pb2.SketchSpec:
    """SketchSpec -> SketchSpec message (with its key)."""
    low, high = spec.epsilon_range
    return sketch_pb2.SketchSpec(
        name=spec.name,
        description=spec.description,
        feature_map=feature_map_to_proto(spec.feature_map),
        domain=domain_to_proto(spec.domain),
        noise=noise_to_proto(spec.noise),
        epsilon=spec.epsilon,
        min_epsilon=low,
        max_epsilon=high,
        delta=spec.delta,
        numerator_share=spec.numerator_share,
        key=spec.key,
    )


def spec_from_proto(message: sketch_pb2.SketchSpec) -> SketchSpec:
    """SketchSpec message -> SketchSpec, validated; its key is recomputed and must match.

    Raises
    ------
    InvalidArgumentError
        For anything malformed, or a key that does not match the parameters received.
    """
    try:
        spec = SketchSpec(
            name=message.name,
            feature_map=feature_map_from_proto(message.feature_map),
            domain=domain_from_proto(message.domain),
            noise=noise_from_proto(message.noise),
            epsilon=message.epsilon,
            epsilon_range=(message.min_epsilon, message.max_epsilon),
            delta=message.delta,
            numerator_share=message.numerator_share,
            description=message.description,
        )
    except ValueError as exc:
        raise _invalid(exc, f"spec {message.name!r}") from None
    if message.key != spec.key:
        raise InvalidArgumentError(
            f"spec {message.name!r}: the key received ({message.key[:12]}…) is not the key of "
            f"the parameters received ({spec.key[:12]}…)"
        )
    return spec


def spec_bytes(spec: SketchSpec) -> bytes:
    """The spec's message, serialized deterministically (what the catalogue stores)."""
    return spec_to_proto(spec).SerializeToString(deterministic=True)


def spec_from_bytes(data: bytes) -> SketchSpec:
    """The inverse of :func:`spec_bytes`, validated."""
    message = sketch_pb2.SketchSpec()
    message.ParseFromString(data)
    return spec_from_proto(message)


def published_to_proto(entry: PublishedSketch) -> sketch_pb2.PublishedSketch:
    """PublishedSketch -> PublishedSketch message."""
    message = sketch_pb2.PublishedSketch(
        owner=entry.owner, spec=entry.spec, sketch=sketch_to_proto(entry.sketch)
    )
    message.publish_time.FromNanoseconds(round(entry.published_at * 1e9))
    return message


def published_from_proto(message: sketch_pb2.PublishedSketch) -> PublishedSketch:
    """PublishedSketch message -> PublishedSketch, the sketch validated."""
    return PublishedSketch(
        owner=message.owner,
        spec=message.spec,
        published_at=message.publish_time.seconds + message.publish_time.nanos / 1e9,
        sketch=sketch_from_proto(message.sketch),
    )
