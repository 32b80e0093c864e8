"""The owner's ledger: charge before release, refuse without charging, never forget a charge."""

from __future__ import annotations

import math
import random
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from dpmarket.owner.ledger import (
    APPLICATION,
    DAY,
    LEDGER_FILE,
    MIGRATIONS,
    OwnerBudgetError,
    OwnerLedger,
    Remaining,
    Totals,
    ledger_path,
)
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.runtime.database import open_database

Opener = Callable[..., OwnerLedger]


@pytest.fixture
def open_ledger(tmp_path: Path) -> Iterator[Opener]:
    """Open ledgers in ``tmp_path / "owner"`` (by default) and close them all at teardown."""
    opened: list[OwnerLedger] = []

    def opener(policy: OwnerPolicy | None = None, **kwargs: Any) -> OwnerLedger:
        data_dir = kwargs.pop("data_dir", tmp_path / "owner")
        # The first open creates the ledger (as dpmarket owner ledger init does); later ones
        # open it.
        new = not ledger_path(data_dir).exists()
        ledger = (OwnerLedger.create if new else OwnerLedger)(
            data_dir, policy if policy is not None else OwnerPolicy(), **kwargs
        )
        opened.append(ledger)
        return ledger

    yield opener
    for ledger in opened:
        ledger.close()


def step(**overrides: Any) -> dict[str, Any]:
    """Arguments of one charge: 0.5 epsilon, no delta, 10 points in session s1."""
    args: dict[str, Any] = {
        "session": "s1",
        "consumer": "consumer-a",
        "curator": "curator",
        "mechanism": "bid (exponential)",
        "epsilon": 0.5,
        "delta": 0.0,
        "points": 10,
    }
    args.update(overrides)
    return args


def count_rows(path: Path) -> int:
    with closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM charges").fetchone()[0])


# ------------------------------------------------------------------------------ durability
def test_charges_persist_across_reopen(open_ledger: Opener, tmp_path: Path) -> None:
    first = open_ledger()
    a = first.charge(**step())
    b = first.charge(**step(session="s2", epsilon=1.25, delta=1e-7, points=3))
    first.close()

    again = open_ledger()
    assert again.entries() == [a, b]
    assert again.session_totals("s1") == Totals(0.5, 0.0, 10, non_private=False)
    assert again.remaining() == Remaining(
        epsilon=10.0 - 1.75, delta=1e-5 - 1e-7, points=20000 - 13, window="the lifetime"
    )
    assert ledger_path(tmp_path / "owner").is_file()


def test_entry_is_the_stored_row(open_ledger: Opener) -> None:
    ledger = open_ledger(clock=lambda: 1_700_000_000.25)
    entry = ledger.charge(**step(delta=5e-7))
    assert entry.at == 1_700_000_000.25
    assert (entry.session, entry.consumer, entry.curator, entry.mechanism) == (
        "s1",
        "consumer-a",
        "curator",
        "bid (exponential)",
    )
    assert (entry.epsilon, entry.delta, entry.points, entry.non_private) == (0.5, 5e-7, 10, False)
    assert ledger.entries(session="s1") == [entry]
    assert ledger.entries(session="other") == []


