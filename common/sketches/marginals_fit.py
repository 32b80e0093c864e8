"""A marginals sketch's graphical model and bootstrap, fitted once where the sketch is published.

A consumer answers from a marginals sketch through a graphical model fitted to its measurements
and :data:`~dpmarket.common.sketches.marginals.DEFAULT_BOOTSTRAP` bootstrap refits (their spread
is each answer's standard error: :meth:`~dpmarket.common.sketches.marginals.MarginalsModel.
bootstrap`). :func:`fit_sketch` is that procedure, the one home of it: the model fitted with
:data:`~dpmarket.common.sketches.marginals.FINAL_ITERS` mirror-descent iterations, then the
refits, warm-started from it, with noise drawn from a generator seeded by the consumer's seed
and the release's values.

**Why the owner fits it too.** Measured on the tutorial's three clinics (2 shared cores), a fit's
iterations are not what costs: 2,000 iterations run in 0.1 s and a bootstrap refit of 500 in
0.02-0.1 s once jax has compiled the model's structure, but compiling each owner's structure
(one per sketch: the selected marginals differ) took 6-12 s, and it is paid again in every
fresh process. Fewer iterations, or stopping on a convergence criterion, leave the compilation
whole; only not fitting at all makes a consumer's first answer fast. So the owner, which
publishes the sketch once, fits it once (:func:`publishable_fit`) and the fitted trees travel
with the sketch (:class:`MarginalsFit`, in the sketch's message), and every consumer reads them
with numpy alone (:meth:`MarginalsFit.models`: nothing imported from jax, compiled or fitted).

Notes
-----
*Privacy.* The fit is computed from the release alone (the noisy measurements and their public
noise scales), with randomness of its own that protects nothing: post-processing of a
differentially private release, which costs the owner nothing more (Dwork & Roth 2014,
Proposition 2.1; Bun & Steinke 2016, Lemma 1.8 for zCDP). It is computed before the owner
charges and stores the release, outside any use of its records.

*What a consumer checks, and what it trusts.* A fit is used only for the release whose content
digest it names (:attr:`MarginalsSketch.digest`, recomputed by the receiver), with the bootstrap
size and seed the consumer would use itself; every tree is checked to be a calibrated junction
tree covering the release's measured cliques, with no negative count
(:meth:`~dpmarket.common.sketches.marginals.MarginalsModel.from_beliefs`), and the model's total
is the release's minimum-variance total, recomputed. These establish that the trees are a
genuine model of the release's structure, not that they are the optimum of the fit: a dishonest
owner (or curator) could move a point estimate, or shrink a bootstrap standard error. No
interval depends on it, nor does a value whose columns were measured together or its standard
error (the consumer computes them from the measurements:
:func:`dpmarket.common.sketches.marginals_bounds.fraction_bounds`,
:func:`~dpmarket.common.sketches.marginals_bounds.fraction_estimate`,
:func:`~dpmarket.common.sketches.marginals_bounds.covariance_bounds`); the model's guess over
columns never measured together does, and is moved inside its bounds. A consumer that does not
take the publisher's word refits (``dpmarket consumer explore --refit``; the console refits
every published fit in its background warm-up and answers from its own fit once done), and
the same procedure on the same platform gives the same model bit for bit (tested).

References
----------
McKenna, Sheldon & Miklau, "Graphical-model based estimation and inference for differential
privacy", ICML 2019 (Private-PGM); Lauritzen & Spiegelhalter 1988 (calibrated junction trees).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.sketches.marginals import (
    DEFAULT_BOOTSTRAP,
    FINAL_ITERS,
    MarginalsMap,
    MarginalsModel,
    MarginalsSketch,
    Measurement,
    free_compiled,
)

__all__ = [
    "FIT_SEED",
    "FIT_TOLERANCE",
    "MAX_FIT_BYTES",
    "FittedTree",
    "MarginalsFit",
    "fit_sketch",
    "publishable_fit",
    "release_total",
]

#: The seed of a published fit's bootstrap: the consumer's default (``explore --seed 0``), so
#: that a consumer with default options answers from the published fit.
FIT_SEED = 0
#: The largest fit (:attr:`MarginalsFit.wire_bytes`: its float64 tables, the model's and every
#: replicate's, and a bound on their framing) an owner attaches to a sketch and a receiver
#: accepts; a larger one is not published (consumers fit).
MAX_FIT_BYTES = 16 << 20
#: The largest difference (:meth:`MarginalsFit.difference`, a fraction of the total) between a
#: published fit and the receiver's refit that counts as the same fit (the same procedure on
#: another platform's floating point).
FIT_TOLERANCE = 1e-6
# Relative tolerance of the sums and totals a receiver checks.
_RTOL = 1e-6


def fit_sketch(
    feature_map: MarginalsMap,
    measurements: Sequence[Measurement],
    *,
    bootstrap: int = DEFAULT_BOOTSTRAP,
    seed: int = FIT_SEED,
) -> tuple[MarginalsModel, list[MarginalsModel]]:
    """Fit a release's graphical model and its bootstrap refits (what every answer reads).

    Parameters
    ----------
    feature_map : MarginalsMap
    measurements : sequence of Measurement
        The release's.
    bootstrap : int
        Bootstrap refits (0: none).
    seed : int
        The consumer's seed; the bootstrap's generator is seeded by it and the release's values
        (an owner's errors do not depend on which other sketches were fitted first).

    Returns
    -------
    (MarginalsModel, list of MarginalsModel)
        The model (:data:`~dpmarket.common.sketches.marginals.FINAL_ITERS` iterations) and
        ``bootstrap`` refits (:meth:`~dpmarket.common.sketches.marginals.MarginalsModel.
        bootstrap`, warm-started from it).

    Notes
    -----
    Drops jax's compiled executables when done
    (:func:`~dpmarket.common.sketches.marginals.free_compiled`): a caller that fits in several
    threads runs one fit at a time.
    """
    model = MarginalsModel.fit(feature_map, measurements, iters=FINAL_ITERS)
    digest = hashlib.sha256(b"".join(m.values.tobytes() for m in measurements))
    rng = np.random.default_rng([int(seed), 2, int.from_bytes(digest.digest()[:8])])
    boot = model.bootstrap(bootstrap, rng) if bootstrap > 0 else []
    free_compiled()  # answers are numpy from here on
    return model, boot


def release_total(measurements: Sequence[Measurement]) -> float:
    """The minimum-variance unbiased record count of a release, at least 1: the sums of every
    measurement weighted by ``1 / (sigma^2 * cells)`` (``mbi``'s estimate of a model's total).
    """
    totals = np.array([float(m.values.sum()) for m in measurements])
    weights = np.array([1.0 / (m.sigma**2 * m.values.size) for m in measurements])
    return max(1.0, float(np.average(totals, weights=weights)))


@dataclass(frozen=True, eq=False)
class FittedTree:
    """A fitted model as its calibrated junction tree (what answers read).

    Attributes
    ----------
    total : float
        The model's record count.
    beliefs : tuple of (tuple of int, tuple of int, ndarray)
        Per tree node: its columns, its table's axes (the same columns, in the table's order),
        and the table, float64 of shape ``cells[axes]``: the model's counts on the node's cells.
    edges : tuple of (int, int)
        The tree's edges, as indices into ``beliefs``.
    """

    total: float
    beliefs: tuple[tuple[tuple[int, ...], tuple[int, ...], NDArray[np.float64]], ...]
    edges: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, model: MarginalsModel) -> FittedTree:
        """``model``'s tree."""
        return cls(model.total, tuple(model.beliefs()), tuple(model.tree_edges()))

    @property
    def nbytes(self) -> int:
        """Bytes of the tables."""
        return int(sum(table.nbytes for _, _, table in self.beliefs))

    @property
    def wire_bytes(self) -> int:
        """An upper bound on the bytes of the tree's message: its tables, 10 bytes per column
        index and shape entry (a varint), 32 per table's and 20 per edge's framing, 64 more."""
        framing = sum(10 * (len(columns) + 2 * len(axes)) + 32 for columns, axes, _ in self.beliefs)
        return self.nbytes + framing + 20 * len(self.edges) + 64

    def model(
        self, feature_map: MarginalsMap, measurements: Sequence[Measurement]
    ) -> MarginalsModel:
        """The model these tables define, checked
        (:meth:`~dpmarket.common.sketches.marginals.MarginalsModel.from_beliefs`).

        Raises
        ------
        ValueError
            If the tree is not a calibrated junction tree of the release's structure.
        """
        return MarginalsModel.from_beliefs(
            feature_map, measurements, self.total, self.beliefs, self.edges, rtol=_RTOL
        )


