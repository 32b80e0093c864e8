"""Sketch specifications: what a deployment's catalogue asks its owners to publish.

A private sketch is useful beyond its owner only if everyone uses the *same* public feature map:
the union of several owners' sketches (:func:`~dpmarket.common.sketches.sketch.merge_sketches`), the
comparison of a sketch with a consumer's validation set (:func:`~dpmarket.common.sketches.sketch.
sketch_mmd2`) and one M2M design for every owner all need one map. So the catalogue fixes it.

* :class:`SketchDeclaration` is what a catalogue's configuration declares, before anything is
  drawn: a public domain (a box, column by column, from documented or physical ranges, never from
  statistics of private data), the maps wanted (RFF: ``m'`` and ``sigma``; RACE: ``R``, ``W`` and
  the bucket width; HIST: bins per column; marginals: cells per column and the selection,
  :mod:`dpmarket.common.sketches.marginals`) and the mechanism (noise, the default epsilon and the
  range an owner may choose, delta, the budget split). :meth:`SketchDeclaration.draw` draws the
  random parameters once, from an injected generator.
* :class:`SketchSpec` is one drawn map with everything public about its releases except the
  owner's epsilon: :meth:`SketchSpec.mechanism` gives the :class:`~dpmarket.common.sketches.sketch.
  SketchMechanism` an owner publishes with, and :meth:`SketchSpec.check_sketch` checks that a
  received sketch was made under the spec. :attr:`SketchSpec.key` identifies the release a spec
  describes (the same key: the same map, domain and noise), so an owner releases one sketch per
  key whatever the spec is called.
* :class:`PublishedSketch` is a catalogue entry: the sketch, its owner, its spec, when.

Scales. Columns come in their own units (months, miles, minutes), so one length scale in raw units
would weigh them arbitrarily. The catalogue's RFF and RACE maps work on the columns divided by their
widths ``w_k = high_k - low_k``: RFF draws ``omega_jk ~ N(0, (sigma w_k)^-2)``, the Gaussian kernel
``exp(-sum_k (x_k - x'_k)^2 / (2 sigma^2 w_k^2))`` (length scale ``sigma w_k`` along column ``k``),
and RACE projects on ``a_rk / w_k`` with ``a_rk ~ N(0, 1)`` and a bucket width in the same
normalized units. ``sigma`` and the bucket width are thus fractions of each column's width;
:attr:`~dpmarket.common.sketches.feature_maps.RFFMap.sigma` records the declared fraction. A map
declared with ``scale = "absolute"`` skips the division: its ``sigma`` (or bucket width) is in the
columns' own units, for columns already on one public scale (e.g. the features a summarization
scenario feeds its kernel, whose length scale is a public choice in those units). The maps are still
plain :class:`~dpmarket.common.sketches.feature_maps.RFFMap` / :class:`RACEMap` values (their
parameters are data), with the sensitivities derived there: they do not depend on ``omega`` or the
projections, so a curator cannot weaken an owner's guarantee by the parameters it draws.

Pure: no I/O (the curator reads the TOML files, :mod:`dpmarket.curator.sketches`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.fourier import check_angle_bound
from dpmarket.common.schema import Column, Schema, parse_columns
from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.feature_maps import (
    FeatureMap,
    RACEMap,
    RFFMap,
    draw_race,
    draw_rff,
    histogram_map,
)
from dpmarket.common.sketches.marginals import (
    AUTO,
    DEFAULT_MAX_CELLS,
    MarginalsMap,
    MarginalsMechanism,
    MarginalsSketch,
    marginals_map,
)
from dpmarket.common.sketches.sketch import DEFAULT_NUMERATOR_SHARE, PrivateSketch, SketchMechanism
from dpmarket.common.validation import (
    check_config_keys,
    check_not_tiny,
    config_number,
    config_table,
)

__all__ = [
    "DEFAULT_DELTA",
    "MAP_KINDS",
    "NOISES",
    "AnyMechanism",
    "AnySketch",
    "Noise",
    "PublishedSketch",
    "SketchDeclaration",
    "SketchSpec",
    "mechanism_label",
]

Noise = Literal["laplace", "gaussian"]
#: The noises a catalogue may ask for (the exact, non-private sketch is never published).
NOISES: tuple[Noise, ...] = ("laplace", "gaussian")
#: A release of any kind: a linear sketch (RFF, RACE, HIST) or a marginals sketch.
AnySketch = PrivateSketch | MarginalsSketch
#: The public side of a release of any kind.
AnyMechanism = SketchMechanism | MarginalsMechanism
#: Map sections of a declaration, in the order specs are drawn and listed.
MAP_KINDS = ("rff", "race", "hist", "marginals")
#: A declaration's or spec's name: letters, digits, ``-``, ``_``, ``.``; a spec is
#: ``<declaration>/<map kind>``.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: The keys of each map section, with their meaning (for error messages).
_MAP_KEYS: dict[str, dict[str, str]] = {
    "rff": {"frequencies": "m' (the sketch has m = 2 m' entries)", "sigma": "length scale"},
    "race": {"hashes": "R", "buckets": "W", "width": "bucket width"},
    "hist": {"bins": "bins per column (one number, or one per column)"},
    "marginals": {"bins": "cells per continuous column (one number, or one per column)"},
}
#: Optional keys of a map's table: ``scale`` says whether ``sigma`` / ``width`` are fractions of
#: each column's width (``"width"``, the default) or in the columns' own units (``"absolute"``).
#: A marginals map may also set its selection (``rounds``, ``measurements``, ``max_cells``; the
#: first two derived from the domain and the budget when absent), a public estimate of an owner's
#: ``rows`` that the derived selection plans for, explicit cut points of continuous columns
#: (``cuts``, a table of column name to numbers) and its own ``delta`` (it is always Gaussian:
#: :data:`DEFAULT_DELTA` when neither it nor a Gaussian declaration gives one).
_OPTIONAL_MAP_KEYS: dict[str, tuple[str, ...]] = {
    "rff": ("scale",),
    "race": ("scale",),
    "hist": (),
    "marginals": ("rounds", "measurements", "max_cells", "cuts", "delta", "rows"),
}
#: The delta of a Gaussian release whose declaration states none: at most a tenth of ``1 / n``
#: for tables of up to 100,000 rows per owner (declare a smaller one for larger tables).
DEFAULT_DELTA = 1e-6
_SCALES = ("width", "absolute")
_NOISE_NAMES = {"laplace": "Laplace", "gaussian": "Gaussian"}


def mechanism_label(kind: str, noise: str) -> str:
    """What an owner's ledger records for a sketch release: ``"private sketch (RFF, Laplace)"``."""
    return f"private sketch ({kind.upper()}, {_NOISE_NAMES.get(noise, noise)})"