def test_a_crash_right_after_charge_keeps_the_charge(tmp_path: Path) -> None:
    # "Charge, then release": the process dies after charge() returned and before anything
    # else happened (no close, no cleanup); the charge must be on disk.
    script = textwrap.dedent(
        """
        import os, sys
        from dpmarket.owner.ledger import OwnerLedger
        from dpmarket.owner.policy import OwnerPolicy
        ledger = OwnerLedger.create(sys.argv[1], OwnerPolicy())
        entry = ledger.charge(session="crash", consumer="c", curator="curator",
                              mechanism="raw points", epsilon=0.75, delta=1e-7, points=4)
        print(entry.id, flush=True)
        os._exit(1)
        """
    )
    data_dir = tmp_path / "owner"
    done = subprocess.run(
        [sys.executable, "-c", script, str(data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    charged_id = int(done.stdout.strip())

    with OwnerLedger(data_dir, OwnerPolicy()) as ledger:
        (entry,) = ledger.entries()
        assert entry.id == charged_id
        assert (entry.session, entry.epsilon, entry.delta, entry.points) == ("crash", 0.75, 1e-7, 4)
        assert ledger.remaining().epsilon == 10.0 - 0.75


# ------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    ("policy", "first", "second", "expected"),
    [
        (
            OwnerPolicy(epsilon_per_session=1.0),
            step(epsilon=0.75),
            step(epsilon=0.5),
            "epsilon in session 's1': spent 0.75 of 1, this step asks 0.5, 0.25 left",
        ),
        (
            OwnerPolicy(delta_per_session=1e-6),
            step(delta=6e-7),
            step(delta=6e-7),
            "delta in session 's1': spent 6e-07 of 1e-06, this step asks 6e-07, 4e-07 left",
        ),
        (
            OwnerPolicy(points_per_session=15),
            step(points=10),
            step(points=6),
            "points in session 's1': spent 10 of 15, this step asks 6, 5 left",
        ),
        (
            OwnerPolicy(epsilon_total=10.0, epsilon_per_session=10.0),
            step(epsilon=9.5),
            step(session="s2", epsilon=1.0),
            "epsilon over the lifetime: spent 9.5 of 10, this step asks 1, 0.5 left",
        ),
        (
            OwnerPolicy(delta_total=1e-6, delta_per_session=1e-6),
            step(delta=1e-6),
            step(session="s2", delta=1e-9),
            "delta over the lifetime: spent 1e-06 of 1e-06, this step asks 1e-09, 0 left",
        ),
        (
            OwnerPolicy(points_total=1000, points_per_session=1000),
            step(points=999),
            step(session="s2", points=2),
            "points over the lifetime: spent 999 of 1000, this step asks 2, 1 left",
        ),
    ],
)
def test_limits_refuse_and_write_nothing(
    open_ledger: Opener,
    policy: OwnerPolicy,
    first: dict[str, Any],
    second: dict[str, Any],
    expected: str,
) -> None:
    ledger = open_ledger(policy)
    ledger.charge(**first)
    before = count_rows(ledger.path)
    with pytest.raises(OwnerBudgetError) as info:
        ledger.check(**second)
    assert expected in str(info.value)
    with pytest.raises(FailedPreconditionError) as refused:
        ledger.charge(**second)
    assert str(refused.value).startswith("owner budget exceeded: ")
    assert expected in str(refused.value)
    assert count_rows(ledger.path) == before == 1
    assert len(ledger.entries()) == 1


def test_a_refusal_names_every_limit_it_would_exceed(open_ledger: Opener) -> None:
    ledger = open_ledger(OwnerPolicy(epsilon_total=3.0, epsilon_per_session=2.0))
    ledger.charge(**step(session="a", epsilon=1.5))
    ledger.charge(**step(session="b", epsilon=1.0))
    with pytest.raises(OwnerBudgetError) as info:
        ledger.charge(**step(session="a", epsilon=1.0))
    message = str(info.value)
    assert "epsilon in session 'a': spent 1.5 of 2, this step asks 1, 0.5 left" in message
    assert "epsilon over the lifetime: spent 2.5 of 3, this step asks 1, 0.5 left" in message


def test_check_allows_without_writing(open_ledger: Opener) -> None:
    ledger = open_ledger()
    ledger.check(**step(epsilon=2.0))
    assert ledger.entries() == []


def test_a_quantity_not_asked_for_never_refuses(open_ledger: Opener) -> None:
    ledger = open_ledger(OwnerPolicy(epsilon_per_session=1.0))
    ledger.charge(**step(epsilon=1.0, points=0))
    ledger.charge(**step(epsilon=0.0, points=5))  # raw points only: the epsilon is full
    with pytest.raises(OwnerBudgetError, match="epsilon in session"):
        ledger.charge(**step(epsilon=1e-9, points=0))


def test_a_tightened_policy_applies_to_what_is_spent(open_ledger: Opener, tmp_path: Path) -> None:
    loose = open_ledger(OwnerPolicy(epsilon_total=10.0))
    loose.charge(**step(epsilon=2.0))
    loose.close()
    tight = open_ledger(OwnerPolicy(epsilon_total=1.5, epsilon_per_session=1.5))
    assert tight.remaining().epsilon == 0.0
    with pytest.raises(OwnerBudgetError, match=r"spent 2 of 1\.5, this step asks 0\.1, 0 left"):
        tight.charge(**step(session="s2", epsilon=0.1))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"epsilon": -0.1}, "epsilon must be finite and >= 0"),
        ({"epsilon": math.nan}, "epsilon must be finite and >= 0"),
        ({"epsilon": -math.inf}, "epsilon must be finite and >= 0"),
        ({"epsilon": "1"}, "epsilon must be a number"),
        ({"epsilon": True}, "epsilon must be a number"),
        ({"delta": 1.0}, r"delta must be in \[0, 1\)"),
        ({"delta": -1e-9}, r"delta must be in \[0, 1\)"),
        ({"delta": math.nan}, r"delta must be in \[0, 1\)"),
        ({"points": -1}, "points must be an integer >= 0"),
        ({"points": 1.0}, "points must be an integer >= 0"),
        ({"points": False}, "points must be an integer >= 0"),
        ({"session": ""}, "session must be a string of 1 to 256 characters"),
        ({"session": "x" * 257}, "session must be a string of 1 to 256 characters"),
        ({"consumer": None}, "consumer must be a string"),
        ({"curator": 3}, "curator must be a string"),
        ({"mechanism": ""}, "mechanism must be a string"),
    ],
)
def test_bad_arguments_are_invalid_and_write_nothing(
    open_ledger: Opener, overrides: dict[str, Any], message: str
) -> None:
    ledger = open_ledger()
    with pytest.raises(InvalidArgumentError, match=message):
        ledger.charge(**step(**overrides))
    with pytest.raises(ValueError, match=message):
        ledger.check(**step(**overrides))
    assert count_rows(ledger.path) == 0