@dataclass(frozen=True, eq=False)
class MarginalsFit:
    """An owner's fit of its marginals sketch: the model and its bootstrap refits, as trees.

    Attributes
    ----------
    digest : str
        The content digest of the release fitted (:attr:`MarginalsSketch.digest`).
    bootstrap : int
        Bootstrap refits, >= 0 (``len(replicates)``).
    seed : int
        The seed of :func:`fit_sketch`, >= 0.
    model : FittedTree
    replicates : tuple of FittedTree

    Raises
    ------
    ValueError
        If ``bootstrap`` is not ``len(replicates)``, ``seed`` is negative, or the message would
        exceed :data:`MAX_FIT_BYTES` (:attr:`wire_bytes`).
    """

    digest: str
    bootstrap: int
    seed: int
    model: FittedTree
    replicates: tuple[FittedTree, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicates", tuple(self.replicates))
        if int(self.bootstrap) != len(self.replicates):
            raise ValueError(
                f"a fit states {self.bootstrap} bootstrap refits but holds {len(self.replicates)}"
            )
        if int(self.seed) < 0:
            raise ValueError(f"a fit's seed must be >= 0, got {self.seed}")
        if self.wire_bytes > MAX_FIT_BYTES:
            raise ValueError(
                f"a fit of {self.wire_bytes} bytes exceeds the {MAX_FIT_BYTES} a sketch may carry"
            )

    @classmethod
    def of(
        cls,
        sketch: MarginalsSketch,
        fitted: tuple[MarginalsModel, Sequence[MarginalsModel]],
        *,
        seed: int,
    ) -> MarginalsFit:
        """The fit :func:`fit_sketch` returned for ``sketch`` with ``seed``, as trees."""
        model, boot = fitted
        trees = tuple(FittedTree.of(m) for m in boot)
        return cls(sketch.digest, len(boot), int(seed), FittedTree.of(model), trees)

    @property
    def nbytes(self) -> int:
        """Bytes of every tree's tables."""
        return self.model.nbytes + sum(r.nbytes for r in self.replicates)

    @property
    def wire_bytes(self) -> int:
        """An upper bound on the bytes of the fit's message (:attr:`FittedTree.wire_bytes` of
        every tree, and 200 for the digest and counts)."""
        return self.model.wire_bytes + sum(r.wire_bytes for r in self.replicates) + 200

    def check_release(self, sketch: MarginalsSketch) -> None:
        """Check that this fit names ``sketch``'s content (cheap: one digest).

        Raises
        ------
        ValueError
            If the digests differ.
        """
        if self.digest != sketch.digest:
            raise ValueError(
                f"the fit is of the release with digest {self.digest[:16]}…, not of this one "
                f"({sketch.digest[:16]}…)"
            )

    def difference(self, fitted: tuple[MarginalsModel, Sequence[MarginalsModel]]) -> float:
        """How far this fit is from ``fitted`` (a refit, :func:`fit_sketch`): the largest
        absolute difference of any cell of any tree's tables, as a fraction of that tree's
        total; ``inf`` when the trees' nodes or the bootstrap sizes differ. 0 when ``fitted``
        is the same procedure's result on the same platform (bit for bit)."""
        model, boot = fitted
        if len(boot) != len(self.replicates):
            return math.inf
        gap = 0.0
        for tree, other in zip((self.model, *self.replicates), (model, *boot), strict=True):
            theirs = {(c, a): t for c, a, t in other.beliefs()}
            for columns, axes, table in tree.beliefs:
                found = theirs.get((columns, axes))
                if found is None or found.shape != table.shape:
                    return math.inf
                gap = max(gap, float(np.abs(found - table).max(initial=0.0)) / tree.total)
        return gap

    def models(self, sketch: MarginalsSketch) -> tuple[MarginalsModel, list[MarginalsModel]]:
        """The model and bootstrap models, built from the trees and checked against
        ``sketch`` (module docstring: what is checked and what is trusted).

        Raises
        ------
        ValueError
            If the fit is not ``sketch``'s (digest), the model's total is not the release's
            (:func:`release_total`), or a tree is not a calibrated junction tree of the
            release's structure.
        """
        self.check_release(sketch)
        expected = release_total(sketch.measurements)
        if not math.isclose(self.model.total, expected, rel_tol=_RTOL):
            raise ValueError(
                f"the fitted model's total {self.model.total:.9g} is not the release's "
                f"{expected:.9g}"
            )
        fmap, measurements = sketch.feature_map, sketch.measurements
        return (
            self.model.model(fmap, measurements),
            [r.model(fmap, measurements) for r in self.replicates],
        )


def publishable_fit(
    sketch: MarginalsSketch, *, bootstrap: int = DEFAULT_BOOTSTRAP, seed: int = FIT_SEED
) -> MarginalsFit | None:
    """The fit an owner publishes with ``sketch`` (:func:`fit_sketch` with the consumer's
    defaults), or None when its tables would exceed :data:`MAX_FIT_BYTES` (consumers fit it).

    Post-processing of the release: no privacy cost (module docstring).
    """
    fitted = fit_sketch(sketch.feature_map, sketch.measurements, bootstrap=bootstrap, seed=seed)
    size = sum(FittedTree.of(m).wire_bytes for m in (fitted[0], *fitted[1])) + 200
    if size > MAX_FIT_BYTES:
        return None
    return MarginalsFit.of(sketch, fitted, seed=seed)


def carried_fit(sketch: MarginalsSketch) -> MarginalsFit | None:
    """The fit ``sketch`` carries, as a :class:`MarginalsFit` (``MarginalsSketch.fit`` is typed by
    the one method the sketch itself calls, :class:`~dpmarket.common.sketches.marginals.CarriedFit`,
    because this module builds on that one).

    Raises
    ------
    TypeError
        If the sketch carries a fit of another type.
    """
    fit = sketch.fit
    if fit is not None and not isinstance(fit, MarginalsFit):
        raise TypeError(f"a marginals sketch carries a {type(fit).__name__}, not a MarginalsFit")
    return fit