def _positive(value: Any, where: str) -> float:
    out = config_number(value, where)
    if out <= 0:
        raise InvalidArgumentError(f"{where} must be > 0, got {value!r}")
    return out


def _integer(value: Any, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or _NAME.fullmatch(value) is None:
        raise InvalidArgumentError(
            f"{where} must be 1 to 64 letters, digits, '-', '_' or '.', starting with a letter "
            f"or digit, got {value!r}"
        )
    return value


def _epsilon_range(
    epsilon: float, low: float, high: float, where: str
) -> tuple[float, float, float]:
    if not 0 < low <= epsilon <= high:
        raise InvalidArgumentError(
            f"{where}: need 0 < epsilon_range[0] <= epsilon <= epsilon_range[1], got epsilon = "
            f"{epsilon:g} and epsilon_range = [{low:g}, {high:g}]"
        )
    return epsilon, low, high


@dataclass(frozen=True, eq=False)
class SketchSpec:
    """One map of a catalogue with every public parameter of its releases but the owner's epsilon.

    Attributes
    ----------
    name : str
        ``<declaration>/<kind>``, e.g. ``"flights/rff"``.
    feature_map : FeatureMap
        The public map, parameters as data (every owner uses exactly these).
    domain : Domain
        The public domain (column names, bounds, discrete levels); every published record lies
        in it.
    noise : {"laplace", "gaussian"}
    epsilon : float
        The epsilon an owner publishes at unless it chooses another within ``epsilon_range``.
    epsilon_range : tuple of float
        ``(low, high)``, ``0 < low <= epsilon <= high``: what the catalogue accepts.
    delta : float
        0 for Laplace noise; ``0 < delta < 1`` for Gaussian noise (a declaration that states
        none gets :data:`DEFAULT_DELTA`).
    numerator_share : float
        The share of the budget spent on the sum of features (the paper's 0.98).
    description : str
        Free text shown to owners and consumers.

    Raises
    ------
    InvalidArgumentError
        (a ``ValueError``) On a bad name, noise, epsilon range or delta, a map and domain that
        do not fit together (by building the mechanism at ``epsilon``), or RFF frequencies whose
        angles can exceed :data:`dpmarket.common.fourier.ANGLE_LIMIT` on the domain
        (:func:`~dpmarket.common.fourier.check_angle_bound`: checked on public inputs before any
        owner reads a record; the features are finite beyond it anyway), or RFF frequencies or
        RACE projections and offsets non-zero below
        :data:`~dpmarket.common.validation.PARAMETER_FLOOR` in magnitude (products with a
        record's values could be subnormal, a sketch's time then following the records).
    """

    name: str
    feature_map: FeatureMap
    domain: Domain
    noise: Noise
    epsilon: float
    epsilon_range: tuple[float, float]
    delta: float = 0.0
    numerator_share: float = DEFAULT_NUMERATOR_SHARE
    description: str = ""

    def __post_init__(self) -> None:
        declaration, _, kind = self.name.partition("/")
        _name(declaration, "spec name")
        if kind != self.feature_map.kind:
            raise InvalidArgumentError(
                f"spec name {self.name!r} must be '<declaration>/{self.feature_map.kind}'"
            )
        if self.noise not in NOISES:
            raise InvalidArgumentError(f"noise must be one of {NOISES}, got {self.noise!r}")
        if isinstance(self.feature_map, MarginalsMap) and self.noise != "gaussian":
            raise InvalidArgumentError(
                f"spec {self.name}: a marginals sketch is Gaussian (zCDP), got noise {self.noise!r}"
            )
        low, high = (float(v) for v in self.epsilon_range)
        eps, low, high = _epsilon_range(float(self.epsilon), low, high, f"spec {self.name}")
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "epsilon_range", (low, high))
        object.__setattr__(self, "delta", float(self.delta))
        object.__setattr__(self, "numerator_share", float(self.numerator_share))
        try:
            self.mechanism(eps)
            if isinstance(self.feature_map, RFFMap):
                magnitudes = np.maximum(np.abs(self.domain.low), np.abs(self.domain.high))
                check_angle_bound(self.feature_map.omega, None, magnitudes, "RFF frequency")
                check_not_tiny(self.feature_map.omega, "RFF frequencies")
            if isinstance(self.feature_map, RACEMap):
                check_not_tiny(self.feature_map.projections, "RACE projections")
                check_not_tiny(self.feature_map.offsets, "RACE offsets")
        except ValueError as exc:
            raise InvalidArgumentError(f"spec {self.name}: {exc}") from None

    @property
    def kind(self) -> str:
        """The map's kind: ``"rff"``, ``"race"`` or ``"hist"``."""
        return self.feature_map.kind

    @property
    def mechanism_label(self) -> str:
        """What an owner's ledger records for a release under this spec."""
        return mechanism_label(self.kind, self.noise)

    def check_epsilon(self, epsilon: float) -> float:
        """Return ``epsilon`` if the spec accepts it.

        Raises
        ------
        InvalidArgumentError
            If it is not a finite number within :attr:`epsilon_range`.
        """
        eps = float(epsilon)
        low, high = self.epsilon_range
        if not (math.isfinite(eps) and low <= eps <= high):
            raise InvalidArgumentError(
                f"epsilon = {epsilon:g} is outside the range spec {self.name} accepts, "
                f"[{low:g}, {high:g}]"
            )
        return eps

    def mechanism(self, epsilon: float | None = None) -> AnyMechanism:
        """The mechanism of a release at ``epsilon`` (default :attr:`epsilon`).

        Returns
        -------
        SketchMechanism or MarginalsMechanism
            Noise scales computed from the map's sensitivities and ``epsilon`` (never received);
            a :class:`~dpmarket.common.sketches.marginals.MarginalsMechanism` for a marginals map.

        Raises
        ------
        InvalidArgumentError
            If ``epsilon`` is outside :attr:`epsilon_range`.
        ValueError
            If the map, domain, noise and delta are inconsistent (see SketchMechanism).
        """
        eps = self.check_epsilon(self.epsilon if epsilon is None else epsilon)
        if isinstance(self.feature_map, MarginalsMap):
            return MarginalsMechanism(self.feature_map, self.domain, eps, self.delta)
        return SketchMechanism(
            self.feature_map,
            self.domain,
            eps,
            self.noise,
            self.delta,
            self.numerator_share,
        )

    def check_sketch(self, sketch: AnySketch) -> None:
        """Check that ``sketch`` was released under this spec.

        Raises
        ------
        InvalidArgumentError
            Naming the first difference: the feature map (parameters compared exactly), the
            domain, the noise, delta, the budget split, or an epsilon outside the range. The
            sketch's own consistency (scales, shapes) is :meth:`PrivateSketch.validate`'s.
        """
        mech = sketch.mechanism
        if isinstance(sketch, MarginalsSketch) != isinstance(self.feature_map, MarginalsMap):
            raise InvalidArgumentError(
                f"the sketch is a {mech.feature_map.kind} sketch, spec {self.name} is {self.kind}"
            )
        if mech.feature_map != self.feature_map:
            raise InvalidArgumentError(
                f"the sketch's {mech.feature_map.kind} feature map is not the one of spec "
                f"{self.name} (its parameters differ): publish with the spec's map"
            )
        if mech.domain != self.domain:
            raise InvalidArgumentError(f"the sketch's domain is not the one of spec {self.name}")
        checks: list[tuple[str, Any, Any]] = [
            ("noise", self.noise, mech.mechanism),
            ("delta", self.delta, mech.delta),
        ]
        if isinstance(mech, SketchMechanism):
            checks.append(("numerator_share", self.numerator_share, mech.numerator_share))
        for what, mine, theirs in checks:
            if mine != theirs:
                raise InvalidArgumentError(
                    f"the sketch's {what} is {theirs!r}, spec {self.name} has {mine!r}"
                )
        self.check_epsilon(mech.epsilon)

    @property
    def key(self) -> str:
        """SHA-256 (hex) of the parameters that define a release: map kind and parameters,
        domain, noise, delta and budget split; not the name, the description or the epsilon
        range. Two specs with one key describe the same release."""
        digest = hashlib.sha256()

        def put(label: str, value: Any) -> None:
            digest.update(label.encode() + b"\0")
            if isinstance(value, np.ndarray):
                arr = np.ascontiguousarray(value)
                digest.update(f"{arr.dtype.str}{arr.shape}".encode() + b"\0")
                digest.update(arr.astype(arr.dtype.newbyteorder("<")).tobytes())
            else:
                digest.update(json.dumps(value).encode() + b"\0")

        put("kind", self.kind)
        params = self.feature_map.parameters()
        for k in sorted(params):
            v = params[k]
            put(k, np.asarray(v) if isinstance(v, np.ndarray) else float(v))
        put("low", self.domain.low)
        put("high", self.domain.high)
        put("names", list(self.domain.names))
        for j in range(self.domain.n_attributes):
            lv = self.domain.level_values(j)
            put(f"levels{j}", None if lv is None else lv)
        put("noise", self.noise)
        put("delta", self.delta)
        put("numerator_share", self.numerator_share)
        return digest.hexdigest()

    def describe(self) -> dict[str, Any]:
        """Every public value as plain JSON-able data (no arrays), for listings and reports."""
        return {
            "name": self.name,
            "description": self.description,
            "feature_map": self.feature_map.describe(),
            "domain": self.domain.describe(),
            "noise": self.noise,
            "epsilon": self.epsilon,
            "epsilon_range": list(self.epsilon_range),
            "delta": self.delta,
            "numerator_share": self.numerator_share,
            "key": self.key,
        }


