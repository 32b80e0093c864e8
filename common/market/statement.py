"""Settlement statements: who owes whom what for which releases, in bytes every party can check.

After a session the curator writes a :class:`Statement` (:func:`settle`): a header (session,
consumer, p, the payout epsilon and noise scale, the reward rule, the quoted maximum) and one
:class:`StatementLine` per owner (points read and delivered, epsilon charged, the price
components, the owner's noisy value, its reward and its total). Its canonical bytes
(:meth:`Statement.encode`) are what the curator signs with its certificate key
(:func:`sign_statement`) and stores with the session; the consumer receives the whole statement.

Without a payout release a line states no delivery: which of an owner's points the summary holds
is a function of ``D_v`` and of the other owners' points, so each line pays the price per point
delivered on the owner's points read up to p (:func:`paid_delivered`).

An owner receives only its own line, as an :class:`OwnerStatement` (the header and that line,
with its own canonical bytes and signature): the other lines hold the other owners' noisy values,
which the payout release does not show it (:mod:`dpmarket.common.market.payouts`). Both documents
are signed by the curator, so a line that differs between an owner's copy and the consumer's
statement is a signed contradiction. The owner verifies the signature (:func:`verify_statement`)
and checks the line against its own record of points released and epsilon charged, and against
its prices (:func:`check_statement`), refusing any mismatch.

**Canonical encoding.** A domain tag (``b"dpmarket/settlement-statement/v1\\n"`` or
``b"dpmarket/settlement-line/v1\\n"``) followed by JSON with sorted keys, no whitespace, ASCII
only (other characters as ``\\uXXXX`` escapes), and nothing but strings and integers (amounts in
micro-credits, epsilon in micro-epsilon, values in nano-value: :mod:`~dpmarket.common.market.money`;
integers within +-2^53 so that any JSON reader keeps them exact). Lines are sorted by owner. The
same statement always has the same bytes; :func:`decode_statement` refuses bytes that are not
the canonical encoding of what they decode to.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError
from dpmarket.common.market.money import epsilon_units, format_credits, value_units
from dpmarket.common.market.payouts import (
    POINT_VALUE_MEAN,
    POINT_VALUE_SPREAD,
    PayoutRelease,
    ProportionalSplit,
    ValueReward,
    payout_noise_scale,
    payout_sensitivity,
)
from dpmarket.common.market.pricing import Charge, OwnerPrices, Quote, owner_charge

__all__ = [
    "NO_SUMMARY",
    "REWARD_RULES",
    "OwnerRecord",
    "OwnerStatement",
    "SessionRecord",
    "SettlementTerms",
    "Statement",
    "StatementError",
    "StatementHeader",
    "StatementLine",
    "StatementMismatchError",
    "check_statement",
    "decode_owner_statement",
    "decode_statement",
    "paid_delivered",
    "settle",
    "sign_statement",
    "verify_statement",
]

_STATEMENT_TAG = b"dpmarket/settlement-statement/v1\n"
_OWNER_TAG = b"dpmarket/settlement-line/v1\n"
#: Integers a statement may hold (exact in every JSON reader).
_MAX_INT = 2**53 - 1
#: The reward rules a header may name: none, :class:`ValueReward`, :class:`ProportionalSplit`.
REWARD_RULES: tuple[str, ...] = ("none", "value", "proportional")

PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
PublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


class StatementError(InvalidArgumentError):
    """A statement that is malformed, not canonical, or whose signature does not verify
    (``INVALID_ARGUMENT``)."""


class StatementMismatchError(FailedPreconditionError):
    """A well-formed, signed statement that disagrees with the owner's own record or prices
    (``FAILED_PRECONDITION``); the message lists every field that differs."""


#: Fields a document leaves out of its canonical bytes when empty (so that the bytes of every
#: statement without them are unchanged).
_OPTIONAL = frozenset({"payout_withheld"})


def _check_fields(obj: Any, signed: tuple[str, ...] = ()) -> None:
    """Strings non-empty (an :data:`_OPTIONAL` one may be empty); ints exact ints in
    [0, 2^53) (``signed`` ones in (-2^53, 2^53))."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if f.type in ("str", str):
            if not isinstance(value, str) or not (value or f.name in _OPTIONAL):
                raise StatementError(f"{f.name} must be a non-empty string, got {value!r}")
        else:
            low = -_MAX_INT if f.name in signed else 0
            exact = isinstance(value, int) and not isinstance(value, bool)
            if not exact or not low <= value <= _MAX_INT:
                raise StatementError(f"{f.name} must be an int in [{low}, 2^53), got {value!r}")


