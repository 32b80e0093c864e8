"""What an owner's policy lets a session's terms ask, checked when the session opens.

The ledger (:class:`~dpmarket.owner.ledger.OwnerLedger`) checks what the terms *charge* (epsilon,
delta, non-private); this module checks what the terms' method *asks* of the owner that no
charge covers:

* **Exact bids to the curator** (:func:`check_exact_bids`). The per-round methods (private,
  rounds, greedy) answer every ``Bid`` with the exact score of the owner's best unsent point for
  a direction the curator chooses (the validation and summary embeddings, and h1's parameters,
  all come from the curator). Their terms' epsilon pays for what the curator *releases* (the
  summary embeddings to the owners, the auction's choices, the summary to the consumer), as in
  the paper's Algorithm 3, whose auction trusts the curator with exact bids; it does not pay
  for the bids the curator itself sees. A curator that chooses those directions as probes reads
  exact statistics of the owner's rows at any stated epsilon (a red-team run read every
  column's maximum and minimum with two bids each, a column's distinct values with 3,000 bids,
  under terms of epsilon 1e-9). So an owner serves these methods only if its policy trusts the
  curator with exact bids (``access.allow_exact_bids``, off by default).
* **Rows picked along the curator's direction** (:func:`check_steered_selection`). The
  candidates methods (and their hashes mode) send the rows the owner's local greedy finds most
  relevant to the validation embedding, in h1's features; the curator sends the embedding and
  draws h1's parameters. Each row is charged as a raw point, but its being picked says how it
  compares with every row not sent, and no epsilon charges that: a curator that steers the
  greedy (h1 monotone in one column, one point asked) receives the row with that column's
  largest value. So an owner serves these methods only if its policy trusts the
  curator with relevance-steered selection (``access.allow_steered_selection``, off by
  default); the uniform method, whose rows do not depend on their values, is served either way.
* **A reward's disclosure of the summary's composition** (:func:`check_reward_disclosure`). With
  a consumer's reward, each owner's statement states how many of its points the summary holds,
  a function of the consumer's validation set and of every other owner's points that no epsilon
  charges. So an owner serves terms with a reward only if its policy consents
  (``access.allow_reward_disclosure``, off by default).
* **How many rounds** (:func:`check_rounds`): at most ``session.rounds_per_point`` Bid rounds per
  raw point the session may receive (Notes of :func:`check_rounds`).

A session id reopened is checked too (:func:`check_reopen`): every field of its terms is fixed at
its first open, which the owner records (:func:`opened_terms`).

Every refusal depends only on the terms, the policy and the ledger's public totals (never on the
rows), are raised before anything is computed, and charge nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from dpmarket.common.errors import BudgetRefusedError, FailedPreconditionError
from dpmarket.common.summarization.terms import OwnerTerms
from dpmarket.owner.policy import OwnerPolicy

__all__ = [
    "check_exact_bids",
    "check_reopen",
    "check_reward_disclosure",
    "check_rounds",
    "check_steered_selection",
    "opened_terms",
]


def check_exact_bids(policy: OwnerPolicy, terms: OwnerTerms) -> None:
    """Refuse terms whose method answers the curator with exact bids, unless the policy allows.

    Parameters
    ----------
    policy : OwnerPolicy
        The owner's policy in force.
    terms : OwnerTerms
        The terms a session opens with.

    Raises
    ------
    FailedPreconditionError
        If ``terms.exact_bids`` (private, rounds, greedy) and not ``policy.allow_exact_bids``.
        The text names the method and the policy key; it depends on nothing but the terms and
        the policy, so the curator may pass it on to a consumer.

    Notes
    -----
    What no epsilon covers here is the *curator's* view. A bid is
    ``max_x [gtilde . h1(x) - q/(q+1) g . h1(x)]`` over the owner's unsent points, with ``gtilde``,
    ``g``, ``q`` and h1's ``(omega, phase)`` all chosen by the curator: with h1 monotone in one
    column and ``g`` flipping the sign, two bids are that column's maximum and minimum, exactly;
    with h1 a Fourier basis of a column and ``g`` a Fejer kernel centred at ``t``, a bid is a
    nearest-row probe at ``t``. The owner cannot tell a probe from an honest embedding (both are
    vectors of the session's dimension), so it cannot bound what bids reveal; it can only decide
    whether it trusts the curator with them, as the paper's model does.
    """
    if terms.exact_bids and not policy.allow_exact_bids:
        served = "candidates or uniform" if policy.allow_steered_selection else "uniform"
        raise FailedPreconditionError(
            f"this owner does not serve the {terms.method.value} method: its Bid answers the "
            "curator with the exact score of the owner's best point, which the session's "
            "epsilon does not charge, and this owner's policy does not trust a curator with "
            f"exact bids (access.allow_exact_bids = false). Use the {served} method, or ask "
            "the owner's operator to set access.allow_exact_bids = true"
        )


def check_steered_selection(policy: OwnerPolicy, terms: OwnerTerms) -> None:
    """Refuse terms whose method picks rows along the curator's direction, unless the policy
    allows.

    Parameters
    ----------
    policy : OwnerPolicy
        The owner's policy in force.
    terms : OwnerTerms
        The terms a session opens with.

    Raises
    ------
    FailedPreconditionError
        If ``terms.steered_selection`` (``candidates-counts``, ``candidates-sketch``,
        ``hashes-counts``, ``hashes-sketch``) and not ``policy.allow_steered_selection``. The
        text names the method and the policy key and says what to do; it depends on nothing
        but the terms and the policy, so the curator may pass it on to a consumer. Raised
        before anything is computed on the rows (the relevance count, the local greedy).

    Notes
    -----
    *What the charge does not cover.* The owner's local greedy proposes the rows that score
    highest along the validation embedding ``g`` in h1's features, ``h1(x) . g``; the curator
    sends ``g`` and draws h1's ``(omega, phase)``. With h1 monotone in one column and one point
    asked, the proposal is the row with that column's largest value (another session: the
    smallest), and the curator learns that this row beats every other row on it. The row is
    charged as a raw point, the order it reveals is charged nothing; the owner cannot tell a
    probe from an honest embedding (both are vectors of the session's dimension). What bounds it
    is the point allowance: a session receives at most ``session_points(rows)`` rows
    (``session.points_fraction`` of the table, at most ``session.points``), each with the
    comparison its choice implies.

    *Why the pick is not made private instead.* A private pick (the exponential mechanism, or
    report-noisy-max, per proposed row) must hide the replacement of one row. A row's score
    depends on that row alone, so replacing it can move its score across the whole range of
    scores: the sensitivity ``Delta`` equals the range ``R``. Even at the mechanism's most
    favourable calibration (only one score changes, so row ``i`` is picked with probability
    proportional to ``exp(eps u_i / Delta)``), the most and the least relevant rows differ in
    probability by at most ``exp(eps)``: 2.7 at ``eps = 1`` per pick. Among the 354 rows of a
    digits owner the best row is then picked with probability at most ``2.7 / (2.7 + 353) <
    0.8 %`` (uniform: 0.28 %), and the top tenth of the rows receives at most
    ``0.27 / (0.27 + 0.9) = 23 %`` of the picks (uniform: 10 %). To give the top tenth half of
    the picks takes ``exp(eps) >= 9``, ``eps >= 2.2`` per pick: 22 for the 10 rows an owner's
    share of a small summary takes (basic composition), against the whole session's default
    budget of 2; and honest scores spread over a fraction of ``R`` only (digits, d = 512: an
    owner's 354 rows over half of the range the score takes on the domain ``[0, 1]^64``, their
    middle 80 % over a quarter), which shrinks the gain further. At any useful epsilon the
    private pick is the uniform method at a cost, so the owner decides instead whether it
    trusts its curator with the selection, as with exact bids.
    """
    if terms.steered_selection and not policy.allow_steered_selection:
        raise FailedPreconditionError(
            f"this owner does not serve the {terms.method.value} method: it sends the rows "
            "that score highest along a validation embedding and h1 parameters the curator "
            "chooses, so the choice tells the curator how those rows compare with every row "
            "not sent, which no epsilon charges, and this owner's policy does not trust a "
            "curator with relevance-steered selection (access.allow_steered_selection = "
            "false). Use the uniform method, or ask the owner's operator to set "
            "access.allow_steered_selection = true"
        )


def check_reward_disclosure(policy: OwnerPolicy, terms: OwnerTerms) -> None:
    """Refuse terms that carry a consumer's reward, unless the policy consents to what its
    statements disclose.

    Parameters
    ----------
    policy : OwnerPolicy
        The owner's policy in force.
    terms : OwnerTerms
        The terms a session opens with; their market terms' settlement states the reward rule
        and amount (``reward_rule`` ``"none"``: no reward, nothing to consent to).

    Raises
    ------
    FailedPreconditionError
        If the terms' settlement has a reward rule and not ``policy.allow_reward_disclosure``.
        The text names the rule and the policy key and says what to do; it depends on nothing
        but the terms and the policy (public inputs), so the curator may pass it on to a
        consumer. Raised before anything is read or charged.

    Notes
    -----
    *What a reward discloses.* The reward pays each owner ``j`` on ``n_j``, the count of its
    points the summary holds, and its statement states ``n_j`` exactly (an owner that delivered
    nothing is paid exactly 0). ``n_j`` is a function of the consumer's validation set ``D_v``
    and of the other owners' points, not a DP release: one validation point, or one other
    owner's point, can move up to ``p`` of the summary's points from one owner to another (a
    young against an old validation set: an owner of old patients told 3 against 0). A
    private count is of no use at that sensitivity (``p`` per validation point), so the
    disclosure is made consented instead: every owner of a session receives the same
    settlement terms (the reward rule and amount, recorded when it accepts them and checked
    against its statement, so a reward cannot be added after it opened), and each refuses
    them unless its policy allows; the owners left out hold no point of the summary, so every
    owner whose points can move another's count has consented, and the consumer, whose
    validation set moves them too, asked for the reward.
    """
    market = terms.market
    if market is None or market.settlement.reward_rule == "none":
        return
    if not policy.allow_reward_disclosure:
        raise FailedPreconditionError(
            f"this owner does not serve sessions with a reward (rule "
            f"{market.settlement.reward_rule}): the reward's statement tells each owner exactly "
            "how many of its points the summary holds, which depends on the consumer's "
            "validation set and on every other owner's points and no epsilon charges, and this "
            "owner's policy does not consent to that disclosure (access.allow_reward_disclosure "
            "= false). Request without --reward, or ask the owner's operator to set "
            "access.allow_reward_disclosure = true"
        )


def check_rounds(policy: OwnerPolicy, terms: OwnerTerms, allowance: int) -> None:
    """Refuse terms that ask for more Bid rounds than the policy allows per raw point.

    Parameters
    ----------
    policy : OwnerPolicy
        The owner's policy in force.
    terms : OwnerTerms
        The terms a session opens with; only methods with rounds are checked.
    allowance : int
        The most raw points the session may receive from this owner (its share of the table,
        less what the session id was charged, within what is left of the window's points).

    Raises
    ------
    BudgetRefusedError
        (``FAILED_PRECONDITION``, marked as a budget refusal) if ``terms.max_rounds >
        policy.rounds_per_point * allowance``. The text states the allowance, which depends on
        the window's remaining points: a budget figure, which the curator keeps from consumers.

    Notes
    -----
    A round answers the curator a value computed from the owner's rows (its bid, and how often
    its best point has been best) whether or not a point is released after it, and the terms'
    epsilon does not charge the bids themselves (:func:`check_exact_bids`). Without a bound the
    curator states how many such answers it gets (terms of ``max_rounds = 10**12`` were
    accepted). The owner already chose how many of its rows one session may see exactly, its
    point allowance; a bid is one exact scalar of one row (the best row's score), so at
    ``rounds_per_point = 1`` the curator receives no more exact scalars of the rows than the
    number of rows it may receive (plus which row is best, the order information the candidates
    method leaks too). This does not make the bids private; it bounds them by the quantity the
    owner already set, and it refuses terms of 100,000 or 10**12 rounds. An honest per-round
    session runs at most ``p (tau + 2)`` rounds at every owner
    (:func:`~dpmarket.common.summarization.auction.iteration_limit`) while each owner supplies
    about ``p / K`` points, so at the default an owner serves such a session only when its
    allowance is at least ``p (tau + 2)``; an owner that trusts its curator with more rounds
    raises ``session.rounds_per_point``.
    """
    if not terms.exact_bids:
        return
    limit = policy.rounds_per_point * max(int(allowance), 0)
    if terms.max_rounds > limit:
        raise BudgetRefusedError(
            f"the session's terms ask for up to {terms.max_rounds} Bid rounds, and this owner "
            f"answers at most {policy.rounds_per_point} per raw point the session may receive "
            f"({allowance}): {limit} rounds (session.rounds_per_point). Every round answers a "
            "data-dependent bid, released point or not. Ask for a smaller summary, or the "
            "owner's operator may raise session.rounds_per_point, session.points or "
            "session.points_fraction"
        )


def opened_terms(terms: OwnerTerms, consumer: str) -> dict[str, object]:
    """What a session id's first open fixes besides its quote line (which the owner records
    apart, :meth:`~dpmarket.owner.earnings.Earnings.accept`): its method, epsilon, delta, Bid
    rounds and consumer, as JSON-ready values (epsilon may be ``inf``, which Python's ``json``
    writes and reads back exactly). The terms' description decides nothing and is left out."""
    return {
        "method": terms.method.value,
        "epsilon": float(terms.epsilon),
        "delta": float(terms.delta),
        "max_rounds": int(terms.max_rounds),
        "consumer": consumer,
    }


def check_reopen(session: str, first: Mapping[str, object], now: Mapping[str, object]) -> None:
    """Refuse a session id reopened under terms other than those of its first open.

    Parameters
    ----------
    session : str
        The session id, shortened, for the message.
    first, now : mapping
        :func:`opened_terms` of the first open (as the owner recorded it) and of this open.

    Raises
    ------
    FailedPreconditionError
        If any field differs (another epsilon, delta, method, number of rounds or consumer): a
        session id is one session across its opens, charged and settled under one set of terms,
        and a reopen under another would release under terms its first open never accepted (a
        count at another epsilon under the same quote line, whose statement could not tell
        them apart). The text names every field that differs, with both values (the terms are
        public); raised before anything is read or charged.
    """
    differ = [f"{k} {first.get(k)!r} now {v!r}" for k, v in now.items() if first.get(k) != v]
    if differ:
        raise FailedPreconditionError(
            f"session {session} first opened under other terms ({'; '.join(differ)}): a session "
            "id keeps the terms of its first open; reopen it under those terms, or open a new "
            "session under a new id"
        )