@dataclass(frozen=True, eq=False)
class PublishedSketch:
    """A catalogue entry: one owner's sketch under one spec.

    Attributes
    ----------
    owner : str
        The publishing owner's name (its certificate's, never a message field).
    spec : str
        The spec's name.
    published_at : float
        Unix time, seconds, when the catalogue accepted it.
    sketch : PrivateSketch or MarginalsSketch
        Validated.
    """

    owner: str
    spec: str
    published_at: float
    sketch: AnySketch

    def describe(self) -> dict[str, Any]:
        """Owner, spec, time, epsilon, delta, noise, the noisy count (no arrays)."""
        mech = self.sketch.mechanism
        return {
            "owner": self.owner,
            "spec": self.spec,
            "published_at": self.published_at,
            "noise": mech.mechanism,
            "epsilon": mech.epsilon,
            "delta": mech.delta,
            "noisy_count": self.sketch.noisy_count,
            "dimension": mech.feature_map.dimension,
        }


@dataclass(frozen=True, eq=False)
class SketchDeclaration:
    """What a catalogue's configuration declares: a domain, the maps wanted and the mechanism.

    Build it with :meth:`from_mapping` (e.g. a parsed TOML file; layout in
    ``deploy/sketches/flights.toml``); :meth:`draw` turns it into one :class:`SketchSpec` per map.

    Attributes
    ----------
    name : str
        The declaration's name; its specs are ``<name>/rff``, ``<name>/race``, ``<name>/hist``.
    domain : Domain
        With column names.
    maps : tuple of (str, dict)
        ``(kind, parameters)`` in :data:`MAP_KINDS` order: ``rff``: ``frequencies`` (m'),
        ``sigma`` (fraction of every column's width); ``race``: ``hashes`` (R), ``buckets`` (W),
        ``width`` (bucket width, fraction of every column's width); ``hist``: ``bins`` (an int or
        one per column); ``marginals``: ``bins`` (as HIST's, for continuous columns; a discrete
        column has one cell per level) and optionally ``rounds``, ``measurements``,
        ``max_cells``, ``cuts`` (column name to cut points) and ``delta``
        (:func:`dpmarket.common.sketches.marginals.marginals_map`). An RFF or RACE map declared with
        ``scale = "absolute"`` carries ``"scale": "absolute"`` and its ``sigma`` / ``width`` are
        in the columns' own units.
    noise, epsilon, epsilon_range, delta, numerator_share, description
        As :class:`SketchSpec`.
    """

    name: str
    domain: Domain
    maps: tuple[tuple[str, dict[str, Any]], ...]
    noise: Noise = "laplace"
    epsilon: float = 1.0
    epsilon_range: tuple[float, float] = (1.0, 1.0)
    delta: float = 0.0
    numerator_share: float = DEFAULT_NUMERATOR_SHARE
    description: str = ""

    @classmethod
    def from_mapping(
        cls,
        data: Mapping[str, Any],
        *,
        default_name: str = "",
        source: str = "sketch spec",
        schema: Schema | None = None,
    ) -> SketchDeclaration:
        """Parse a declaration (a TOML document's tables).

        Layout::

            name = "flights"              # optional: default_name (the file's stem)
            description = "..."
            [mechanism]
            noise = "laplace"             # or "gaussian" (then delta, default 1e-6)
            epsilon = 1.0                 # default epsilon of a publication
            epsilon_range = [0.1, 2.0]    # what an owner may choose; default [epsilon, epsilon]
            numerator_share = 0.98
            delta = 0.0
            [[columns]]                   # in order; public bounds (dpmarket.common.schema)
            name = "distance"
            type = "continuous"           # optional: continuous, or categorical with levels
            low = 0.0
            high = 5000.0
            levels = [...]                # optional: a discrete column's values
            [maps.rff]
            frequencies = 100
            sigma = 0.2
            scale = "width"               # optional: or "absolute" (sigma in column units)
            [maps.race]
            hashes = 20
            buckets = 20
            width = 0.25
            [maps.hist]
            bins = 20
            [maps.marginals]              # noisy marginals answered by a graphical model
            bins = 16                     # cells per continuous column (discrete: levels)
            rows = 20000                  # optional: public estimate of an owner's rows
            measurements = 24             # optional: 2-way marginals (default: derived)
            rounds = 4                    # optional: selection rounds (default: derived)
            max_cells = 10000             # optional: largest 2-way marginal selectable
            delta = 1e-6                  # optional (default: the declaration's, or 1e-6)
            [maps.marginals.cuts]         # optional: a continuous column's cut points
            wage = [100.0, 200.0, 400.0]

        Instead of ``[[columns]]``, a declaration may name a dataset's schema file, ``schema =
        "schema.toml"`` (:mod:`dpmarket.common.schema`), and optionally ``columns = ["age", "bmi"]``
        to sketch some of its columns (default: every column). The caller reads that file and passes
        it as ``schema``.

        Raises
        ------
        InvalidArgumentError
            Naming ``source`` and the key, for an unknown section or key, a missing one, a wrong
            type or an out-of-range value (bounds with ``low >= high``, levels outside them,
            repeated column names, no map at all), or a ``schema`` key without ``schema``.
        """
        where = source
        data = config_table(data, where)
        check_config_keys(
            data, ("name", "description", "mechanism", "columns", "maps", "schema"), where
        )
        if ("schema" in data) != (schema is not None):
            raise InvalidArgumentError(
                f"{where}: the schema key names a schema file, which the caller must read"
                if schema is None
                else f"{where}: a schema was given but the declaration names none"
            )
        name = _name(data.get("name", default_name), f"{where}: name")
        description = data.get("description", "")
        if not isinstance(description, str):
            raise InvalidArgumentError(f"{where}: description must be a string")
        noise, epsilon, (low, high), delta, share = _mechanism(data.get("mechanism", {}), where)
        domain = _domain(data.get("columns"), where, schema)
        maps_table = config_table(data.get("maps", {}), f"{where}: [maps]")
        check_config_keys(maps_table, MAP_KINDS, f"{where}: [maps]")
        if not maps_table:
            raise InvalidArgumentError(
                f"{where}: declare at least one map ([maps.rff], [maps.race], [maps.hist] or "
                "[maps.marginals])"
            )
        maps = []
        for kind in MAP_KINDS:
            if kind in maps_table:
                section = f"{where}: [maps.{kind}]"
                table = config_table(maps_table[kind], section)
                params = _map_parameters(kind, table, domain, section)
                maps.append((kind, params))
        return cls(
            name=name,
            domain=domain,
            maps=tuple(maps),
            noise=noise,
            epsilon=epsilon,
            epsilon_range=(low, high),
            delta=delta,
            numerator_share=share,
            description=description,
        )

    def as_dict(self) -> dict[str, Any]:
        """The declaration as plain JSON-able data (what a catalogue stores and compares)."""
        return {
            "name": self.name,
            "description": self.description,
            "columns": self.domain.describe(),
            "maps": {kind: params for kind, params in self.maps},
            "noise": self.noise,
            "epsilon": self.epsilon,
            "epsilon_range": list(self.epsilon_range),
            "delta": self.delta,
            "numerator_share": self.numerator_share,
        }

    def spec_names(self) -> list[str]:
        """``<name>/<kind>`` of every declared map, in :data:`MAP_KINDS` order."""
        return [f"{self.name}/{kind}" for kind, _ in self.maps]

    def draw(self, rng: np.random.Generator) -> tuple[SketchSpec, ...]:
        """Draw every declared map's random parameters; return one spec per map.

        Parameters
        ----------
        rng : numpy.random.Generator
            A CSPRNG-seeded generator (:func:`dpmarket.common.privacy.rng.production_rng`) in
            production. RFF draws ``omega = N(0, 1)^(m' x d) / (sigma w)`` (column ``k`` divided by
            ``sigma w_k``), then RACE ``projections = N(0, 1)^(R x d) / w`` and offsets uniform on
            ``[0, width)`` (module docstring, "Scales"); with ``scale = "absolute"`` ``w`` is 1 for
            every column. HIST and marginals draw nothing (a marginals spec is always Gaussian, at
            the map's ``delta`` or the declaration's).

        Returns
        -------
        tuple of SketchSpec
            In the declaration's map order.
        """
        d = self.domain.n_attributes
        width: NDArray[np.float64] = self.domain.width()
        specs = []
        for kind, params in self.maps:
            fmap: FeatureMap
            scale = width if params.get("scale", "width") == "width" else np.ones(d)
            if kind == "rff":
                base = draw_rff(d, params["frequencies"], 1.0, rng)
                fmap = RFFMap(base.omega / (params["sigma"] * scale), params["sigma"])
            elif kind == "race":
                drawn = draw_race(d, params["hashes"], params["buckets"], params["width"], rng)
                fmap = RACEMap(
                    drawn.projections / scale, drawn.offsets, drawn.bucket_width, drawn.n_buckets
                )
            elif kind == "hist":
                fmap = histogram_map(self.domain, params["bins"])
            else:
                fmap = marginals_map(
                    self.domain,
                    params["bins"],
                    rounds=params.get("rounds", AUTO),
                    measurements=params.get("measurements", AUTO),
                    max_cells=params.get("max_cells", DEFAULT_MAX_CELLS),
                    cuts=params.get("cuts"),
                    rows=params.get("rows", AUTO),
                )
            noise, delta = self.noise, self.delta
            if kind == "marginals":
                noise, delta = "gaussian", params.get("delta", self.delta or DEFAULT_DELTA)
            specs.append(
                SketchSpec(
                    name=f"{self.name}/{kind}",
                    feature_map=fmap,
                    domain=self.domain,
                    noise=noise,
                    epsilon=self.epsilon,
                    epsilon_range=self.epsilon_range,
                    delta=delta,
                    numerator_share=self.numerator_share,
                    description=self.description,
                )
            )
        return tuple(specs)


