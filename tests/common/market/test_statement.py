"""Settlement statements: canonical bytes, signatures that fail on any change, and the owner's
check that refuses any mismatch with its own record."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from dpmarket.common.market.attribution import SummaryBlocks
from dpmarket.common.market.money import epsilon_units
from dpmarket.common.market.payouts import ProportionalSplit, ValueReward, release_payouts
from dpmarket.common.market.pricing import OwnerLimits, OwnerPrices, quote
from dpmarket.common.market.statement import (
    OwnerRecord,
    SessionRecord,
    SettlementTerms,
    Statement,
    StatementError,
    StatementMismatchError,
    check_statement,
    decode_owner_statement,
    decode_statement,
    settle,
    sign_statement,
    verify_statement,
)
from dpmarket.common.privacy.noise import SeededNoise

PRICES = {
    "clinic-a": OwnerPrices(10_000, 500_000, 2_000_000, 1_000_000),
    "clinic-b": OwnerPrices(20_000, 100_000, 0, 0),
    "clinic-c": OwnerPrices(0, 0, 0, 5_000_000),
}
SESSION_EPS = 0.30000000000000004  # a ledger's float, rounded up once into micro-epsilon


def _session(rule=None):
    """A settled session: three owners, clinic-c delivered nothing."""
    rng = np.random.default_rng(0)
    points = rng.normal(size=(12, 2))
    ids = ["clinic-a"] * 7 + ["clinic-b"] * 5
    blocks = SummaryBlocks.from_summary(
        points, ids, rng.normal(size=(40, 2)), 0.5, owners=tuple(PRICES)
    )
    rule = rule or ValueReward(8_000_000)
    release = release_payouts(blocks, 1.0, rule, SeededNoise(rng))
    limits = {o: OwnerLimits(40, SESSION_EPS, 1.0) for o in PRICES}
    q = quote(PRICES, limits, 12, rule)
    records = {
        "clinic-a": SessionRecord(30, 7, SESSION_EPS, release.owner_epsilon("clinic-a")),
        "clinic-b": SessionRecord(25, 5, SESSION_EPS, release.owner_epsilon("clinic-b")),
        # It read points, so it charged epsilon_O before its first left, delivered or not.
        "clinic-c": SessionRecord(6, 0, SESSION_EPS, release.epsilon_owner),
    }
    statement = settle("session-7", "consumer:bob", q, PRICES, records, release)
    return statement, records, release, q


def _own_record(records, owner: str) -> OwnerRecord:
    r = records[owner]
    return OwnerRecord(
        "session-7", "consumer:bob", r.points_read, r.epsilon_session, r.epsilon_payout
    )


def _terms(rule: str = "value", reward: int = 8_000_000) -> SettlementTerms:
    return SettlementTerms(12, 40, 1.0, rule, reward)


def test_settle_prices_every_owner_and_pays_the_release() -> None:
    statement, _, release, q = _session()
    a = statement.for_owner("clinic-a").line
    assert a.read_charge == 30 * 10_000 and a.delivered_charge == 7 * 500_000
    assert a.epsilon_session == epsilon_units(SESSION_EPS) == 300_001
    assert a.reward == release.payouts[0] and a.value == release.value_units()[0]
    c = statement.for_owner("clinic-c").line
    assert c.value == 0 and c.reward == 0 and c.minimum_topup == 5_000_000
    assert statement.total <= q.total == statement.header.max_cost
    assert statement.header.reward_rule == "value"


def test_the_encoding_is_canonical() -> None:
    statement, *_ = _session()
    shuffled = Statement(statement.header, tuple(reversed(statement.lines)))
    assert shuffled.encode() == statement.encode()
    assert decode_statement(statement.encode()) == statement
    view = statement.for_owner("clinic-b")
    assert decode_owner_statement(view.encode()) == view
    # Same content, other bytes: refused.
    tag, body = statement.encode().split(b"\n", 1)
    spaced = tag + b"\n" + json.dumps(json.loads(body), indent=1).encode()
    with pytest.raises(StatementError, match="canonical"):
        decode_statement(spaced)
    with pytest.raises(StatementError, match="do not start"):
        decode_statement(view.encode())  # an owner's view is not a statement


def _mutations(obj, step: int = 1):
    """Every field of a header or line changed: strings suffixed, ints moved by ``step``."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, str):
            new = "none" if f.name == "reward_rule" and value != "none" else value + "x"
        else:
            new = value + step
        try:
            yield f.name, dataclasses.replace(obj, **{f.name: new})
        except StatementError:
            yield f.name, dataclasses.replace(obj, **{f.name: value - 1})


