"""An owner's sketch publications: charged once with the sketch stored in the same transaction,
refused (computing, storing and charging nothing) when the policy or the budget says no, values
outside the domain clamped (counted in the owner's log only), and everything durable across a
restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches.marginals import DEFAULT_BOOTSTRAP, MarginalsSketch
from dpmarket.common.sketches.marginals_fit import FIT_SEED, carried_fit
from dpmarket.common.sketches.sketch import PrivateSketch
from dpmarket.common.sketches.spec import SketchDeclaration, SketchSpec
from dpmarket.curator.sketches import SketchCatalog
from dpmarket.owner.ledger import OwnerBudgetError, OwnerLedger, ledger_path
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.sketches import (
    AnotherEpsilonError,
    SketchPublisher,
    data_digest,
    ledger_session,
    publish_to,
)
from dpmarket.runtime.tables import Table
from tests.conftest import marginals_mechanism, sketch_mechanism

CURATOR = "curator:curator"
DECLARATION = SketchDeclaration.from_mapping(
    {
        "name": "toy",
        "mechanism": {"epsilon": 1.0, "epsilon_range": [0.25, 2.0]},
        "columns": [
            {"name": "a", "low": 0, "high": 1},
            {"name": "b", "low": -10, "high": 10},
            {"name": "y", "low": 0, "high": 1, "levels": [0, 1]},
        ],
        "maps": {
            "rff": {"frequencies": 8, "sigma": 0.5},
            "race": {"hashes": 3, "buckets": 5, "width": 0.25},
            "hist": {"bins": 4},
        },
    }
)


class NoNoise:
    """A noise source that fails the test if a sketch is computed."""

    seeded = True

    def laplace(self, scale: float, size: int) -> NDArray[np.float64]:
        raise AssertionError("a sketch was computed")

    gaussian = laplace


@pytest.fixture(scope="module")
def specs() -> dict[str, SketchSpec]:
    return {s.kind: s for s in DECLARATION.draw(np.random.default_rng(0))}


def _table(n: int = 300, *, extra: bool = True) -> Table:
    rng = np.random.default_rng(1)
    cols = [rng.uniform(0, 1, n), rng.uniform(-10, 10, n), rng.integers(0, 2, n)]
    names: tuple[str, ...] = ("a", "b", "y")
    if extra:  # the table holds more than the spec's columns, in another order
        cols, names = [rng.normal(size=n), cols[2], cols[0], cols[1]], ("z", "y", "a", "b")
    return Table(names, np.column_stack(cols).astype(np.float64), "owner-0")


@pytest.fixture
def ledgers(tmp_path: Path) -> Iterator[Any]:
    opened: list[OwnerLedger] = []

    def open_ledger(policy: OwnerPolicy | None = None) -> OwnerLedger:
        data_dir = tmp_path / "owner"
        new = not ledger_path(data_dir).exists()  # the first open creates it
        ledger = (OwnerLedger.create if new else OwnerLedger)(data_dir, policy or OwnerPolicy())
        opened.append(ledger)
        return ledger

    yield open_ledger
    for ledger in opened:
        ledger.close()


def test_a_sketch_is_charged_once_and_stored_with_its_charge(
    ledgers: Any, specs: dict[str, SketchSpec]
) -> None:
    ledger = ledgers()
    publisher = SketchPublisher(ledger, noise=SeededNoise(np.random.default_rng(5)))
    table = _table()
    first = publisher.publish(specs["rff"], table, curator=CURATOR, epsilon=0.5)
    assert first.charged_now and isinstance(first.sketch, PrivateSketch)
    (entry,) = ledger.entries()
    assert entry == first.charge
    assert (entry.session, entry.consumer, entry.curator) == (
        ledger_session(specs["rff"]),
        "catalogue:toy/rff",
        CURATOR,
    )
    assert (entry.mechanism, entry.epsilon, entry.delta, entry.points) == (
        "private sketch (RFF, Laplace)",
        0.5,
        0.0,
        0,
    )
    # The sketch is of the spec's columns, selected by name: the same as the records in order.
    expected = sketch_mechanism(specs["rff"], 0.5).release(
        table.select(["a", "b", "y"]), SeededNoise(np.random.default_rng(5))
    )
    assert first.sketch.noisy_sum.tobytes() == expected.noisy_sum.tobytes()
    # Again, at the spec's default or at the stored epsilon: the stored sketch, nothing
    # charged, no noise drawn; naming another epsilon is refused (AnotherEpsilonError).
    publisher.noise = NoNoise()
    for epsilon in (None, 0.5):
        again = publisher.publish(specs["rff"], table, curator="curator:other", epsilon=epsilon)
        assert not again.charged_now and again.charge == entry
        assert isinstance(again.sketch, PrivateSketch)
        assert again.sketch.noisy_sum.tobytes() == first.sketch.noisy_sum.tobytes()
    with pytest.raises(AnotherEpsilonError, match=r"at epsilon 0\.5, ledger entry 1;"):
        publisher.publish(specs["rff"], table, curator="curator:other", epsilon=1.0)
    assert len(ledger.entries()) == 1


def test_the_published_count_is_the_in_process_release_of_every_table_row(
    ledgers: Any, specs: dict[str, SketchSpec]
) -> None:
    """The owner's publish path releases the same noisy count as the in-process mechanism on the
    table's every row (issue 28, stranger D3: a deployment's four RFF counts 47-314 below their
    owners' rows, read as rows dropped on the served path). The digest of the sketched records
    is that of the whole table, and, with the same noise, the count and the sum are bitwise the
    in-process release's, before and after the store; the count error is the noise draw itself.
    Deterministic (seeded noise): a guard, not a fix (main passes it too)."""
    ledger = ledgers()  # the default policy: epsilon 10 over the lifetime, 1 per sketch
    publisher = SketchPublisher(ledger, noise=SeededNoise(np.random.default_rng(7)))
    table = _table(n=257)
    records = table.select(["a", "b", "y"])
    noise = SeededNoise(np.random.default_rng(7))
    for kind in ("rff", "race", "hist"):  # the publisher's noise is drawn in the same order
        done = publisher.publish(specs[kind], table, curator=CURATOR, epsilon=1.0)
        expected = sketch_mechanism(specs[kind], 1.0).release(records, noise)
        assert done.data_digest == data_digest(records)
        for sketch in (done.sketch, publisher.stored(specs[kind]).sketch):  # type: ignore[union-attr]
            assert isinstance(sketch, PrivateSketch)
            assert sketch.noisy_count == expected.noisy_count
            assert sketch.noisy_sum.tobytes() == expected.noisy_sum.tobytes()


def test_refusals_compute_store_and_charge_nothing(
    ledgers: Any, specs: dict[str, SketchSpec]
) -> None:
    ledger = ledgers(OwnerPolicy(epsilon_total=1.5, epsilon_per_session=1.0))
    publisher = SketchPublisher(ledger, noise=SeededNoise(np.random.default_rng(0)))
    publisher.publish(specs["rff"], _table(), curator=CURATOR)  # epsilon 1 of 1.5
    publisher.noise = NoNoise()
    with pytest.raises(OwnerBudgetError, match=r"epsilon over the lifetime: spent 1 of 1\.5"):
        publisher.publish(specs["race"], _table(), curator=CURATOR)
    with pytest.raises(FailedPreconditionError, match=r"sketches\.epsilon = 1"):
        publisher.publish(specs["race"], _table(), curator=CURATOR, epsilon=1.2)
    with pytest.raises(InvalidArgumentError, match=r"outside the range spec toy/race accepts"):
        publisher.publish(specs["race"], _table(), curator=CURATOR, epsilon=0.1)
    for spec in (specs["race"], specs["hist"]):
        assert publisher.stored(spec) is None
    assert [e.session for e in ledger.entries()] == [ledger_session(specs["rff"])]


def test_an_owner_that_does_not_publish_refuses(ledgers: Any, specs: dict[str, SketchSpec]) -> None:
    publisher = SketchPublisher(ledgers(OwnerPolicy(publish_sketches=False)), noise=NoNoise())
    with pytest.raises(FailedPreconditionError, match=r"sketches\.publish = false"):
        publisher.publish(specs["hist"], _table(), curator=CURATOR)
    assert publisher.ledger.entries() == []


def test_values_outside_the_domain_are_clamped_and_counted_in_the_owners_log_only(
    ledgers: Any, specs: dict[str, SketchSpec], caplog: pytest.LogCaptureFixture
) -> None:
    """b = 10.5 in [-10, 10] and y = 0.7 of the levels {0, 1}: the sketch is that of the table
    with b = 10 and y = 1 (as OpenDP clamps), charged like any other; how many values moved is in
    the owner's log and nowhere in what it publishes. A missing column is refused by name."""
    table = _table(extra=False)
    values = table.values.copy()
    values[17, 1], values[3, 2] = 10.5, 0.7
    projected = values.copy()
    projected[17, 1], projected[3, 2] = 10.0, 1.0
    ledger = ledgers()
    publisher = SketchPublisher(ledger, noise=SeededNoise(np.random.default_rng(5)))
    with caplog.at_level("INFO", logger="dpmarket.owner.sketches"):
        done = publisher.publish(
            specs["hist"], Table(table.columns, values, "owner-0"), curator=CURATOR
        )
    expected = sketch_mechanism(specs["hist"], 1.0).release(
        projected, SeededNoise(np.random.default_rng(5))
    )
    assert isinstance(done.sketch, PrivateSketch)
    assert done.sketch.noisy_sum.tobytes() == expected.noisy_sum.tobytes()
    assert done.sketch.noisy_count == expected.noisy_count
    assert "'b' 1, 'y' 1 of 300 rows" in caplog.text
    assert [e.epsilon for e in ledger.entries()] == [1.0]
    missing = Table(("a", "y"), table.values[:, [0, 2]], "owner-0")
    with pytest.raises(InvalidArgumentError, match=r"no column\(s\) \['b'\]"):
        publisher.publish(specs["race"], missing, curator=CURATOR)
    assert len(ledger.entries()) == 1