def columns_domain(columns: Sequence[Column], where: str = "columns") -> Domain:
    """The sketch domain of schema columns (:mod:`dpmarket.common.schema`): their bounds, with the
    levels of binary and categorical columns (integer and continuous columns are boxes; integer
    ones are marked as such, :attr:`Domain.integers`).

    Raises
    ------
    InvalidArgumentError
        If the domain refuses them (naming ``where``).
    """
    levels = tuple(np.array(c.levels) if c.levels else None for c in columns)
    try:
        return Domain(
            np.array([c.low for c in columns]),
            np.array([c.high for c in columns]),
            names=tuple(c.name for c in columns),
            levels=levels if any(lv is not None for lv in levels) else (),
            integers=tuple(c.type == "integer" for c in columns),
        )
    except ValueError as exc:
        raise InvalidArgumentError(f"{where}: {exc}") from None


def _domain(columns: Any, where: str, schema: Schema | None) -> Domain:
    if schema is None:
        return columns_domain(parse_columns(columns, where), where)
    if columns is None:
        return columns_domain(schema.columns, where)
    if not isinstance(columns, list) or not columns or not all(isinstance(c, str) for c in columns):
        raise InvalidArgumentError(
            f"{where}: with a schema, columns is a list of the schema's column names (default: "
            "every column)"
        )
    if len(set(columns)) != len(columns):
        raise InvalidArgumentError(f"{where}: column names repeat: {columns}")
    return columns_domain([schema.column(c) for c in columns], where)