# ------------------------------------------------------------------------------ exact sums
@pytest.mark.parametrize(
    ("epsilon", "n"), [(0.1, 10), (0.3, 10), (0.01, 100), (1 / 3, 6), (0.7, 3), (0.05, 20)]
)
def test_n_charges_of_epsilon_fill_a_budget_of_n_epsilon_exactly(
    open_ledger: Opener, epsilon: float, n: int
) -> None:
    budget = n * epsilon
    ledger = open_ledger(OwnerPolicy(epsilon_total=budget, epsilon_per_session=budget))
    for _ in range(n):
        ledger.charge(**step(epsilon=epsilon, points=1))
    listed = ledger.entries()
    assert len(listed) == n
    assert ledger.session_totals("s1").epsilon == math.fsum(e.epsilon for e in listed) == budget
    assert ledger.window_totals().epsilon == budget
    assert ledger.remaining().epsilon == 0.0
    with pytest.raises(OwnerBudgetError, match="epsilon"):
        ledger.charge(**step(epsilon=epsilon, points=1))
    assert len(ledger.entries()) == n


def test_sums_do_not_accumulate_rounding(open_ledger: Opener) -> None:
    # A thousand charges of 0.001: a running float sum drifts, the ledger's total does not.
    ledger = open_ledger(OwnerPolicy(epsilon_total=1.0, epsilon_per_session=1.0))
    for _ in range(1000):
        ledger.charge(**step(epsilon=0.001, points=0))
    drifting = 0.0
    for e in ledger.entries():
        drifting += e.epsilon
    assert drifting != 1.0
    assert ledger.window_totals().epsilon == math.fsum([0.001] * 1000) == 1.0
    assert ledger.remaining().epsilon == 0.0


def test_decimal_steps_fit_a_decimal_budget(open_ledger: Opener) -> None:
    # The doubles nearest 0.1 sum exactly to one ulp above the double nearest 0.3: without
    # the ledger's relative slack the third step would be refused with "0.2 left".
    assert math.fsum([0.1, 0.1, 0.1]) > 0.3
    ledger = open_ledger(OwnerPolicy(epsilon_total=0.3, epsilon_per_session=0.3))
    for _ in range(3):
        ledger.charge(**step(epsilon=0.1))
    assert ledger.remaining().epsilon == 0.0
    with pytest.raises(OwnerBudgetError, match=r"spent 0\.3 of 0\.3, this step asks 1e-06"):
        ledger.charge(**step(epsilon=1e-6))


