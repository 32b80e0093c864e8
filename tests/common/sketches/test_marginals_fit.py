"""Tests for dpmarket.common.sketches.marginals_fit: an owner's published fit answers as the
consumer's own fit, bit for bit; a fit that is not of the release, or not a calibrated junction
tree of its structure, is refused (each tampering with its control); the fit survives the wire,
and a sketch carrying another release's fit is refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.marginals import (
    MarginalsMechanism,
    MarginalsModel,
    MarginalsSketch,
    Measurement,
    marginals_map,
)
from dpmarket.common.sketches.marginals_fit import (
    MarginalsFit,
    carried_fit,
    fit_sketch,
    release_total,
)
from dpmarket.runtime.sketch_messages import sketch_bytes, sketch_from_bytes

BOOTSTRAP = 4


def _domain() -> Domain:
    return Domain(
        np.array([0.0, 1.0, 0.0, 0.0]),
        np.array([10.0, 5.0, 1.0, 2.0]),
        names=("x", "level", "flag", "tri"),
        levels=(None, np.array([1.0, 2.0, 5.0]), np.array([0.0, 1.0]), np.array([0.0, 1.0, 2.0])),
    )


def _records(n: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.uniform(0.0, 10.0, n)
    flag = ((x > 5.0) ^ (rng.random(n) < 0.1)).astype(float)
    level = rng.choice([1.0, 2.0, 5.0], n)
    tri = ((flag + rng.integers(0, 2, n)) % 3).astype(float)
    return np.column_stack([x, level, flag, tri])


@pytest.fixture(scope="module")
def released() -> tuple[MarginalsSketch, tuple[MarginalsModel, list[MarginalsModel]]]:
    """A release whose measured pairs form a chain, (0, 2) - (2, 3) - (3, 1): a junction tree
    of three nodes and two edges (the selection's own picks replaced by these, at its noise
    scale), and the consumer's fit of it (one compilation for the module)."""
    domain = _domain()
    fmap = marginals_map(domain, 4, rounds=1, measurements=3)
    rng = np.random.default_rng(0)
    records = _records(3000, rng)
    picked = MarginalsMechanism(fmap, domain, 1.0, 1e-6).release(records, SeededNoise(rng), rng=rng)
    d = fmap.n_attributes
    sigma = picked.measurements[d].sigma
    cells = fmap.cell_indices(records)
    chain = []
    for clique in [(0, 2), (2, 3), (1, 3)]:
        sizes = [int(fmap.cells[j]) for j in clique]
        flat = np.ravel_multi_index(tuple(cells[:, j] for j in clique), sizes)
        exact = np.bincount(flat, minlength=int(np.prod(sizes))).astype(float)
        chain.append(Measurement(clique, exact + rng.normal(0.0, sigma, exact.size), sigma))
    sketch = MarginalsSketch(
        picked.mechanism, (*picked.measurements[:d], *chain), picked.selections
    )
    return sketch, fit_sketch(fmap, sketch.measurements, bootstrap=BOOTSTRAP, seed=0)


QUERIES = [
    {0: np.array([0.0, 0.0, 1.0, 1.0]), 2: np.array([0.0, 1.0])},
    {1: np.array([1.0, 0.0, 1.0]), 3: np.array([0.0, 1.0, 1.0]), 0: np.array([1.0, 1, 0, 0])},
    {1: np.array([0.0, 1.0, 0.0]), 2: np.array([1.0, 0.0]), 3: np.array([1.0, 0.0, 0.0])},
]


def test_a_published_fit_answers_as_the_consumers_own_bit_for_bit(released) -> None:
    sketch, fitted = released
    fit = MarginalsFit.of(sketch, fitted, seed=0)
    model, boot = fit.models(sketch)
    assert model.mbi_model is None and len(boot) == BOOTSTRAP
    for q in QUERIES:
        assert model.query(q) == fitted[0].query(q)
        assert [b.query(q) for b in boot] == [b.query(q) for b in fitted[1]]
    assert np.array_equal(model.marginal((0, 1, 3)), fitted[0].marginal((0, 1, 3)))
    ours = model.sample(200, np.random.default_rng(3))
    theirs = fitted[0].sample(200, np.random.default_rng(3))
    assert np.array_equal(ours, theirs)
    assert fit.difference(fitted) == 0.0
    assert model.total == pytest.approx(release_total(sketch.measurements), rel=1e-12)


def _tampered(fit: MarginalsFit, change) -> MarginalsFit:
    """``fit`` with its model's beliefs passed through ``change(list) -> list``."""
    tree = fit.model
    beliefs = change([(c, a, np.array(t)) for c, a, t in tree.beliefs])
    return dataclasses.replace(fit, model=dataclasses.replace(tree, beliefs=tuple(beliefs)))


