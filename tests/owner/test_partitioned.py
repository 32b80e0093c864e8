"""The partitioned owner on a real ``distributed.LocalCluster`` of worker processes against the
in-memory owner, on a 10^5-row table.

* sums (relevance counts, a sketch's feature sum, CAPE's mean, functional-mechanism coefficients
  and gradients) equal the in-memory ones to float tolerance;
* bids equal the in-memory bids (the same point, the same score);
* the selections that differ by design (GreeDi candidates, with stochastic greedy, and uniform
  samples) are the same on Dask and in this process for the same partitioning and seed, and
  GreeDi's MMD² stays within a stated factor of single-machine greedy's;
* the owner's ledger charges the same either way;
* closing a session stops its running step.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpmarket.common.cape.dpgd import init_params, n_params, site_gradient
from dpmarket.common.cape.functional_mechanism import fm_coefficients, pack_coefficients
from dpmarket.common.cape.spec import CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.feature_maps import draw_rff
from dpmarket.common.sketches.spec import SketchDeclaration, SketchSpec
from dpmarket.common.summarization.candidates import shrink_towards_moments, shrink_towards_points
from dpmarket.common.summarization.kernels import bid_direction, bid_scores, embedding_greedy, mmd2
from dpmarket.common.summarization.partitioned import merge_best
from dpmarket.common.summarization.rff import draw_rff_params, random_fourier_features
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.owner.cape import _fm_part, _gradient_part, _mean_part
from dpmarket.owner.dataset import open_dataset
from dpmarket.owner.engine import DaskEngine, SerialEngine, WorkCancelled, start_engine
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.partitioned import PartitionedData, PartitionedTable, mean_statistic
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner
from dpmarket.owner.sketches import SketchPublisher, _sketch_part
from dpmarket.owner.validation import read_all, validate_dataset
from dpmarket.runtime.tables import PointSet

pytestmark = pytest.mark.slow

N, F, D = 100_000, 10, 140
COLUMNS = tuple(f"x{j}" for j in range(F))
#: GreeDi with stochastic greedy against single-machine greedy: MMD² to the validation set at
#: most this many times greedy's on every scenario. Measured on the three scenarios below: 0.78,
#: 0.81 and 0.63 times greedy's with stochastic greedy in every partition, 1.07, 0.80 and 0.78
#: with exact local greedy (greedy maximises the h1 objective, not the exact-kernel MMD², so
#: GreeDi can do better on the latter).
GREEDI_FACTOR = 1.5
COUNTS = OwnerTerms(SessionMethod.CANDIDATES_COUNTS, 0.5, 0.0)
SKETCH = OwnerTerms(SessionMethod.CANDIDATES_SKETCH, 0.0, 0.0)
ROUNDS = OwnerTerms(SessionMethod.PRIVATE, 0.5, 1e-7, max_rounds=10)
UNIFORM = OwnerTerms(SessionMethod.UNIFORM, 0.0, 0.0)


@pytest.fixture(scope="module")
def engine() -> Iterator[DaskEngine]:
    started = start_engine(workers=2)
    yield started
    started.close()


def _table(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    centers = rng.normal(scale=3.0, size=(8, F))
    which = rng.integers(0, 8, n)
    x = centers[which] + rng.normal(size=(n, F))
    return np.clip(x, -20, 20), (which % 2).astype(np.int64)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    root = tmp_path_factory.mktemp("parts")
    x, y = _table(np.random.default_rng(0), N)
    for i in range(4):
        rows = slice(i * N // 4, (i + 1) * N // 4)
        columns = {c: x[rows, j] for j, c in enumerate(COLUMNS)}
        pq.write_table(
            pa.table({**columns, "label": y[rows]}), root / f"p{i}.parquet", row_group_size=12_500
        )
    return root, x, y


def _data(root: Path, engine: object, partition_rows: int = 25_000) -> PartitionedData:
    dataset = validate_dataset(open_dataset(str(root), partition_rows=partition_rows), engine)  # type: ignore[arg-type]
    return PartitionedData(dataset, engine, features=COLUMNS, label="label")  # type: ignore[arg-type]


def test_the_local_workers_run_with_the_engines_malloc_settings(engine) -> None:
    # Dask's own MALLOC_TRIM_THRESHOLD_ (64 KiB) makes every feature block a fresh mmap.
    import os

    from dpmarket.owner.engine import MALLOC_ENV

    seen = engine.client.run(lambda: {k: os.environ.get(k) for k in MALLOC_ENV})
    assert len(seen) == 2
    for env in seen.values():
        assert env == {k: str(v) for k, v in MALLOC_ENV.items()}


def test_the_dataset_has_the_partitioning_the_tests_rely_on(table, engine) -> None:
    root, x, _ = table
    data = _data(root, engine)
    assert len(data.partitions) == 4 and data.n_points == N
    assert engine.workers == 2
    whole = read_all(data.dataset, engine)
    assert np.array_equal(whole[:, :F], x)


def test_bids_and_counts_equal_the_in_memory_ones(table, engine) -> None:
    root, x, _ = table
    rng = np.random.default_rng(1)
    rff = draw_rff_params(F, D, 0.05, rng)
    data = _data(root, engine)
    features = random_fourier_features(x, rff)
    g = features[:500].astype(np.float64).mean(axis=0)
    sent = np.array([17, 40_000, 99_999], dtype=np.int64)
    for q in (0, 5):
        direction = bid_direction(g, features[1000:1010].astype(np.float64).mean(axis=0), q)
        scores = bid_scores(features, direction)  # the in-memory owner's scores
        scores[sent] = -np.inf
        best, row, _ = data.best(rff, direction, sent)  # type: ignore[misc]
        assert best.index == int(np.argmax(scores)) and best.score == float(scores.max())
        assert np.array_equal(row, x[best.index])
    counted = bid_scores(features, g)
    threshold = float(np.quantile(counted, 0.9))
    expected = int(np.count_nonzero(counted >= threshold)) - int(
        np.count_nonzero(counted[sent] >= threshold)
    )
    assert data.count_at_least(rff, g.astype(np.float32), threshold, sent) == expected
    assert merge_best([None, None]) is None


def test_sketch_and_cape_sums_equal_the_in_memory_ones(table, engine) -> None:
    root, x, y = table
    data = _data(root, engine)
    # A sketch's feature sum over the domain-projected records.
    domain = Domain(np.full(F, -20.0), np.full(F, 20.0), COLUMNS)
    rff_map = draw_rff(F, 200, 3.0, np.random.default_rng(2))

    class _Spec:  # what _sketch_part reads of a spec
        def __init__(self) -> None:
            self.domain = domain
            self.feature_map = rff_map

    spec = cast(SketchSpec, _Spec())  # the two attributes _sketch_part reads
    found = data.statistic(COLUMNS, functools.partial(_sketch_part, spec))
    total = sum(part[1] for part in found)
    assert sum(part[0] for part in found) == N
    np.testing.assert_allclose(total, rff_map.feature_sum(x), rtol=1e-9, atol=1e-6)
    # CAPE: the mean, capeFM's coefficients and a training's clipped-gradient average.
    bounds = [(c, -20.0, 20.0) for c in COLUMNS[:3]]
    mean_spec = CapeMeanSpec(tuple(bounds), epsilon=1.0, delta=1e-5)
    _, mean = mean_statistic(
        [
            (n, v)
            for n, v, _ in data.statistic(COLUMNS[:3], functools.partial(_mean_part, mean_spec))
        ]
    )
    np.testing.assert_allclose(mean, x[:, :3].mean(axis=0), rtol=1e-10, atol=1e-12)
    fm_spec = CapeJobSpec("logistic", tuple(bounds), ("label", 0.0, 1.0), epsilon=1.0, delta=1e-5)
    xs, ys = fm_spec.scaled(x[:, :3], y.astype(np.float64))
    expected = pack_coefficients(fm_coefficients(xs, ys, "logistic"), (1, 2))
    found_fm = data.statistic(
        (*COLUMNS[:3], "label"), functools.partial(_fm_part, fm_spec, "logistic", (1, 2))
    )
    _, coefficients = mean_statistic([(n, v) for n, v, _ in found_fm])
    np.testing.assert_allclose(coefficients, expected, rtol=1e-10, atol=1e-12)
    train = CapeTrainingSpec(
        tuple(bounds),
        "label",
        epsilon=1.0,
        delta=1e-5,
        iterations=3,
        learning_rate=0.1,
        hidden=4,
        clip=1.0,
    )
    theta = init_params(3, 4, np.random.default_rng(3))
    assert theta.shape == (n_params(3, 4),)
    xt, yt = train.scaled(x[:, :3], y.astype(np.float64))
    gradient = site_gradient(theta, xt, yt, clip=1.0, hidden=4)
    found_g = data.statistic(
        (*COLUMNS[:3], "label"), functools.partial(_gradient_part, train, theta)
    )
    _, merged = mean_statistic([(n, v) for n, v, _ in found_g])
    np.testing.assert_allclose(merged, gradient, rtol=1e-9, atol=1e-12)


def test_the_shrinkage_from_partition_moments_equals_the_in_memory_one(table, engine) -> None:
    """An owner's shrinkage of the noisy embedding (candidates method) from its h1 moments summed
    over partitions equals the in-memory shrinkage from every feature row."""
    root, x, _ = table
    rff = draw_rff_params(F, D, 0.05, np.random.default_rng(5))
    features = random_fourier_features(x, rff, dtype=np.float64)
    sigma = 0.004
    noisy = features[:300].mean(axis=0) + np.random.default_rng(6).normal(0, sigma, D)
    prior = features[-300:].mean(axis=0)
    expected, alpha, public = shrink_towards_points(noisy, features, sigma, prior=prior)
    assert 0.05 < alpha < 0.95  # a real shrinkage, neither none nor total
    mean, second = _data(root, engine).h1_moments(rff)
    shrunk, found, found_public = shrink_towards_moments(noisy, mean, second, sigma, prior=prior)
    assert found == pytest.approx(alpha, rel=1e-9) and found_public == public
    np.testing.assert_allclose(shrunk, expected, rtol=1e-9, atol=1e-12)
    # The same in the metric of the owner's scores (its second moment read without a prior).
    expected, alpha, _ = shrink_towards_points(noisy, features, sigma, score_metric=True)
    shrunk, found, _ = shrink_towards_moments(noisy, mean, second, sigma, score_metric=True)
    assert found == pytest.approx(alpha, rel=1e-9)
    np.testing.assert_allclose(shrunk, expected, rtol=1e-9, atol=1e-12)


def test_a_marginals_sketch_of_a_partitioned_table_is_refused_charging_nothing(
    table, engine, tmp_path: Path
) -> None:
    root, _, _ = table
    declaration = SketchDeclaration.from_mapping(
        {
            "name": "big",
            "mechanism": {"epsilon": 1.0},
            "columns": [{"name": c, "low": -20, "high": 20} for c in COLUMNS[:3]],
            "maps": {"marginals": {"bins": 4, "rounds": 1, "measurements": 2, "delta": 1e-6}},
        }
    )
    (spec,) = declaration.draw(np.random.default_rng(0))
    with OwnerLedger.create(tmp_path, OwnerPolicy()) as ledger:
        publisher = SketchPublisher(ledger)
        partitioned = PartitionedTable(_data(root, engine), "o")
        with pytest.raises(InvalidArgumentError, match="partitioned"):
            publisher.publish(spec, partitioned, curator="curator:c")
        assert ledger.entries() == []


def test_seeded_selections_are_the_same_on_dask_and_in_process(table, engine) -> None:
    root, x, _ = table
    rff = draw_rff_params(F, D, 0.05, np.random.default_rng(4))
    target = random_fourier_features(x[:300], rff, dtype=np.float64).mean(axis=0)
    sent = np.array([3, 60_000], dtype=np.int64)
    on_dask = _data(root, engine)
    here = _data(root, SerialEngine())
    # A small evaluation budget makes every partition run stochastic greedy.
    on_dask.max_evaluations = here.max_evaluations = 25_000 * 10
    a = on_dask.candidates(rff, target, 40, sent, seed=11)
    b = here.candidates(rff, target, 40, sent, seed=11)
    assert a[3] == b[3] == 4  # every partition ran stochastic greedy
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not set(a[0].tolist()) & set(sent.tolist())
    assert np.array_equal(a[1], x[a[0]])
    s1 = on_dask.sample(50, sent, np.random.default_rng(5))
    s2 = here.sample(50, sent, np.random.default_rng(5))
    assert np.array_equal(s1[0], s2[0]) and len(set(s1[0].tolist())) == 50
    assert not set(s1[0].tolist()) & set(sent.tolist())


def test_a_uniform_sample_across_partitions_is_uniform(table) -> None:
    """The per-partition counts follow the multivariate hypergeometric law: over 400 samples of
    100 points, the share drawn from each quarter of the table is 1/4 within 5 standard errors
    (failure probability below 1e-6)."""
    root, _, _ = table
    here = _data(root, SerialEngine())
    rng = np.random.default_rng(6)
    quarters = np.zeros(4)
    none = np.zeros(0, dtype=np.int64)
    for _ in range(400):
        index, _, _ = here.sample(100, none, rng)
        quarters += np.bincount(index // (N // 4), minlength=4)
    share = quarters / quarters.sum()
    stderr = np.sqrt(0.25 * 0.75 / quarters.sum())
    assert np.all(np.abs(share - 0.25) < 5 * stderr)


@pytest.mark.parametrize("scenario", [0, 1, 2])
def test_greedi_mmd_is_within_a_factor_of_greedy(tmp_path: Path, engine, scenario: int) -> None:
    """GreeDi (4 partitions, stochastic greedy in each) against single-machine greedy on the
    owner's whole table: MMD² (exact RBF kernel) to the validation set at most
    :data:`GREEDI_FACTOR` times greedy's."""
    rng = np.random.default_rng(100 + scenario)
    x, _ = _table(rng, 40_000)
    validation = x[rng.choice(np.flatnonzero(x[:, 0] > np.median(x[:, 0])), 300)]
    validation = validation + rng.normal(scale=0.3, size=validation.shape)
    root = tmp_path / "t"
    root.mkdir()
    pq.write_table(
        pa.table({c: x[:, j] for j, c in enumerate(COLUMNS)}),
        root / "p.parquet",
        row_group_size=10_000,
    )
    dataset = validate_dataset(open_dataset(str(root), partition_rows=10_000), engine)
    data = PartitionedData(dataset, engine, features=COLUMNS, max_evaluations=10_000 * 10)
    gamma = 0.02
    rff = draw_rff_params(F, D, gamma, rng)
    target = random_fourier_features(validation, rff, dtype=np.float64).mean(axis=0)
    k = 60
    _, rows, _, stochastic = data.candidates(rff, target, k, np.zeros(0, dtype=np.int64), seed=1)
    assert stochastic == 4
    greedy = embedding_greedy(random_fourier_features(x, rff), target, np.zeros((0, D)), k)
    ours, theirs = mmd2(rows, validation, gamma), mmd2(x[greedy], validation, gamma)
    assert ours <= GREEDI_FACTOR * theirs, (ours, theirs)