def _map_parameters(
    kind: str, table: Mapping[str, Any], domain: Domain, where: str
) -> dict[str, Any]:
    n_columns = domain.n_attributes
    keys = _MAP_KEYS[kind]
    check_config_keys(table, (*keys, *_OPTIONAL_MAP_KEYS[kind]), where)
    missing = [f"{k} ({v})" for k, v in keys.items() if k not in table]
    if missing:
        raise InvalidArgumentError(f"{where}: missing {', '.join(missing)}")
    scale = table.get("scale", "width")
    if scale not in _SCALES:
        raise InvalidArgumentError(f"{where}: scale must be one of {_SCALES}, got {scale!r}")
    # Recorded only when it changes the map, so declarations written before the key existed
    # keep their parameters (and the catalogue keeps recognising them).
    absolute = {"scale": "absolute"} if scale == "absolute" else {}
    if kind == "rff":
        return {
            "frequencies": _integer(table["frequencies"], f"{where} frequencies"),
            "sigma": _positive(table["sigma"], f"{where} sigma"),
            **absolute,
        }
    if kind == "race":
        return {
            "hashes": _integer(table["hashes"], f"{where} hashes"),
            "buckets": _integer(table["buckets"], f"{where} buckets", minimum=2),
            "width": _positive(table["width"], f"{where} width"),
            **absolute,
        }
    if kind == "marginals":
        return _marginals_parameters(table, domain, where)
    bins = table["bins"]
    if isinstance(bins, list):
        if len(bins) != n_columns:
            raise InvalidArgumentError(
                f"{where}: bins must be one number or one per column ({n_columns}), got {len(bins)}"
            )
        return {"bins": [_integer(b, f"{where} bins") for b in bins]}
    return {"bins": _integer(bins, f"{where} bins")}