def _move_mass(beliefs):
    """Move half of the first table's largest cell to the cell one step further along every
    axis: its sum is kept, its margins on the columns it shares with its neighbours are not."""
    (c, a, t), rest = beliefs[0], beliefs[1:]
    moved = t.copy()
    i = np.unravel_index(int(np.argmax(moved)), moved.shape)
    j = tuple((k + 1) % n for k, n in zip(i, moved.shape, strict=True))
    shift = 0.5 * moved[i]
    moved[i] -= shift
    moved[j] += shift
    return [(c, a, moved), *rest]


def _negative(beliefs):
    (c, a, t), rest = beliefs[0], beliefs[1:]
    flat = t.reshape(-1).copy()
    flat[0], flat[1] = -1.0, flat[1] + flat[0] + 1.0
    return [(c, a, flat.reshape(t.shape)), *rest]


def test_a_fit_that_is_not_a_calibrated_tree_of_the_release_is_refused(released) -> None:
    sketch, fitted = released
    fit = MarginalsFit.of(sketch, fitted, seed=0)
    fit.models(sketch)  # the control: as published, it passes
    assert len(fit.model.beliefs) == 3 and len(fit.model.edges) == 2
    other = MarginalsMechanism(sketch.mechanism.feature_map, sketch.domain, 1.0, 1e-6).release(
        _records(3000, np.random.default_rng(9)), rng=np.random.default_rng(9)
    )
    with pytest.raises(ValueError, match="not of this one"):
        fit.models(other)
    with pytest.raises(ValueError, match="not of this one"):
        other.with_fit(fit)  # a sketch refuses a fit of another release at construction
    scaled = _tampered(fit, lambda bs: [(c, a, 1.1 * t) for c, a, t in bs])
    scaled = dataclasses.replace(
        scaled, model=dataclasses.replace(scaled.model, total=1.1 * fit.model.total)
    )
    with pytest.raises(ValueError, match="not the release's"):
        scaled.models(sketch)
    with pytest.raises(ValueError, match="not a calibrated model"):
        _tampered(fit, _move_mass).models(sketch)
    with pytest.raises(ValueError, match="negative"):
        _tampered(fit, _negative).models(sketch)
    with pytest.raises(ValueError, match="sums to"):
        _tampered(fit, lambda bs: [(bs[0][0], bs[0][1], 0.9 * bs[0][2]), *bs[1:]]).models(sketch)
    cut = dataclasses.replace(fit.model, edges=fit.model.edges[1:])
    with pytest.raises(ValueError, match="not connected: not a junction tree"):
        dataclasses.replace(fit, model=cut).models(sketch)
    merged = _tampered(fit, lambda bs: bs[:1])  # one node: the other measured pairs in none
    merged = dataclasses.replace(merged, model=dataclasses.replace(merged.model, edges=()))
    with pytest.raises(ValueError, match="in no node"):
        merged.models(sketch)
    with pytest.raises(ValueError, match="bootstrap refits but holds"):
        MarginalsFit(fit.digest, BOOTSTRAP + 1, 0, fit.model, fit.replicates)


def test_the_fit_travels_with_the_sketch_and_a_mismatched_one_is_refused(released) -> None:
    sketch, fitted = released
    fit = MarginalsFit.of(sketch, fitted, seed=0)
    carried = sketch.with_fit(fit)
    back = sketch_from_bytes(sketch_bytes(carried))
    assert isinstance(back, MarginalsSketch)
    back_fit = carried_fit(back)
    assert back_fit is not None
    assert back.digest == sketch.digest  # the fit is not part of the release's content
    model, _ = back_fit.models(back)
    assert all(model.query(q) == fitted[0].query(q) for q in QUERIES)
    plain = sketch_from_bytes(sketch_bytes(sketch))
    assert isinstance(plain, MarginalsSketch) and plain.fit is None
    other = MarginalsMechanism(sketch.mechanism.feature_map, sketch.domain, 1.0, 1e-6).release(
        _records(3000, np.random.default_rng(9)), rng=np.random.default_rng(9)
    )
    # A sender that attaches another release's fit: the receiver refuses the whole sketch.
    swapped = dataclasses.replace(fit, digest=other.digest)
    with pytest.raises(InvalidArgumentError, match="not of this one"):
        sketch_from_bytes(_bytes_with_fit(sketch, swapped))
    sketch_from_bytes(_bytes_with_fit(sketch, fit))  # the control: its own fit is accepted


def _bytes_with_fit(sketch: MarginalsSketch, fit: MarginalsFit) -> bytes:
    """``sketch``'s message carrying ``fit`` whatever it names (as a dishonest sender would
    write it: the dataclass refuses to hold it)."""
    from dpmarket.runtime.sketch_messages import fit_to_proto, sketch_to_proto

    message = sketch_to_proto(sketch)
    message.marginals.fit.CopyFrom(fit_to_proto(fit))
    return message.SerializeToString()