def _owner(data: object, tmp: Path) -> Owner:
    # ROUNDS bids and the candidates methods: this owner trusts its curator with exact bids
    # and steered selection (access.allow_exact_bids, access.allow_steered_selection).
    policy = OwnerPolicy(
        points_per_session=500,
        points_total=5000,
        allow_exact_bids=True,
        allow_steered_selection=True,
    )
    return Owner("o", data, ledger=OwnerLedger.create(tmp, policy))  # type: ignore[arg-type]


def test_the_ledger_charges_the_same_either_way(table, engine, tmp_path: Path) -> None:
    root, x, y = table
    rff = draw_rff_params(F, D, 0.05, np.random.default_rng(7))
    g = random_fourier_features(x[:200], rff, dtype=np.float64).mean(axis=0)
    entries = []
    for name, data in (("memory", PointSet(x, y, "o")), ("dask", _data(root, engine))):
        owner = _owner(data, tmp_path / name)
        owner.open_session("s", rff, 9, terms=COUNTS)
        owner.set_validation_embedding("s", g)
        owner.noisy_relevant_count("s", 0.1)
        points, labels = owner.propose_candidates("s", 30)
        assert points.shape == (30, F) and labels is not None
        owner.open_session("r", rff, 9, terms=ROUNDS)
        owner.set_validation_embedding("r", g)
        bid = owner.bid("r", 1, g, 0)
        assert bid is not None
        owner.release_point("r", 1)
        owner.open_session("u", rff, 9, terms=UNIFORM)
        owner.sample_uniform("u", 5)
        spent = [owner.close_session(sid) for sid in ("s", "r", "u")]
        assert owner.ledger is not None
        entries.append(
            [(e.mechanism, e.epsilon, e.delta, e.points) for e in owner.ledger.entries()]
        )
        assert [(s.epsilon, s.delta, s.points) for s in spent] == [
            (0.5, 0.0, 30),
            (0.5, 1e-7, 1),
            (0.0, 0.0, 5),
        ]
    assert entries[0] == entries[1]