# ------------------------------------------------------------------------------ window
def test_rolling_window_frees_budget_after_the_window(open_ledger: Opener) -> None:
    now = [1_000_000.0]
    day = 86400.0
    policy = OwnerPolicy(
        epsilon_total=2.0,
        epsilon_per_session=2.0,
        points_total=50,
        points_per_session=50,
        window_days=1,
    )
    ledger = open_ledger(policy, clock=lambda: now[0])
    ledger.charge(**step(session="a", epsilon=2.0, points=50))
    assert ledger.remaining() == Remaining(
        epsilon=0.0, delta=1e-5, points=0, window="the last 1 day"
    )

    now[0] += day - 1
    with pytest.raises(OwnerBudgetError, match="epsilon over the last 1 day: spent 2 of 2"):
        ledger.charge(**step(session="b", epsilon=1.0, points=0))

    now[0] += 2  # the first charge is now more than a day old
    assert ledger.remaining() == Remaining(
        epsilon=2.0, delta=1e-5, points=50, window="the last 1 day"
    )
    ledger.charge(**step(session="b", epsilon=1.0, points=10))
    # The session limit covers the whole session, not the window.
    with pytest.raises(OwnerBudgetError, match="epsilon in session 'a': spent 2 of 2"):
        ledger.charge(**step(session="a", epsilon=0.5, points=0))
    assert len(ledger.entries()) == 2
    assert ledger.window_totals() == Totals(epsilon=1.0, delta=0.0, points=10, non_private=False)


# ------------------------------------------------------------------------------ non-private
def test_non_private_is_refused_by_default(open_ledger: Opener) -> None:
    ledger = open_ledger()
    with pytest.raises(OwnerBudgetError, match="allow_non_private = false"):
        ledger.charge(**step(epsilon=math.inf, points=1))
    assert count_rows(ledger.path) == 0


def test_non_private_is_recorded_when_allowed(open_ledger: Opener) -> None:
    ledger = open_ledger(OwnerPolicy(allow_non_private=True, points_per_session=20))
    ledger.charge(**step(epsilon=0.5, points=5))
    entry = ledger.charge(**step(epsilon=math.inf, delta=0.0, points=10, mechanism="exact h1"))
    assert entry.non_private and entry.epsilon == math.inf

    (_, stored) = ledger.entries()
    assert stored == entry
    # Not composed into epsilon and delta; the points count.
    assert ledger.session_totals("s1") == Totals(
        epsilon=0.5, delta=0.0, points=15, non_private=True
    )
    assert ledger.remaining().epsilon == 9.5
    with pytest.raises(OwnerBudgetError, match="points in session 's1': spent 15 of 20"):
        ledger.charge(**step(epsilon=math.inf, points=6))


# ------------------------------------------------------------------------------ running totals
MIXED_STEPS = [
    step(session=f"s{i % 3}", epsilon=eps, delta=dlt, points=pts)
    for i, (eps, dlt, pts) in enumerate(
        [(0.1, 0.0, 1), (0.1, 1e-9, 0), (0.3, 0.0, 7), (0.1, 0.0, 2), (math.inf, 0.0, 4)] * 7
    )
]


def _summed(entries: list[Any]) -> Totals:
    """What the listed charges add up to, the way the ledger's docstring defines it."""
    private = [e for e in entries if not e.non_private]
    return Totals(
        epsilon=math.fsum(e.epsilon for e in private),
        delta=math.fsum(e.delta for e in private),
        points=sum(e.points for e in entries),
        non_private=any(e.non_private for e in entries),
    )


def test_lifetime_totals_equal_the_sum_of_the_charges(open_ledger: Opener) -> None:
    # A lifetime budget is decided from running totals, not a scan: they must be the exact sum.
    ledger = open_ledger(OwnerPolicy(allow_non_private=True, points_per_session=1000))
    assert ledger.window_totals() == Totals(0.0, 0.0, 0, False)
    for args in MIXED_STEPS:
        ledger.charge(**args)
    assert ledger.window_totals() == _summed(ledger.entries())
    assert ledger.window_totals().points == 98


