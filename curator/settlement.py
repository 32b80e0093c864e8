"""The curator's settlement of a session: its statement, from the owners' own records, signed.

When a session opens, the curator keeps what its settlement depends on (:class:`SessionMarket`:
the owner-side session id, the consumer, the quote, every owner's prices and the settlement
terms) in its store with the session. When the session ends, and once every owner it opened
at has returned its ledger's record of the session (points released, epsilon charged), the
curator writes the statement (:func:`settle_session`, i.e.
:func:`~dpmarket.common.market.statement.settle`): one line per owner from *that owner's own
record* and the points of it the summary delivered (none for a session that failed), signs it
with its certificate key, and stores it (in the transaction that completes a finished session).
Each owner then receives its own part, signed too, and checks it against its ledger
(:mod:`dpmarket.owner.earnings`). Settling from the owners' records is what makes an honest
statement pass every owner's check; a curator that lies about a record is refused.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.market.attribution import SummaryBlocks
from dpmarket.common.market.payouts import PAYOUT_CHARGE_LABEL, PayoutRelease, release_payouts
from dpmarket.common.market.pricing import OwnerPrices, Quote
from dpmarket.common.market.statement import (
    PrivateKey,
    SessionRecord,
    SettlementTerms,
    Statement,
    settle,
    sign_statement,
)
from dpmarket.common.market.terms import (
    owner_payout_epsilon,
    quote_from_json,
    quote_to_json,
    silent_release,
)
from dpmarket.common.privacy.ledger import Charge, SessionSpend
from dpmarket.common.privacy.noise import NoiseSource

__all__ = [
    "SETTLEMENT_RETRY_CAP_SECONDS",
    "SETTLEMENT_RETRY_SECONDS",
    "RetrySchedule",
    "SessionMarket",
    "SignedSettlement",
    "payout_release",
    "settle_session",
]

#: The first wait before a failed piece of settlement (an owner's record, a delivery) is tried
#: again, and the period of the background retry's passes, seconds.
SETTLEMENT_RETRY_SECONDS = 1.0
#: The longest wait between two tries of the same piece, seconds.
SETTLEMENT_RETRY_CAP_SECONDS = 30.0


@dataclass(frozen=True)
class SessionMarket:
    """What a session's settlement depends on, fixed when it opened.

    Attributes
    ----------
    owner_session : str
        The id the owners know the session by (the statement's ``session_id``).
    consumer : str
        The consumer's identity.
    quote : Quote
    prices : dict of str to OwnerPrices
        Every quoted owner's published prices.
    settlement : SettlementTerms
    """

    owner_session: str
    consumer: str
    quote: Quote
    prices: dict[str, OwnerPrices]
    settlement: SettlementTerms

    def to_json(self) -> dict[str, Any]:
        """A JSON object (what the store keeps with the session)."""
        return {
            "owner_session": self.owner_session,
            "consumer": self.consumer,
            "quote": quote_to_json(self.quote),
            "prices": {o: asdict(p) for o, p in sorted(self.prices.items())},
            "settlement": asdict(self.settlement),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionMarket:
        """The inverse of :meth:`to_json`.

        Raises
        ------
        ValueError, TypeError, KeyError
            If ``data`` is not such an object.
        """
        return cls(
            owner_session=str(data["owner_session"]),
            consumer=str(data["consumer"]),
            quote=quote_from_json(data["quote"]),
            prices={o: OwnerPrices(**p) for o, p in data["prices"].items()},
            settlement=SettlementTerms(**data["settlement"]),
        )


@dataclass(frozen=True)
class SignedSettlement:
    """A session's statement, signed, and each owner's part, signed.

    Attributes
    ----------
    statement : Statement
    data, signature : bytes
        The statement's canonical bytes and the curator's signature over them (the consumer's
        copy).
    owners : dict of str to (bytes, bytes)
        Each owner's part: its canonical bytes and signature.
    """

    statement: Statement
    data: bytes
    signature: bytes
    owners: dict[str, tuple[bytes, bytes]]


def _priced(epsilon: float) -> float:
    return 0.0 if math.isinf(epsilon) else float(epsilon)


def settle_session(
    market: SessionMarket,
    spends: Mapping[str, SessionSpend | None],
    delivered: Mapping[str, int],
    key: PrivateKey,
    release: PayoutRelease | None = None,
    *,
    withheld: str = "",
) -> SignedSettlement | None:
    """The session's signed statement, or None while an owner's record is not known.

    Parameters
    ----------
    market : SessionMarket
    spends : mapping of str to SessionSpend or None
        Every owner the session was opened at: its ledger's record (None, or ``unknown`` set,
        while the curator does not have it).
    delivered : mapping of str to int
        Points of each owner in the delivered summary (empty for a session that failed).
    key : EC or Ed25519 private key
        The curator's certificate key.
    release : PayoutRelease, optional
        The payout release, when the terms fix one (:func:`payout_release`; for a session that
        delivered nothing, :func:`~dpmarket.common.market.terms.silent_release`).
    withheld : str, optional
        Why the payout release the terms fix was not made (its validation charge refused):
        the statement is written without it, saying so
        (``StatementHeader.payout_withheld``). A session that delivered points under such
        terms and has no release is settled so too, with a reason saying the release is
        missing, rather than left unsettled.

    Returns
    -------
    SignedSettlement or None

    Raises
    ------
    ValueError
        From :func:`~dpmarket.common.market.statement.settle`: a record beyond the quote (the
        owners enforce their lines, so this means a broken invariant; the session stays
        unsettled and the error is logged).
    """
    records = {}
    # An owner charges the payout release before its first raw point leaves (and only then).
    payout = owner_payout_epsilon(market.settlement)
    for owner, spend in spends.items():
        if spend is None or spend.unknown:
            return None
        records[owner] = SessionRecord(
            points_read=int(spend.points),
            points_delivered=int(delivered.get(owner, 0)),
            epsilon_session=_priced(spend.epsilon),
            epsilon_payout=payout if spend.points > 0 else 0.0,
        )
    if release is None and market.settlement.rule() is not None:
        if not withheld and any(n > 0 for n in delivered.values()):
            withheld = "the payout release was not made"
        release = silent_release(sorted(records), market.settlement)
    statement = settle(
        market.owner_session,
        market.consumer,
        market.quote,
        market.prices,
        records,
        release,
        withheld=withheld if release is not None else "",
    )
    owners = {}
    for line in statement.lines:
        part = statement.for_owner(line.owner)
        owners[line.owner] = (part.encode(), sign_statement(part, key))
    return SignedSettlement(statement, statement.encode(), sign_statement(statement, key), owners)


def payout_release(
    market: SessionMarket,
    points: NDArray[np.floating],
    owner_ids: Sequence[str],
    validation: NDArray[np.floating],
    gamma: float,
    noise: NoiseSource,
) -> tuple[PayoutRelease, list[Charge]] | None:
    """The session's payout release, when its terms fix one, and what it charges the validation
    set and the owners (each owner charged its own ledger before its first point left; the
    session's ledger records that charge too, so the consumer's report holds every charge).

    Parameters
    ----------
    market : SessionMarket
    points : ndarray of shape (p, n)
        The delivered summary, in the order its points were added, as the session's kernel
        reads them (scaled by its feature scaling,
        :meth:`~dpmarket.curator.summarization.state.SessionState.kernel_points`).
    owner_ids : sequence of str, length p
    validation : ndarray of shape (m, n)
        D_v (it never leaves the curator; only the noisy values do), scaled alike.
    gamma : float
        The session's RBF kernel parameter (in the scaled units).
    noise : NoiseSource
        The session's noise (OpenDP's sampler in production).

    Returns
    -------
    (PayoutRelease, list of Charge) or None
        None without a payout release, or for an empty summary. The charges: one Laplace event
        on ``"validation"`` and one on ``"owners"`` (``epsilon_owner``, the figure every owner
        that released a point charged; none when ``p = 1``), both labelled
        :data:`PAYOUT_CHARGE_LABEL`.

    Notes
    -----
    Calibration and what the release reveals: :mod:`dpmarket.common.market.payouts`. The
    validation party is charged ``epsilon_validation = (2 / m) / b`` (a Laplace event); every
    owner of the quote is in the release, those with no delivered point at exactly 0.
    """
    rule = market.settlement.rule()
    if rule is None or len(owner_ids) == 0:
        return None
    owners = sorted(line.owner for line in market.quote.lines)
    blocks = SummaryBlocks.from_summary(points, list(owner_ids), validation, gamma, owners=owners)
    release = release_payouts(blocks, market.settlement.payout_epsilon, rule, noise)
    events = release.privacy_events()
    charges = [Charge("validation", PAYOUT_CHARGE_LABEL, e) for e in events["validation"]]
    charges += [Charge("owners", PAYOUT_CHARGE_LABEL, e) for e in events["owners"]]
    return release, charges


@dataclass
class RetrySchedule:
    """When each piece of settlement work that failed is due again: exponential backoff per
    piece (``base``, ``2 base``, ``4 base``... at most ``cap`` seconds after its last failure),
    so that an owner down for hours is asked about once every ``cap`` seconds while the others
    are served at once. Kept in memory: a restarted curator tries everything again.

    Attributes
    ----------
    base, cap : float
        Seconds (:data:`SETTLEMENT_RETRY_SECONDS`, :data:`SETTLEMENT_RETRY_CAP_SECONDS`).

    Raises
    ------
    ValueError
        If ``base`` is not > 0 or ``cap`` is below it.
    """

    base: float = SETTLEMENT_RETRY_SECONDS
    cap: float = SETTLEMENT_RETRY_CAP_SECONDS
    _failed: dict[Hashable, tuple[int, float]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.base <= self.cap:
            raise ValueError(f"need 0 < base <= cap seconds, got base {self.base}, cap {self.cap}")

    def due(self, key: Hashable, now: float) -> bool:
        """Whether ``key`` may be tried at ``now`` (never failed, or its wait is over)."""
        failed = self._failed.get(key)
        return failed is None or now >= failed[1]

    def outcome(self, key: Hashable, ok: bool, now: float) -> None:
        """Record a try of ``key`` at ``now``: forgotten if it succeeded, else its wait doubles."""
        if ok:
            self._failed.pop(key, None)
            return
        failures = self._failed.get(key, (0, now))[0] + 1
        # The exponent is bounded: 2 ** n past float's range raised OverflowError after about
        # 1,000 failures (an owner down for hours), and with it every later retry pass.
        wait = self.base * 2.0 ** min(failures - 1, 60)
        self._failed[key] = (failures, now + min(self.cap, wait))

    def keep(self, keys: set[Hashable]) -> None:
        """Forget every key not in ``keys`` (work done elsewhere, or gone)."""
        for key in [k for k in self._failed if k not in keys]:
            del self._failed[key]