def test_the_hedge_is_the_uniform_sample_of_the_same_seed(table, engine, tmp_path: Path) -> None:
    """ProposeCandidates' first uniform_count points are exactly SampleUniform's draw in a
    session of the same seed, whatever the session drew before (its count noise here), on
    both paths; the rest continue the greedy and never repeat them."""
    root, x, y = table
    rff = draw_rff_params(F, D, 0.05, np.random.default_rng(7))
    g = random_fourier_features(x[:200], rff, dtype=np.float64).mean(axis=0)
    for name, data in (("memory", PointSet(x, y, "o")), ("dask", _data(root, engine))):
        owner = _owner(data, tmp_path / name)
        owner.open_session("s", rff, 9, terms=COUNTS)
        owner.set_validation_embedding("s", g, shrinkage_sigma=0.01)
        owner.noisy_relevant_count("s", 0.1)
        points, _ = owner.propose_candidates("s", 30, uniform_count=10)
        owner.open_session("t", rff, 9, terms=UNIFORM)
        sample, _ = owner.sample_uniform("t", 10)
        np.testing.assert_array_equal(points[:10], sample)
        assert len({tuple(r) for r in points}) == 30, name


def test_closing_a_session_stops_its_running_step(table, engine, tmp_path: Path) -> None:
    root, x, _ = table
    data = _data(root, engine, partition_rows=12_500)
    owner = Owner("o", data)
    rff = draw_rff_params(F, D, 0.05, np.random.default_rng(8))
    owner.open_session("s", rff, 1, terms=SKETCH)
    owner.set_validation_embedding(
        "s", random_fourier_features(x[:50], rff, dtype=np.float64).mean(axis=0)
    )
    outcome: list[BaseException | object] = []

    def run() -> None:
        try:
            outcome.append(owner.propose_candidates("s", 200))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    while owner.progress("s")[0] != "candidates" and thread.is_alive():
        thread.join(0.01)
    owner.close_session("s")
    thread.join(60)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], WorkCancelled)
    assert owner.sessions == {}