@dataclass(frozen=True)
class StatementHeader:
    """What a statement says about the whole session.

    Attributes
    ----------
    session_id, consumer : str
    summary_size : int
        p.
    payout_epsilon : int
        The payout release's epsilon, micro-epsilon (0: no payout release).
    noise_scale : int
        The Laplace scale of every owner's noisy value, nano-value (0: no payout release).
    reward_rule : {"none", "value", "proportional"}
    reward : int
        The rule's reward, micro-credits (per unit of value, or split).
    point_mean, point_spread : int
        The value rule's prior on one point's value, nano-value (0 for the other rules).
    max_cost : int
        The quote's maximum, micro-credits.
    payout_withheld : str
        Why the payout release the terms fixed was not made (its charge on the validation set
        was refused at settlement), or empty. When set, the header still states the terms'
        settlement (the rule, the reward, the payout epsilon and noise scale every owner
        accepted), and every line states no value, no reward and, as without a reward, its
        points read up to p as delivered (:func:`paid_delivered`). Left out of the canonical
        bytes when empty.

    Raises
    ------
    StatementError
        If a field is of the wrong type or out of range, or a payout is withheld under terms
        that fix none.
    """

    session_id: str
    consumer: str
    summary_size: int
    payout_epsilon: int
    noise_scale: int
    reward_rule: str
    reward: int
    point_mean: int
    point_spread: int
    max_cost: int
    payout_withheld: str = ""

    def __post_init__(self) -> None:
        _check_fields(self)
        if self.reward_rule not in REWARD_RULES:
            raise StatementError(
                f"reward_rule must be one of {REWARD_RULES}, got {self.reward_rule!r}"
            )
        if self.payout_withheld and self.reward_rule == "none":
            raise StatementError("a payout is withheld only under terms that fix a reward")


@dataclass(frozen=True)
class StatementLine:
    """What a statement says about one owner.

    Attributes
    ----------
    owner : str
    points_read, points_delivered : int
        Raw points the owner released, and the points paid at its price per point delivered:
        with a payout release, its points in the summary (the reward rule pays on them);
        without one, its points read up to p (:func:`paid_delivered`), which tells the owner
        nothing of what the summary holds.
    epsilon_session, epsilon_payout : int
        Micro-epsilon charged to the owner's ledger by the session and by the payout release.
    read_charge, delivered_charge, epsilon_charge, minimum_topup : int
        The price components, micro-credits (:class:`~dpmarket.common.market.pricing.Charge`).
    value : int
        The owner's noisy value, nano-value (may be negative).
    reward : int
        Its reward, micro-credits.
    quoted : int
        Its charge in the quote (the most it could be), micro-credits.

    Raises
    ------
    StatementError
        If a field is of the wrong type or out of range, or more points are delivered than read.
    """

    owner: str
    points_read: int
    points_delivered: int
    epsilon_session: int
    epsilon_payout: int
    read_charge: int
    delivered_charge: int
    epsilon_charge: int
    minimum_topup: int
    value: int
    reward: int
    quoted: int

    def __post_init__(self) -> None:
        _check_fields(self, signed=("value",))
        if self.points_delivered > self.points_read:
            raise StatementError(
                f"owner {self.owner!r}: {self.points_delivered} points delivered but only "
                f"{self.points_read} read"
            )

    @property
    def charge(self) -> int:
        """The owner's charge for the session's releases, micro-credits."""
        return self.read_charge + self.delivered_charge + self.epsilon_charge + self.minimum_topup

    @property
    def total(self) -> int:
        """What the consumer owes the owner: its charge and its reward, micro-credits."""
        return self.charge + self.reward