@pytest.mark.parametrize("kind", ["ecdsa-p256", "ed25519"])
def test_any_changed_field_fails_the_signature(kind: str) -> None:
    statement, *_ = _session()
    key = (
        ec.generate_private_key(ec.SECP256R1())
        if kind == "ecdsa-p256"
        else (ed25519.Ed25519PrivateKey.generate())
    )
    signature = sign_statement(statement, key)
    verify_statement(statement, signature, key.public_key())
    view = statement.for_owner("clinic-a")
    view_signature = sign_statement(view, key)
    verify_statement(view, view_signature, key.public_key())
    changed = 0
    for _name, header in _mutations(statement.header):
        with pytest.raises(StatementError, match="valid signature"):
            verify_statement(Statement(header, statement.lines), signature, key.public_key())
        changed += 1
    for name, line in _mutations(view.line):
        lines = tuple(line if x.owner == "clinic-a" else x for x in statement.lines)
        if name == "owner":
            continue  # a renamed line is another owner's: covered below
        with pytest.raises(StatementError):
            verify_statement(Statement(statement.header, lines), signature, key.public_key())
        with pytest.raises(StatementError):
            verify_statement(dataclasses.replace(view, line=line), view_signature, key.public_key())
        changed += 1
    assert changed == 11 + 11  # payout_withheld among the header's fields
    # A dropped line, another key, the view's signature on the statement: refused.
    with pytest.raises(StatementError):
        verify_statement(
            Statement(statement.header, statement.lines[1:]), signature, key.public_key()
        )
    other = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(StatementError):
        verify_statement(
            statement,
            sign_statement(statement, other),
            key.public_key()
            if kind == "ecdsa-p256"
            else ed25519.Ed25519PrivateKey.generate().public_key(),
        )
    with pytest.raises(StatementError):
        verify_statement(statement, view_signature, key.public_key())


@pytest.mark.parametrize("owner", list(PRICES))
def test_the_owner_accepts_a_statement_that_matches_its_record(owner: str) -> None:
    statement, records, _, q = _session()
    check_statement(
        statement.for_owner(owner),
        _own_record(records, owner),
        PRICES[owner],
        _terms(),
        owner=owner,
        quoted_charge=q.line(owner).charge.total,
    )


def test_the_owner_refuses_any_mismatch() -> None:
    statement, records, *_ = _session()
    view = statement.for_owner("clinic-a")
    record = _own_record(records, "clinic-a")
    refused = set()
    # Moves of 10^8 nano-value (0.1 of J): an owner cannot tell its noisy value from a slightly
    # different one, only a value from the reward it does not give.
    for name, line in _mutations(view.line, step=100_000_000):
        if name in ("points_read", "points_delivered"):
            line = dataclasses.replace(line, **{name: getattr(view.line, name) + 1})
        # The owner does not know which of its points were delivered: a changed count is
        # refused for the charge and reward it no longer matches.
        pattern = {"points_delivered": "delivered_charge", "value": "reward"}.get(name, name)
        with pytest.raises(StatementMismatchError, match=pattern):
            check_statement(
                dataclasses.replace(view, line=line),
                record,
                PRICES["clinic-a"],
                _terms(),
                owner="clinic-a",
                quoted_charge=view.line.quoted,
            )
        refused.add(name)
    for name, header in _mutations(view.header):
        if name == "max_cost":
            continue  # the other owners' prices: the owner has no record of them
        with pytest.raises(StatementMismatchError):
            check_statement(
                dataclasses.replace(view, header=header),
                record,
                PRICES["clinic-a"],
                _terms(),
                owner="clinic-a",
            )
        refused.add(name)
    assert {
        "points_read",
        "epsilon_session",
        "epsilon_payout",
        "reward",
        "value",
        "read_charge",
        "session_id",
        "summary_size",
        "reward_rule",
        "consumer",
        "noise_scale",
        "payout_epsilon",
        "point_mean",
        "point_spread",
    } <= refused
    # Its own ledger disagreeing with an honest statement: refused too.
    with pytest.raises(StatementMismatchError, match="epsilon_session"):
        check_statement(
            view,
            dataclasses.replace(record, epsilon_session=0.3000011),
            PRICES["clinic-a"],
            _terms(),
            owner="clinic-a",
        )
    with pytest.raises(StatementMismatchError, match="points_read"):
        check_statement(
            view,
            dataclasses.replace(record, points_released=31),
            PRICES["clinic-a"],
            _terms(),
            owner="clinic-a",
        )