def test_the_domain_step_logs_alike_whether_or_not_values_moved(
    ledgers: Any, specs: dict[str, SketchSpec], caplog: pytest.LogCaptureFixture
) -> None:
    """The projection's log line is written for every table, none moved or some (a step that
    logged only when some values moved, before the charge, took longer for those tables)."""
    publisher = SketchPublisher(ledgers(), noise=SeededNoise(np.random.default_rng(5)))
    with caplog.at_level("INFO", logger="dpmarket.owner.sketches"):
        publisher.publish(specs["hist"], _table(extra=False), curator=CURATOR)
    assert "values projected onto the spec's domain (this log only): 'a' 0" in caplog.text


def test_sketch_and_ledger_survive_a_restart(tmp_path: Path, specs: dict[str, SketchSpec]) -> None:
    with OwnerLedger.create(tmp_path / "owner", OwnerPolicy()) as ledger:
        first = SketchPublisher(ledger, noise=SeededNoise(np.random.default_rng(3))).publish(
            specs["race"], _table(), curator=CURATOR
        )
    with OwnerLedger(tmp_path / "owner", None) as ledger:  # a new process: the recorded policy
        publisher = SketchPublisher(ledger, noise=NoNoise())
        stored = publisher.stored(specs["race"])
        assert stored is not None and stored.charge == first.charge
        assert isinstance(stored.sketch, PrivateSketch) and isinstance(first.sketch, PrivateSketch)
        assert stored.sketch.noisy_sum.tobytes() == first.sketch.noisy_sum.tobytes()
        again = publisher.publish(specs["race"], _table(), curator=CURATOR)
        assert not again.charged_now and len(ledger.entries()) == 1