def test_running_totals_are_built_for_a_ledger_written_before_them(tmp_path: Path) -> None:
    # A schema-2 ledger (before the running totals) with charges: opening it adds the totals,
    # and the budget decision sees every earlier charge.
    path = ledger_path(tmp_path / "owner")
    with closing(open_database(path, MIGRATIONS[:2], application=APPLICATION)) as conn:
        conn.execute(
            "INSERT INTO policies (applied_at, toml) VALUES (0, ?)",
            (OwnerPolicy(allow_non_private=True, points_per_session=1000).to_toml(),),
        )
        for i, args in enumerate(MIXED_STEPS):
            conn.execute(
                "INSERT INTO charges (at, session, consumer, curator, mechanism, epsilon, "
                "delta, points, non_private) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    19_700 * DAY + i * 3_600.0,
                    args["session"],
                    args["consumer"],
                    args["curator"],
                    args["mechanism"],
                    args["epsilon"],
                    args["delta"],
                    args["points"],
                    int(args["epsilon"] == math.inf),
                ),
            )
    OwnerLedger.upgrade(tmp_path / "owner")  # dpmarket owner ledger upgrade
    with OwnerLedger(tmp_path / "owner", None) as ledger:
        before = ledger.window_totals()
        assert before == _summed(ledger.entries())
        assert before.epsilon == pytest.approx(0.6 * 7)
    policy = OwnerPolicy(epsilon_total=before.epsilon + 0.25, allow_non_private=True)
    with OwnerLedger(tmp_path / "owner", policy) as ledger:
        with pytest.raises(OwnerBudgetError, match="epsilon over the lifetime"):
            ledger.charge(**step(session="new", epsilon=0.5, points=0))
        ledger.charge(**step(session="new", epsilon=0.25, points=0))
        assert ledger.window_totals() == _summed(ledger.entries())


def test_window_totals_equal_the_sum_of_the_charges_in_the_window(open_ledger: Opener) -> None:
    # A rolling window is decided from the totals of its whole UTC days plus the charges of the
    # part of a day at its start: at every end of the window, including one whose start falls
    # exactly on a midnight where a charge was made, the totals are the exact sum of the charges
    # stamped at or after the start.
    now = [0.0]
    ledger = open_ledger(
        OwnerPolicy(
            window_days=3.0,
            epsilon_total=1e6,
            delta_total=0.5,
            points_total=10**9,
            epsilon_per_session=1e6,
            delta_per_session=0.5,
            points_per_session=10**9,
            allow_non_private=True,
        ),
        clock=lambda: now[0],
    )
    rng = random.Random(7)
    midnight = 19_700 * DAY
    t = midnight - 2.5 * DAY
    # The clock only moves forward, and every end below is at or after the last charge (a
    # charge, and a window, are never stamped before the latest charge: test_ledger_failover).
    for i in range(300):
        t = midnight if i == 100 else t + rng.uniform(0.0, 0.01 * DAY if i > 100 else 0.02 * DAY)
        now[0] = t
        ledger.charge(
            **step(
                session=f"s{i % 5}",
                epsilon=math.inf if i % 17 == 0 else rng.choice([0.1, 0.25]),
                delta=rng.choice([0.0, 1e-9]),
                points=rng.randrange(4),
            )
        )
    assert any(e.at == midnight for e in ledger.entries()) and t <= midnight + 3 * DAY
    for end in (t, t + 0.3 * DAY, t + DAY, midnight + 3 * DAY, t + 2.99 * DAY, t + 40 * DAY):
        now[0] = end
        inside = [e for e in ledger.entries() if e.at >= end - 3 * DAY]
        assert ledger.window_totals() == _summed(inside), end
    assert ledger.window_totals() == Totals(0.0, 0.0, 0, False)


@pytest.mark.parametrize(
    "statement",
    ["DELETE FROM charges", "UPDATE charges SET epsilon = 0", "UPDATE charges SET at = 0"],
)
def test_charges_are_append_only(open_ledger: Opener, statement: str) -> None:
    ledger = open_ledger()
    ledger.charge(**step())
    with pytest.raises(sqlite3.IntegrityError, match="charges are append-only"):
        ledger.write(lambda conn: conn.execute(statement))
    assert ledger.window_totals() == Totals(0.5, 0.0, 10, False)
    assert count_rows(ledger.path) == 1


# ------------------------------------------------------------------------------ concurrency
def _hammer(charge: Callable[[], None], threads: int) -> tuple[int, int, int]:
    """Run ``charge`` from ``threads`` threads at once; count accepted, refused, busy."""
    counts = {"ok": 0, "refused": 0, "busy": 0}
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def worker() -> None:
        start.wait()
        for _ in range(40):
            try:
                charge()
                outcome = "ok"
            except OwnerBudgetError:
                outcome = "refused"
            except UnavailableError:
                outcome = "busy"
            except BaseException as exc:  # surfaced below
                errors.append(exc)
                return
            with lock:
                counts[outcome] += 1

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors
    return counts["ok"], counts["refused"], counts["busy"]