def _marginals_parameters(table: Mapping[str, Any], domain: Domain, where: str) -> dict[str, Any]:
    """``[maps.marginals]``: ``bins`` as HIST's, the optional selection settings, cut points
    and delta; the map is built here once to check them (cut points inside the bounds)."""
    n_columns = domain.n_attributes
    bins = table["bins"]
    if isinstance(bins, list):
        if len(bins) != n_columns:
            raise InvalidArgumentError(
                f"{where}: bins must be one number or one per column ({n_columns}), got {len(bins)}"
            )
        out: dict[str, Any] = {"bins": [_integer(b, f"{where} bins") for b in bins]}
    else:
        out = {"bins": _integer(bins, f"{where} bins")}
    for key in ("rounds", "measurements", "max_cells", "rows"):
        if key in table:
            out[key] = _integer(table[key], f"{where} {key}")
    if "delta" in table:
        delta = config_number(table["delta"], f"{where} delta")
        if not 0 < delta < 1:
            raise InvalidArgumentError(f"{where}: delta must lie in (0, 1), got {delta!r}")
        out["delta"] = delta
    if "cuts" in table:
        cuts = config_table(table["cuts"], f"{where} cuts")
        out["cuts"] = {
            str(name): [config_number(v, f"{where} cuts.{name}") for v in values]
            if isinstance(values, list)
            else config_number(values, f"{where} cuts.{name}")
            for name, values in cuts.items()
        }
    try:
        marginals_map(
            domain,
            out["bins"],
            rounds=out.get("rounds", AUTO),
            measurements=out.get("measurements", AUTO),
            max_cells=out.get("max_cells", DEFAULT_MAX_CELLS),
            cuts=out.get("cuts"),
            rows=out.get("rows", AUTO),
        )
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{where}: {exc}") from None
    return out