def test_the_owner_refuses_a_statement_above_the_consumers_cap() -> None:
    """Issue 25, B3: a line whose total is above the header's ``max_cost``, or the ``max_cost``
    of the terms the owner accepted, is refused. Control: a line exactly at the cap is taken."""
    statement, records, _, q = _session()
    view = statement.for_owner("clinic-a")
    record = _own_record(records, "clinic-a")
    total = view.line.total

    def check(header_cap: int, terms_cap: int | None) -> None:
        check_statement(
            dataclasses.replace(view, header=dataclasses.replace(view.header, max_cost=header_cap)),
            record,
            PRICES["clinic-a"],
            _terms(),
            owner="clinic-a",
            quoted_charge=q.line("clinic-a").charge.total,
            max_cost=terms_cap,
        )

    check(total, total)  # the control: at the cap
    with pytest.raises(StatementMismatchError, match="the header's max_cost"):
        check(total - 1, None)
    with pytest.raises(StatementMismatchError, match="the accepted terms' max_cost"):
        check(total, total - 1)


def test_a_proportional_split_pays_exactly_the_reward() -> None:
    statement, records, *_ = _session(ProportionalSplit(9_000_001))
    assert sum(line.reward for line in statement.lines) == 9_000_001
    assert statement.header.reward_rule == "proportional"
    for owner in PRICES:
        check_statement(
            statement.for_owner(owner),
            _own_record(records, owner),
            PRICES[owner],
            _terms("proportional", 9_000_001),
            owner=owner,
        )


def test_settle_refuses_a_session_beyond_its_quote() -> None:
    _, records, release, q = _session()
    over = dict(
        records,
        **{"clinic-b": SessionRecord(41, 5, SESSION_EPS, release.owner_epsilon("clinic-b"))},
    )
    with pytest.raises(ValueError, match="41 points read, more than the 40"):
        settle("session-7", "consumer:bob", q, PRICES, over, release)
    greedy = dict(records, **{"clinic-c": SessionRecord(6, 0, 2.0, 0.0)})
    with pytest.raises(ValueError, match="micro-epsilon"):
        settle("session-7", "consumer:bob", q, PRICES, greedy, release)
    wrong = dict(records, **{"clinic-b": SessionRecord(25, 4, SESSION_EPS, 0.0)})
    with pytest.raises(ValueError, match="delivered points"):
        settle("session-7", "consumer:bob", q, PRICES, wrong, release)


def test_without_a_reward_an_owners_line_says_nothing_of_what_the_summary_holds() -> None:
    """Issue 25, F5: the curator's choice of the summary (a function of D_v and of the other
    owners' points) decides each owner's delivered count. Without a payout release, each line
    pays the price per point delivered on the owner's points read up to p, so two sessions whose
    summaries hold 7 and 0 of an owner's points give it the same part, byte for byte; a line that
    states the count (main's statement: 7 and 0, its charge with it) is refused by the owner."""
    q = quote(PRICES, {o: OwnerLimits(40, SESSION_EPS, 0.0) for o in PRICES}, 12)
    parts = []
    for delivered in (7, 0):
        records = {
            "clinic-a": SessionRecord(30, delivered, SESSION_EPS),
            "clinic-b": SessionRecord(25, 12 - delivered, SESSION_EPS),
        }
        statement = settle("session-8", "consumer:bob", q, PRICES, records)
        parts.append(statement.for_owner("clinic-a"))
    assert parts[0].encode() == parts[1].encode()
    line = parts[0].line
    assert line.points_delivered == 12 and line.delivered_charge == 12 * 500_000
    record = OwnerRecord("session-8", "consumer:bob", 30, SESSION_EPS)
    terms = SettlementTerms(12, 40)
    check_statement(parts[0], record, PRICES["clinic-a"], terms, owner="clinic-a")
    telling = dataclasses.replace(
        parts[0], line=dataclasses.replace(line, points_delivered=7, delivered_charge=7 * 500_000)
    )
    with pytest.raises(StatementMismatchError, match="points_delivered"):
        check_statement(telling, record, PRICES["clinic-a"], terms, owner="clinic-a")