POLICY_FOR_HAMMER = OwnerPolicy(epsilon_total=5.0, epsilon_per_session=5.0, points_total=1000)


def test_concurrent_charges_on_one_ledger_never_exceed_the_budget(open_ledger: Opener) -> None:
    ledger = open_ledger(POLICY_FOR_HAMMER)
    names = iter(range(10**6))

    def charge() -> None:
        ledger.charge(**step(session=f"s{next(names) % 8}", epsilon=0.1, points=1))

    ok, refused, busy = _hammer(charge, threads=8)
    assert (ok, refused + busy) == (50, 320 - 50)
    listed = ledger.entries()
    assert len(listed) == 50
    assert math.fsum(e.epsilon for e in listed) == 5.0
    assert ledger.remaining().epsilon == 0.0


def test_concurrent_charges_through_separate_connections_never_exceed_the_budget(
    open_ledger: Opener,
) -> None:
    # One ledger object (one connection) per thread: only SQLite's BEGIN IMMEDIATE serialises
    # them, as it does for two processes on the same data directory.
    ledgers = [open_ledger(POLICY_FOR_HAMMER) for _ in range(8)]
    local = threading.local()
    handed = iter(ledgers)
    hand_lock = threading.Lock()

    def charge() -> None:
        if not hasattr(local, "ledger"):
            with hand_lock:
                local.ledger = next(handed)
        local.ledger.charge(**step(session="shared", epsilon=0.1, points=1))

    ok, _, _ = _hammer(charge, threads=8)
    assert ok == 50
    listed = ledgers[0].entries()
    assert len(listed) == 50
    assert math.fsum(e.epsilon for e in listed) == 5.0
    assert ledgers[0].session_totals("shared").points == 50


# ------------------------------------------------------------------------------ the file
def test_policy_is_recorded_only_when_it_changes(open_ledger: Opener, tmp_path: Path) -> None:
    open_ledger(OwnerPolicy()).close()
    open_ledger(OwnerPolicy()).close()
    changed = OwnerPolicy(epsilon_total=4.0, curators=("curator", "backup"))
    open_ledger(changed).close()
    path = ledger_path(tmp_path / "owner")
    with closing(sqlite3.connect(path)) as conn:
        texts = [r[0] for r in conn.execute("SELECT toml FROM policies ORDER BY rowid")]
    assert texts == [OwnerPolicy().to_toml(), changed.to_toml()]

    # Without a policy file, the ledger reads with the last recorded policy.
    with OwnerLedger(tmp_path / "owner", None) as reader:
        assert reader.policy == changed


def test_reading_without_policy_needs_an_existing_ledger(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no owner ledger"):
        OwnerLedger(tmp_path / "empty", None)
    assert not (tmp_path / "empty").exists()


def test_a_newer_schema_is_refused(open_ledger: Opener, tmp_path: Path) -> None:
    open_ledger().close()
    path = ledger_path(tmp_path / "owner")
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(
        RuntimeError,
        match=f"newer dpmarket: schema {len(MIGRATIONS) + 1}, this build knows {len(MIGRATIONS)}",
    ):
        OwnerLedger(tmp_path / "owner", OwnerPolicy())


def test_another_applications_database_is_refused(open_ledger: Opener, tmp_path: Path) -> None:
    open_ledger().close()
    path = ledger_path(tmp_path / "owner")
    with pytest.raises(ValueError, match="'dpmarket-owner', not 'dpmarket-curator'"):
        open_database(path, [], application="dpmarket-curator")

    curator_db = tmp_path / "curator" / LEDGER_FILE
    open_database(curator_db, ["CREATE TABLE sessions (id TEXT);"], application="x").close()
    with pytest.raises(ValueError, match=f"'x', not '{APPLICATION}'"):
        OwnerLedger(tmp_path / "curator", OwnerPolicy())


def test_list_limit(open_ledger: Opener) -> None:
    ledger = open_ledger()
    made = [ledger.charge(**step(epsilon=0.01, points=0)) for _ in range(5)]
    assert ledger.entries(limit=2) == made[-2:]
    assert ledger.entries(limit=10) == made
    with pytest.raises(ValueError, match="limit must be an integer >= 1, got 0"):
        ledger.entries(limit=0)