def test_publish_to_refuses_before_computing_what_the_catalogue_cannot_take(
    tmp_path: Path, specs: dict[str, SketchSpec]
) -> None:
    from dpmarket.curator.policy import CuratorPolicy

    with SketchCatalog(
        tmp_path / "curator", [DECLARATION], seed=0, policy=CuratorPolicy(sketches_per_owner=1)
    ) as catalog:
        with OwnerLedger.create(tmp_path / "a", OwnerPolicy()) as ledger:
            publisher = SketchPublisher(ledger, noise=SeededNoise(np.random.default_rng(0)))
            done = publish_to(catalog.endpoint("owner-0"), publisher, _table(), ["toy/rff"])
            assert [d.publication.charged_now for d in done] == [True]
            assert publisher.published()[0][3] == ("curator:local",)
            publisher.noise = NoNoise()
            with pytest.raises(FailedPreconditionError, match="accepts no more sketches"):
                publish_to(catalog.endpoint("owner-0"), publisher, _table(), ["toy/hist"])
            assert len(ledger.entries()) == 1
        # Another data directory of the same owner: the catalogue holds its sketch already.
        with OwnerLedger.create(tmp_path / "b", OwnerPolicy()) as ledger:
            publisher = SketchPublisher(ledger, noise=NoNoise())
            with pytest.raises(FailedPreconditionError, match="did not record"):
                publish_to(catalog.endpoint("owner-0"), publisher, _table(), ["toy/rff"])
            assert ledger.entries() == []