def _to_json(obj: Any) -> dict[str, Any]:
    return {
        f.name: getattr(obj, f.name)
        for f in fields(obj)
        if not (f.name in _OPTIONAL and getattr(obj, f.name) == "")
    }


def _dump(tag: bytes, document: dict[str, Any]) -> bytes:
    text = json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )
    return tag + text.encode("ascii")


@dataclass(frozen=True)
class Statement:
    """A session's settlement statement (see the module).

    Attributes
    ----------
    header : StatementHeader
    lines : tuple of StatementLine
        Sorted by owner on construction; owners unique.

    Raises
    ------
    StatementError
        If two lines name the same owner.
    """

    header: StatementHeader
    lines: tuple[StatementLine, ...]

    def __post_init__(self) -> None:
        lines = tuple(sorted(self.lines, key=lambda line: line.owner))
        owners = [line.owner for line in lines]
        if len(set(owners)) != len(owners):
            raise StatementError(f"a statement has one line per owner, got {owners}")
        object.__setattr__(self, "lines", lines)

    @property
    def total(self) -> int:
        """What the consumer owes in all, micro-credits."""
        return sum(line.total for line in self.lines)

    def encode(self) -> bytes:
        """The canonical bytes (see the module): what the curator signs."""
        return _dump(
            _STATEMENT_TAG,
            {"header": _to_json(self.header), "lines": [_to_json(line) for line in self.lines]},
        )

    def for_owner(self, owner: str) -> OwnerStatement:
        """The header and ``owner``'s line: what that owner receives.

        Raises
        ------
        KeyError
            If the statement has no line for ``owner``.
        """
        for line in self.lines:
            if line.owner == owner:
                return OwnerStatement(self.header, line)
        raise KeyError(f"the statement has no line for owner {owner!r}")


@dataclass(frozen=True)
class OwnerStatement:
    """One owner's part of a statement: the header and its line."""

    header: StatementHeader
    line: StatementLine

    def encode(self) -> bytes:
        """The canonical bytes (see the module): what the curator signs for the owner."""
        return _dump(_OWNER_TAG, {"header": _to_json(self.header), "line": _to_json(self.line)})