def _mechanism(table: Any, where: str) -> tuple[Noise, float, tuple[float, float], float, float]:
    """A declaration's ``[mechanism]`` (:meth:`SketchDeclaration.from_mapping`): its noise,
    default epsilon, epsilon range, delta and numerator share, each checked.

    Raises
    ------
    InvalidArgumentError
        Naming ``where`` and the key.
    """
    mech = config_table(table, f"{where}: [mechanism]")
    check_config_keys(
        mech,
        ("noise", "epsilon", "epsilon_range", "delta", "numerator_share"),
        f"{where}: [mechanism]",
    )
    noise = mech.get("noise", "laplace")
    if noise not in NOISES:
        raise InvalidArgumentError(
            f"{where}: mechanism.noise must be one of {NOISES}, got {noise!r}"
        )
    epsilon = _positive(mech.get("epsilon", 1.0), f"{where}: mechanism.epsilon")
    bounds = mech.get("epsilon_range", [epsilon, epsilon])
    if not isinstance(bounds, list) or len(bounds) != 2:
        raise InvalidArgumentError(
            f"{where}: mechanism.epsilon_range must be [low, high], got {bounds!r}"
        )
    low = _positive(bounds[0], f"{where}: mechanism.epsilon_range[0]")
    high = _positive(bounds[1], f"{where}: mechanism.epsilon_range[1]")
    _epsilon_range(epsilon, low, high, f"{where}: [mechanism]")
    delta = config_number(
        mech.get("delta", DEFAULT_DELTA if noise == "gaussian" else 0.0),
        f"{where}: mechanism.delta",
    )
    if noise == "gaussian" and not 0 < delta < 1:
        raise InvalidArgumentError(
            f"{where}: Gaussian noise needs 0 < mechanism.delta < 1, got {delta!r}"
        )
    if noise == "laplace" and delta != 0:
        raise InvalidArgumentError(
            f"{where}: Laplace noise is pure DP: mechanism.delta must be 0, got {delta!r}"
        )
    share = config_number(
        mech.get("numerator_share", DEFAULT_NUMERATOR_SHARE),
        f"{where}: mechanism.numerator_share",
    )
    if not 0 < share < 1:
        raise InvalidArgumentError(
            f"{where}: mechanism.numerator_share must lie in (0, 1), got {share!r}"
        )
    return noise, epsilon, (low, high), delta, share