def test_publish_to_refuses_another_epsilon_than_a_stored_sketch_before_charging_any_spec(
    tmp_path: Path, specs: dict[str, SketchSpec]
) -> None:
    """``owner publish --spec toy/hist --spec toy/rff --epsilon 0.3`` where toy/rff's map was
    released at epsilon 1: refused (``ALREADY_EXISTS``) before toy/hist is computed or charged,
    the message naming the stored epsilon and its ledger entry; the ledger and the catalogue
    are unchanged. Control: without ``--epsilon`` both go (toy/rff sent again, free). The old
    code charged toy/hist 0.3 and handed back the epsilon-1 toy/rff sketch (a log line only)."""
    import grpc

    from dpmarket.runtime.status import status_for

    with SketchCatalog(tmp_path / "curator", [DECLARATION], seed=0) as catalog:
        endpoint = catalog.endpoint("owner-0")
        with OwnerLedger.create(tmp_path / "a", OwnerPolicy()) as ledger:
            publisher = SketchPublisher(ledger, noise=SeededNoise(np.random.default_rng(0)))
            publish_to(endpoint, publisher, _table(), ["toy/rff"])  # epsilon 1, the default
            before = ledger.entries()
            publisher.noise = NoNoise()
            with pytest.raises(AnotherEpsilonError) as refused:
                publish_to(endpoint, publisher, _table(), ["toy/hist", "toy/rff"], epsilon=0.3)
            assert status_for(refused.value) == grpc.StatusCode.ALREADY_EXISTS
            message = str(refused.value)
            assert message.startswith(
                "toy/rff: this owner released its sketch of this map at epsilon 1, ledger "
                f"entry {before[0].id}; a map is published once, so epsilon 0.3 is refused: "
                "nothing charged, nothing sent"
            ), message
            assert "without --epsilon (or with --epsilon 1)" in message
            assert ledger.entries() == before
            assert publisher.stored(specs["hist"]) is None
            assert not endpoint.spec("toy/hist").published
            publisher.noise = SeededNoise(np.random.default_rng(1))
            done = publish_to(endpoint, publisher, _table(), ["toy/hist", "toy/rff"])
            assert [d.publication.charged_now for d in done] == [True, False]
            assert [d.publication.sketch.mechanism.epsilon for d in done] == [1.0, 1.0]


MARGINALS = SketchDeclaration.from_mapping(
    {
        "name": "toym",
        "mechanism": {"epsilon": 1.0, "epsilon_range": [0.25, 2.0]},
        "columns": [
            {"name": "a", "low": 0, "high": 1},
            {"name": "b", "low": -10, "high": 10},
            {"name": "y", "low": 0, "high": 1, "levels": [0, 1]},
        ],
        "maps": {"marginals": {"bins": 4, "rounds": 1, "measurements": 2, "delta": 1e-6}},
    }
)


def test_a_marginals_sketch_is_published_like_any_sketch(tmp_path: Path) -> None:
    """Charged (epsilon, delta) once before release, stored with its charge, delivered to the
    catalogue (which validates and stores it), and free to publish again after a restart."""
    (spec,) = MARGINALS.draw(np.random.default_rng(0))
    with SketchCatalog(tmp_path / "curator", [MARGINALS], seed=0) as catalog:
        with OwnerLedger.create(tmp_path / "owner", OwnerPolicy()) as ledger:
            publisher = SketchPublisher(
                ledger, noise=SeededNoise(np.random.default_rng(2)), rng=np.random.default_rng(3)
            )
            (done,) = publish_to(
                catalog.endpoint("owner-0"), publisher, _table(), ["toym/marginals"]
            )
            assert done.publication.charged_now and not done.already_in_catalogue
            (entry,) = ledger.entries()
            assert (entry.mechanism, entry.epsilon, entry.delta, entry.points) == (
                "private sketch (MARGINALS, Gaussian)",
                1.0,
                1e-6,
                0,
            )
            sketch = done.publication.sketch
            assert len(sketch.measurements) == 3 + 2  # type: ignore[union-attr]
            listed = catalog.sketches("toym/marginals")[0].sketch
            assert listed.measurements[4].values.tobytes() == (  # type: ignore[union-attr]
                sketch.measurements[4].values.tobytes()  # type: ignore[union-attr]
            )
            # It carries its graphical model and bootstrap, fitted to it (the consumer's
            # defaults), through the catalogue, and a consumer builds them without fitting.
            assert isinstance(listed, MarginalsSketch)
            listed_fit = carried_fit(listed)
            assert listed_fit is not None
            assert (listed_fit.digest, listed_fit.bootstrap, listed_fit.seed) == (
                listed.digest,
                DEFAULT_BOOTSTRAP,
                FIT_SEED,
            )
            model, boot = listed_fit.models(listed)
            assert model.mbi_model is None and len(boot) == DEFAULT_BOOTSTRAP
        with OwnerLedger(tmp_path / "owner", None) as ledger:
            publisher = SketchPublisher(ledger, noise=NoNoise())
            (again,) = publish_to(
                catalog.endpoint("owner-0"), publisher, _table(), ["toym/marginals"]
            )
            assert not again.publication.charged_now and again.already_in_catalogue
            assert len(ledger.entries()) == 1
    assert marginals_mechanism(spec).rho == pytest.approx(0.0243559703595, rel=1e-9)