def test_a_withheld_payout_pays_no_value_and_no_reward_and_each_owner_checks_it() -> None:
    """A payout release refused at settlement: the statement states the terms' settlement and
    why (``payout_withheld``), no value, no reward, each owner's points read up to p as
    delivered; each owner accepts exactly that, and refuses a withheld line that still states a
    value, a reward or its count in the summary. A statement without the field keeps its bytes
    (the field is left out when empty)."""
    statement, records, release, q = _session()
    assert b"payout_withheld" not in statement.encode()
    withheld = settle("session-7", "consumer:bob", q, PRICES, records, release, withheld="refused")
    assert decode_statement(withheld.encode()) == withheld
    assert withheld.header.payout_withheld == "refused"
    assert withheld.header.reward_rule == "value" and withheld.header.reward == 8_000_000
    for line in withheld.lines:
        assert line.value == 0 and line.reward == 0
        assert line.points_delivered == min(records[line.owner].points_read, 12)
        check_statement(
            withheld.for_owner(line.owner),
            _own_record(records, line.owner),
            PRICES[line.owner],
            _terms(),
            owner=line.owner,
            quoted_charge=q.line(line.owner).charge.total,
        )
    part = withheld.for_owner("clinic-a")
    own = _own_record(records, "clinic-a")
    for field, value in (("value", 5), ("reward", 5), ("points_delivered", 7)):
        changed: dict[str, Any] = {field: value}
        telling = dataclasses.replace(part, line=dataclasses.replace(part.line, **changed))
        with pytest.raises(StatementMismatchError, match=field):
            check_statement(telling, own, PRICES["clinic-a"], _terms(), owner="clinic-a")
    with pytest.raises(StatementError, match="withheld only under terms that fix a reward"):
        dataclasses.replace(withheld.header, reward_rule="none", reward=0)


@pytest.mark.parametrize("withheld", ["", "refused"])
def test_a_statement_without_the_terms_payout_epsilon_is_refused_once_points_left(
    withheld: str,
) -> None:
    """Issue 25, ninth pass (t1c/t1d): an open that ran under other terms than the recorded
    reward line read points without charging the payout release, and the owner accepted a
    statement stating epsilon_payout 0 under that line, since it matched its ledger. Once an
    owner's points left it, the statement's payout epsilon and the owner's charge are the
    epsilon_O the terms fix, withheld or not: stating 0 (with a ledger of 0) is refused, and so
    is the honest figure against a ledger that never charged it. Control: the honest statement
    against the honest ledger passes."""
    _, records, release, q = _session()
    terms = _terms()
    fixed = terms.owner_epsilon()
    assert fixed > 0 and epsilon_units(fixed) == epsilon_units(release.epsilon_owner)
    dodged = dict(
        records, **{"clinic-a": dataclasses.replace(records["clinic-a"], epsilon_payout=0.0)}
    )
    for recs, ledger_payout, ok in (
        (dodged, 0.0, False),  # the statement states 0, the owner's ledger holds 0
        (records, 0.0, False),  # the honest statement, a ledger that never charged it
        (records, fixed, True),  # control
    ):
        statement = settle("session-7", "consumer:bob", q, PRICES, recs, release, withheld=withheld)
        part = statement.for_owner("clinic-a")
        own = dataclasses.replace(_own_record(recs, "clinic-a"), epsilon_payout=ledger_payout)
        quoted = q.line("clinic-a").charge.total
        args = (part, own, PRICES["clinic-a"], terms)
        if ok:
            check_statement(*args, owner="clinic-a", quoted_charge=quoted)
        else:
            with pytest.raises(StatementMismatchError, match="epsilon_O its terms fix"):
                check_statement(*args, owner="clinic-a", quoted_charge=quoted)