def _parse(data: bytes, tag: bytes, keys: set[str]) -> dict[str, Any]:
    if not isinstance(data, bytes | bytearray) or not bytes(data).startswith(tag):
        raise StatementError(f"not a statement: the bytes do not start with {tag!r}")
    try:
        document = json.loads(bytes(data)[len(tag) :].decode("ascii"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StatementError(f"not a statement: {exc}") from None
    if not isinstance(document, dict) or set(document) != keys:
        raise StatementError(f"a statement holds exactly the keys {sorted(keys)}")
    return document


def _build(cls: type[Any], item: Any) -> Any:
    names = {f.name for f in fields(cls)}
    if not isinstance(item, dict) or not names - _OPTIONAL <= set(item) <= names:
        raise StatementError(f"a {cls.__name__} holds exactly the keys {sorted(names)}")
    return cls(**item)


def _canonical(document: Statement | OwnerStatement, data: bytes) -> None:
    if document.encode() != bytes(data):
        raise StatementError("the bytes are not the canonical encoding of the statement")


def decode_statement(data: bytes) -> Statement:
    """Parse a statement's canonical bytes.

    Raises
    ------
    StatementError
        If the bytes are not a statement, hold a field of the wrong type or range, or are not
        exactly its canonical encoding (other key order, spacing, escapes or line order).
    """
    document = _parse(data, _STATEMENT_TAG, {"header", "lines"})
    if not isinstance(document["lines"], list):
        raise StatementError("a statement's lines are a list")
    statement = Statement(
        _build(StatementHeader, document["header"]),
        tuple(_build(StatementLine, item) for item in document["lines"]),
    )
    _canonical(statement, data)
    return statement


def decode_owner_statement(data: bytes) -> OwnerStatement:
    """Parse an owner statement's canonical bytes (as :func:`decode_statement`)."""
    document = _parse(data, _OWNER_TAG, {"header", "line"})
    statement = OwnerStatement(
        _build(StatementHeader, document["header"]), _build(StatementLine, document["line"])
    )
    _canonical(statement, data)
    return statement


def sign_statement(document: Statement | OwnerStatement, key: PrivateKey) -> bytes:
    """Sign a statement's canonical bytes.

    Parameters
    ----------
    document : Statement or OwnerStatement
    key : cryptography EllipticCurvePrivateKey or Ed25519PrivateKey
        The curator's certificate key (ECDSA with SHA-256 for an EC key, as the deployment's
        P-256 certificates; Ed25519 as is).

    Returns
    -------
    bytes
        The signature (DER for ECDSA, 64 bytes for Ed25519).

    Raises
    ------
    TypeError
        If ``key`` is of another kind.
    """
    data = document.encode()
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(data, ec.ECDSA(hashes.SHA256()))
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(data)
    raise TypeError(f"statements are signed with an EC or Ed25519 private key, got {type(key)}")


def verify_statement(
    document: Statement | OwnerStatement, signature: bytes, key: PublicKey
) -> None:
    """Check a statement's signature over its canonical bytes.

    Raises
    ------
    StatementError
        If the signature does not verify (any field changed, another key, another document).
    TypeError
        If ``key`` is of another kind.
    """
    data = document.encode()
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, data)
        else:
            raise TypeError(
                f"statements are verified with an EC or Ed25519 public key, got {type(key)}"
            )
    except InvalidSignature:
        raise StatementError(
            f"the statement of session {document.header.session_id!r} does not carry a valid "
            f"signature of this key: refuse it"
        ) from None


@dataclass(frozen=True)
class SessionRecord:
    """The curator's record of one owner in a finished session (the input of :func:`settle`).

    Attributes
    ----------
    points_read : int
        Raw points the owner released to the curator (its ledger's count).
    points_delivered : int
        Of them, points in the delivered summary (:func:`settle` states them only with a payout
        release).
    epsilon_session : float
        Epsilon the session charged the owner's ledger (its terms).
    epsilon_payout : float
        Epsilon the payout release charged it (0 for an owner with no delivered point).
    """

    points_read: int
    points_delivered: int
    epsilon_session: float
    epsilon_payout: float = 0.0


def _prior(release: PayoutRelease | None) -> tuple[int, int]:
    """The value rule's prior constants, or zeros."""
    if release is not None and isinstance(release.rule, ValueReward):
        return release.rule.point_mean, release.rule.point_spread
    return 0, 0


def settle(
    session_id: str,
    consumer: str,
    quoted: Quote,
    prices: Mapping[str, OwnerPrices],
    records: Mapping[str, SessionRecord],
    release: PayoutRelease | None = None,
    *,
    withheld: str = "",
) -> Statement:
    """Write a session's statement from its quote, the owners' prices, what each released and
    the payout release.

    Parameters
    ----------
    session_id, consumer : str
    quoted : Quote
        The quote the request was accepted under.
    prices : mapping of str to OwnerPrices
    records : mapping of str to SessionRecord
        Every owner the session opened with (a left-out owner released nothing and has no line).
    release : PayoutRelease, optional
        The payout release (:func:`~dpmarket.common.market.payouts.release_payouts`); without
        one, every value and reward is 0, and each line's ``points_delivered`` is the owner's
        points read up to p (:func:`paid_delivered`), not its count in the summary.
    withheld : str, optional
        Why the payout release was not made (``StatementHeader.payout_withheld``); ``release``
        then states only the terms' settlement
        (:func:`~dpmarket.common.market.terms.silent_release`), its counts and values are not
        used, and every line is written as without a release (no value, no reward, its points
        read up to p as delivered).

    Returns
    -------
    Statement

    Raises
    ------
    ValueError
        If an owner has no prices or no quote line, the release's delivered counts differ from
        the records, an owner with delivered points is missing from the release, or an owner's
        points read or delivered, epsilon or charge, or the total, exceed the quote (the session
        took more than its terms allowed).
    """
    if withheld and release is None:
        raise ValueError("a withheld payout is stated under the terms' (silent) release")
    values, rewards = ({}, {}) if withheld else _released_values(release, records)
    lines = []
    for owner, record in records.items():
        if owner not in prices:
            raise ValueError(f"owner {owner!r} has no prices")
        made = release is not None and not withheld
        if made and record.points_delivered > 0 and owner not in values:
            raise ValueError(f"owner {owner!r} delivered points but is not in the payout release")
        if not made:
            paid = paid_delivered(record.points_read, quoted.summary_size)
            record = replace(record, points_delivered=paid)
        line = _priced_line(owner, record, prices[owner], quoted.line(owner).charge)
        lines.append(replace(line, value=values.get(owner, 0), reward=rewards.get(owner, 0)))
    header = replace(_header(session_id, consumer, quoted, release), payout_withheld=withheld)
    statement = Statement(header, tuple(lines))
    if statement.total > quoted.total:
        raise ValueError(
            f"the statement totals {format_credits(statement.total)} credits, more than the "
            f"quote's {format_credits(quoted.total)}"
        )
    return statement


def paid_delivered(points_read: int, summary_size: int) -> int:
    """The points a statement without a payout release pays at the price per point delivered:
    every point the owner released, up to p, whether or not the summary holds it.

    Which of an owner's points the summary holds (and how many) is the curator's choice on
    ``D_v`` and on every owner's points; a line stating it, or a charge computed from it, would
    tell the owner that count exactly, uncharged. A line computed from the owner's own points
    read and the public p tells it nothing it did not know; the quote already charged every
    owner at this figure (``min(max_points_read, p)``), so a settlement stays within it.

    Parameters
    ----------
    points_read : int
        The owner's raw points released in the session (its ledger's count).
    summary_size : int
        p (0 for a job that delivers no point).

    Returns
    -------
    int
        ``min(points_read, summary_size)``.
    """
    return min(int(points_read), int(summary_size))


def _released_values(
    release: PayoutRelease | None, records: Mapping[str, SessionRecord]
) -> tuple[dict[str, int], dict[str, int]]:
    """Each owner's noisy value (nano-value) and reward (micro-credits) in the payout release
    (empty without one), checked against the records' delivered counts.

    Raises
    ------
    ValueError
        If the release counts another number of delivered points than an owner's record.
    """
    values: dict[str, int] = {}
    rewards: dict[str, int] = {}
    if release is None:
        return values, rewards
    for owner, n, value, reward in zip(
        release.owners, release.counts, release.value_units(), release.payouts, strict=True
    ):
        values[owner], rewards[owner] = value, reward
        if owner in records and records[owner].points_delivered != int(n):
            raise ValueError(
                f"owner {owner!r}: the release counts {int(n)} delivered "
                f"points, the record {records[owner].points_delivered}"
            )
    return values, rewards


def _priced_line(
    owner: str, record: SessionRecord, prices: OwnerPrices, allowed: Charge
) -> StatementLine:
    """``owner``'s line at its prices (value and reward 0), within its quote line ``allowed``.

    Raises
    ------
    ValueError
        If its points read or delivered, its epsilon or its charge exceed ``allowed``.
    """
    eps_session = epsilon_units(record.epsilon_session)
    eps_payout = epsilon_units(record.epsilon_payout)
    charge = owner_charge(
        prices, record.points_read, record.points_delivered, eps_session + eps_payout
    )
    for what, used, most in (
        ("points read", charge.points_read, allowed.points_read),
        ("points delivered", charge.points_delivered, allowed.points_delivered),
        ("micro-epsilon", charge.epsilon_units, allowed.epsilon_units),
    ):
        if used > most:
            raise ValueError(
                f"owner {owner!r}: {used} {what}, more than the {most} of its quote: the "
                f"session exceeded its terms"
            )
    if charge.total > allowed.total:
        raise ValueError(
            f"owner {owner!r} is owed {format_credits(charge.total)} credits, more than its "
            f"quote of {format_credits(allowed.total)}: the session exceeded its terms"
        )
    return StatementLine(
        owner=owner,
        points_read=charge.points_read,
        points_delivered=charge.points_delivered,
        epsilon_session=eps_session,
        epsilon_payout=eps_payout,
        read_charge=charge.read,
        delivered_charge=charge.delivered,
        epsilon_charge=charge.epsilon,
        minimum_topup=charge.minimum_topup,
        value=0,
        reward=0,
        quoted=allowed.total,
    )


def _header(
    session_id: str, consumer: str, quoted: Quote, release: PayoutRelease | None
) -> StatementHeader:
    """The statement's header: the session, p, the payout release's figures, the quote's total."""
    mean, spread = _prior(release)
    return StatementHeader(
        session_id=session_id,
        consumer=consumer,
        summary_size=quoted.summary_size,
        payout_epsilon=epsilon_units(release.epsilon) if release is not None else 0,
        noise_scale=value_units(release.noise_scale) if release is not None else 0,
        reward_rule=release.rule.name if release is not None else "none",
        reward=release.rule.reward if release is not None else 0,
        point_mean=mean,
        point_spread=spread,
        max_cost=quoted.total,
    )


@dataclass(frozen=True)
class SettlementTerms:
    """What the session's terms fixed about its settlement before it opened (the owner signed
    them): what the statement's header must say.

    Attributes
    ----------
    summary_size : int
        p (0: a job that delivers no point, a CAPE job: :data:`NO_SUMMARY`).
    validation_size : int
        m (the noise scale depends on it; 0 for a CAPE job, which has no validation set).
    payout_epsilon : float
        The payout release's epsilon (0: no payout release).
    reward_rule : {"none", "value", "proportional"}
    reward : int
        The rule's reward, micro-credits (0 without a rule).
    point_mean, point_spread : int
        The value rule's prior (:class:`~dpmarket.common.market.payouts.ValueReward`), ignored
        by the other rules.

    Raises
    ------
    ValueError
        If a value is out of range, a payout epsilon comes without a rule or a rule without it,
        or a rule comes without a summary and a validation set.
    """

    summary_size: int
    validation_size: int
    payout_epsilon: float = 0.0
    reward_rule: str = "none"
    reward: int = 0
    point_mean: int = POINT_VALUE_MEAN
    point_spread: int = POINT_VALUE_SPREAD

    def __post_init__(self) -> None:
        for name in ("summary_size", "validation_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.reward_rule != "none" and min(self.summary_size, self.validation_size) < 1:
            raise ValueError(
                f"a reward is split by the summary's value to a validation set: it needs p and m "
                f">= 1, got p = {self.summary_size}, m = {self.validation_size}"
            )
        if self.reward_rule not in REWARD_RULES:
            raise ValueError(f"reward_rule must be one of {REWARD_RULES}, got {self.reward_rule!r}")
        if (self.reward_rule == "none") != (self.payout_epsilon == 0):
            raise ValueError(
                f"a payout release needs both a reward rule and an epsilon > 0, got rule "
                f"{self.reward_rule!r} and epsilon {self.payout_epsilon}"
            )
        epsilon_units(self.payout_epsilon)

    def rule(self) -> ValueReward | ProportionalSplit | None:
        """The reward rule the terms fixed (None without a payout release)."""
        if self.reward_rule == "value":
            return ValueReward(self.reward, self.point_mean, self.point_spread)
        if self.reward_rule == "proportional":
            return ProportionalSplit(self.reward)
        return None

    def owner_epsilon(self) -> float:
        """What the payout release these terms fix charges an owner whose raw points left it:
        ``epsilon_owner = D_O / b`` (<= the payout epsilon), from the public m, p, payout
        epsilon and reward rule (:func:`~dpmarket.common.market.payouts.payout_sensitivity`);
        0 without a payout release."""
        rule = self.rule()
        if rule is None:
            return 0.0
        m, p = self.validation_size, self.summary_size
        sens = payout_sensitivity(m, p, reveals_other_values=rule.reveals_other_values)
        return sens.owner / payout_noise_scale(m, p, self.payout_epsilon, rule)

    def header_fields(self) -> dict[str, int | str]:
        """The header fields these terms decide, as the statement states them."""
        rule = self.rule()
        if rule is None:
            return {
                "summary_size": self.summary_size,
                "payout_epsilon": 0,
                "noise_scale": 0,
                "reward_rule": "none",
                "reward": 0,
                "point_mean": 0,
                "point_spread": 0,
            }
        scale = payout_noise_scale(
            self.validation_size, self.summary_size, self.payout_epsilon, rule
        )
        prior = (rule.point_mean, rule.point_spread) if isinstance(rule, ValueReward) else (0, 0)
        return {
            "summary_size": self.summary_size,
            "payout_epsilon": epsilon_units(self.payout_epsilon),
            "noise_scale": value_units(scale),
            "reward_rule": self.reward_rule,
            "reward": self.reward,
            "point_mean": prior[0],
            "point_spread": prior[1],
        }


#: The settlement of a job that delivers no point and has no validation set (a CAPE job): its
#: statement states p = 0, no payout release, no reward; each owner is paid its price per unit
#: epsilon and its minimum.
NO_SUMMARY = SettlementTerms(summary_size=0, validation_size=0)


@dataclass(frozen=True)
class OwnerRecord:
    """An owner's own record of a session, from its ledger (what it checks a statement against).

    Attributes
    ----------
    session_id : str
    consumer : str
        The consumer its ledger recorded for the session.
    points_released : int
        Raw points it released to the curator in the session.
    epsilon_session : float
        Epsilon its ledger charged for the session.
    epsilon_payout : float
        Epsilon its ledger charged for the session's payout release (0 if none).
    """

    session_id: str
    consumer: str
    points_released: int
    epsilon_session: float
    epsilon_payout: float = 0.0


def _reward_problems(header: StatementHeader, line: StatementLine) -> list[str]:
    """What is wrong with a line's value and reward under its header's rule
    (:func:`check_statement`): recomputed exactly for the value rule, within ``[0, reward]``
    for the proportional split, 0 without a rule, and no value and no reward when the payout
    was withheld."""
    own: dict[str, int | None]
    if header.payout_withheld:  # the release was not made (the header says why)
        own = {"value": 0, "reward": 0}
    elif header.reward_rule == "value":
        reward = None
        if line.points_delivered <= header.summary_size:
            rule = ValueReward(header.reward, header.point_mean, header.point_spread)
            reward = rule.payout(
                line.value, line.points_delivered, header.summary_size, header.noise_scale
            )
        own = {"reward": reward}
    elif header.reward_rule == "proportional":
        if not 0 <= line.reward <= header.reward:
            return [f"reward: {line.reward} is outside [0, {header.reward}]"]
        own = {}
    else:
        own = {"reward": 0}
    return [
        f"{name}: the statement says {getattr(line, name)!r}, the owner's record {value!r}"
        for name, value in own.items()
        if getattr(line, name) != value
    ]


def _payout_problems(record: OwnerRecord, line: StatementLine, terms: SettlementTerms) -> list[str]:
    """The owner charges the epsilon_O its terms fix before its first raw point leaves
    (:meth:`SettlementTerms.owner_epsilon`): once points left it, the line states that payout
    epsilon (withheld or not) and the owner's ledger holds that charge, or the statement would
    settle a payout release nobody paid for (an open that ran under other terms than the
    recorded ones). What is wrong, for :func:`check_statement`."""
    if record.points_released == 0:
        return []
    fixed = epsilon_units(terms.owner_epsilon())
    stated = (
        ("the statement", line.epsilon_payout),
        ("the owner's ledger", epsilon_units(record.epsilon_payout)),
    )
    return [
        f"epsilon_payout: {whose} says {value!r}, the epsilon_O its terms fix {fixed!r} "
        "(charged before the owner's first raw point left)"
        for whose, value in stated
        if value != fixed
    ]


def check_statement(
    document: OwnerStatement,
    record: OwnerRecord,
    prices: OwnerPrices,
    terms: SettlementTerms,
    *,
    owner: str,
    quoted_charge: int | None = None,
    max_cost: int | None = None,
) -> None:
    """An owner's check of its statement against its own record and prices.

    Checks that the statement is for this owner and session; that its header states the
    settlement the terms fixed (p, the payout epsilon, the noise scale recomputed from the
    public m and p, the reward rule and reward); that the points read and the
    epsilon charged are those of the owner's ledger (each epsilon as
    :func:`~dpmarket.common.market.money.epsilon_units` of the ledger's float); that the points
    paid as delivered are, without a payout release (or with one withheld), its points
    released up to p (:func:`paid_delivered`: a line that states more tells it what the
    summary holds) and, with one, no more than p; that every price component is the owner's
    price applied to these figures; that the reward follows the header's rule (recomputed
    exactly for :class:`~dpmarket.common.market.payouts.ValueReward`; within ``[0, reward]``
    for the proportional split, which depends on the other owners' values; 0 without a rule,
    and 0 with its value 0 when the header says the payout was withheld); and, if
    ``quoted_charge`` is given (the owner's own quote line), that the line states it and the
    charge stays within it; that the line's total stays within the header's ``max_cost`` (the
    consumer's cap) and, if ``max_cost`` is given (the cap of the terms the owner accepted),
    within that too. Once the owner released raw points, the payout epsilon the line states
    and the one its ledger charged are the epsilon_O its terms fix
    (:meth:`SettlementTerms.owner_epsilon`, 0 without a payout release; so too when the payout
    was withheld: the owner charged it before its first point left). Verify the signature first
    (:func:`verify_statement`).

    Parameters
    ----------
    document : OwnerStatement
    record : OwnerRecord
    prices : OwnerPrices
        The prices the owner's policy set for the session.
    terms : SettlementTerms
        The settlement its terms fixed.
    owner : str
        The owner's own name (from its certificate).
    quoted_charge : int, optional
        The owner's charge in the quote, micro-credits, as it computed it from its terms.
    max_cost : int, optional
        The consumer's cap in the terms the owner accepted, micro-credits.

    Raises
    ------
    StatementMismatchError
        Listing every field that differs; the owner refuses the statement.
    """
    line, header = document.line, document.header
    problems: list[str] = []

    def expect(name: str, stated: object, own: object) -> None:
        if stated != own:
            problems.append(f"{name}: the statement says {stated!r}, the owner's record {own!r}")

    expect("owner", line.owner, owner)
    expect("session_id", header.session_id, record.session_id)
    expect("consumer", header.consumer, record.consumer)
    for name, value in terms.header_fields().items():
        expect(name, getattr(header, name), value)
    expect("points_read", line.points_read, record.points_released)
    expect("epsilon_session", line.epsilon_session, epsilon_units(record.epsilon_session))
    expect("epsilon_payout", line.epsilon_payout, epsilon_units(record.epsilon_payout))
    problems += _payout_problems(record, line, terms)
    if header.reward_rule == "none" or header.payout_withheld:
        # Without a payout release a line states no delivery (:func:`paid_delivered`): a line
        # that does tells the owner a count it must not learn, and is refused.
        expect(
            "points_delivered",
            line.points_delivered,
            paid_delivered(record.points_released, header.summary_size),
        )
    elif line.points_delivered > header.summary_size:
        problems.append(
            f"points_delivered: {line.points_delivered} is more than the summary's "
            f"{header.summary_size} points"
        )
    try:
        own = owner_charge(
            prices,
            record.points_released,
            line.points_delivered,
            epsilon_units(record.epsilon_session) + epsilon_units(record.epsilon_payout),
        )
    except ValueError as exc:
        problems.append(str(exc))
    else:
        expect("read_charge", line.read_charge, own.read)
        expect("delivered_charge", line.delivered_charge, own.delivered)
        expect("epsilon_charge", line.epsilon_charge, own.epsilon)
        expect("minimum_topup", line.minimum_topup, own.minimum_topup)
    problems += _reward_problems(header, line)
    if line.points_delivered == 0:
        expect("value", line.value, 0)
    if quoted_charge is not None:
        expect("quoted", line.quoted, quoted_charge)
    if line.charge > line.quoted:
        problems.append(f"charge: {line.charge} is more than the quoted {line.quoted}")
    for cap, whose in ((header.max_cost, "the header's"), (max_cost, "the accepted terms'")):
        if cap is not None and line.total > cap:
            problems.append(
                f"total: {line.total} is more than {whose} max_cost {cap} (the consumer's cap)"
            )
    if problems:
        raise StatementMismatchError(
            f"refused the statement of session {header.session_id!r}: " + "; ".join(problems)
        )