def test_the_publish_list_says_a_stored_map_under_another_epsilon_is_refused(
    tmp_path: Path, specs: dict[str, SketchSpec], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``owner publish --epsilon 0.3`` without --spec, where toy/rff's map was released at
    epsilon 1: the list reads the stored epsilon from the owner's ledger, says toy/rff is
    refused, and offers the other specs only (the allocation's spec being the refused one,
    nothing: no prompt). Without --epsilon it is sent again, free. Control: the old list said
    ``yes (sent again, free)`` and offered toy/rff, and the run it started was refused
    (AnotherEpsilonError, ``ALREADY_EXISTS``)."""
    import io

    from rich.console import Console

    from dpmarket.owner import cli as owner_cli

    prompts: list[str] = []

    def confirm(text: str, **kwargs: Any) -> bool:
        prompts.append(text)
        return True

    monkeypatch.setattr(owner_cli, "_interactive", lambda: True)
    monkeypatch.setattr(owner_cli.click, "confirm", confirm)

    def choose(*args: Any) -> tuple[list[str], str]:
        out = io.StringIO()
        monkeypatch.setattr(owner_cli, "console", Console(file=out, width=200))
        return owner_cli._choose_specs(*args), out.getvalue()

    with SketchCatalog(tmp_path / "curator", [DECLARATION], seed=0) as catalog:
        endpoint = catalog.endpoint("owner-0")
        catalogue = catalog.specs()
        with OwnerLedger.create(tmp_path / "a", OwnerPolicy()) as ledger:
            publisher = SketchPublisher(ledger, noise=SeededNoise(np.random.default_rng(0)))
            assert publisher.stored_epsilons(catalogue) == {}
            publish_to(endpoint, publisher, _table(), ["toy/rff"])  # epsilon 1, the default
            stored = publisher.stored_epsilons(catalogue)
            assert stored == {"toy/rff": 1.0}

            names, text = choose(endpoint, catalogue, None, 0.3, stored)
            rff = next(line for line in text.splitlines() if "toy/rff" in line)
            assert "yes at epsilon 1: --epsilon 0.3 refused" in rff, text
            assert "sent again" not in rff, text
            assert sorted(names) == ["toy/hist", "toy/race"]
            assert prompts[-1].startswith("Publish every spec but the refused (2 of 3), charging")
            assert "epsilon 0.6," in prompts[-1], prompts[-1]  # 0.3 for each of the two
            with pytest.raises(AnotherEpsilonError):  # what the old offer led to
                publish_to(endpoint, publisher, _table(), ["toy/rff"], epsilon=0.3)

            count = len(prompts)
            names, text = choose(endpoint, catalogue, "toy/rff", 0.3, stored)
            assert names == [] and len(prompts) == count, prompts
            assert "nothing to offer: this owner released toy/rff at another epsilon" in text

            names, text = choose(endpoint, catalogue, "toy/rff", None, stored)
            rff = next(line for line in text.splitlines() if "toy/rff" in line)
            assert "yes (sent again, free)" in rff, text
            assert names == ["toy/rff"] and "epsilon 0, delta 0?" in prompts[-1], prompts
