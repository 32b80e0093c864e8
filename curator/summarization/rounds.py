"""The methods that run Algorithm 3's rounds: non-private greedy, the private method and the
rounds method.

Every round, the curator broadcasts the running summary's embedding, collects one bid per owner,
asks owners for their best point (PrivAuction, or the top bidder without privacy), verifies each
released point against its bid (step 8), pools the valid ones and adds the best pool point
(step 15). :class:`RoundsLoop` runs that loop once for the three methods; each supplies its
releases (the validation embedding, the summary's), its auction and how it scores the pool.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import AbortedError
from dpmarket.common.privacy.ledger import Charge
from dpmarket.common.summarization.auction import (
    AuctionParams,
    auction_events,
    choose_owners_to_ask,
    parsimony_bound,
    rank_owners,
    repeat_limit,
)
from dpmarket.common.summarization.calibration import (
    paper_auction,
    rounds_auction,
    rounds_tree_sigma,
)
from dpmarket.common.summarization.endpoints import OwnerBid, ReleasedPoint
from dpmarket.common.summarization.kernels import bid_direction, bid_scores, marginal_gain_score
from dpmarket.common.summarization.methods import (
    GreedyConfig,
    PrivateConfig,
    RoundsConfig,
    SummarizationConfig,
)
from dpmarket.common.summarization.rff import RFFParams, random_fourier_features
from dpmarket.common.summarization.session_ledger import AuctionReport, SessionLedger
from dpmarket.curator.summarization.release import (
    ExactSummary,
    MWEMSummary,
    NoSummary,
    Releases,
    SummaryRelease,
    TreeSummary,
)
from dpmarket.curator.summarization.state import SessionState, SummaryState
from dpmarket.curator.summarization.strategy import Strategy

__all__ = [
    "BID_ATOL",
    "BID_RTOL",
    "GreedyStrategy",
    "PoolEntry",
    "PrivateStrategy",
    "RoundsLoop",
    "RoundsStrategy",
]

logger = logging.getLogger(__name__)

#: Relative and absolute tolerance when checking a reported bid against the released point
#: (owner and curator compute the same float32 products; only summation order may differ).
BID_RTOL = 1e-4
BID_ATOL = 1e-5

R = TypeVar("R", bound=SummarizationConfig)


@dataclass
class PoolEntry:
    """A released point the curator verified against its bid, waiting in the pool."""

    point: NDArray[np.float64]
    features: NDArray[np.float32]
    label: int | None
    owner: int


@dataclass
class _Round:
    """One auction iteration: its round, the bid direction, the bids and who was asked."""

    iteration: int
    round: int
    started: float
    direction: NDArray[np.float32]
    bids: dict[int, OwnerBid | None] = field(default_factory=dict)
    values: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    asked: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=bool))


class RoundsLoop(Strategy[R]):
    """Algorithm 3's per-round loop, shared by the methods that bid in rounds.

    A method supplies :meth:`validation_embedding` (step 3), :meth:`summary_release` (step 5),
    :meth:`auction_params` (PrivAuction's, or ``None`` to ask the top bidder) and may override
    :meth:`choose_from_pool` (step 15). Auction iterations: one per summary point, plus a repeat
    whenever the pure auction asked nobody and the pool is empty (the tau rule ends a run of
    repeats within tau); the owners' terms state the iterations this allows
    (:func:`~dpmarket.common.summarization.auction.iteration_limit`) and refuse a Bid beyond.
    """

    def __init__(self, state: SessionState, config: R) -> None:
        super().__init__(state, config)
        self.releases = Releases(state)
        #: PrivAuction's parameters (set when the loop starts), or None without an auction.
        self.auction: AuctionParams | None = None
        #: Auction iterations run so far.
        self.iterations = 0
        self.pool: list[PoolEntry] = []

    # ------------------------------------------------------------------- the method's parts
    def validation_embedding(self, val_features: NDArray[np.floating]) -> NDArray[np.float64]:
        """gtilde (step 3), charged to the validation ledger; ``val_features`` of shape (m, d)."""
        raise NotImplementedError

    def summary_release(self, seed_features: NDArray[np.floating]) -> SummaryRelease:
        """How the running summary embedding reaches the owners each round (step 5)."""
        raise NotImplementedError

    def auction_params(self, n_owners: int) -> AuctionParams | None:
        """PrivAuction's parameters with ``n_owners`` owners; None asks the top bidder."""
        return None

    def choose_from_pool(self, direction: NDArray[np.float32], summary: SummaryState) -> int:
        """Index of the pool point to add: the largest recomputed bid (step 15)."""
        return int(np.argmax(bid_scores(np.stack([e.features for e in self.pool]), direction)))

    # ----------------------------------------------------------------------------- the loop
    async def run(self, summary: SummaryState, rff: RFFParams) -> None:
        """Run rounds until the summary holds p points.

        Raises
        ------
        UnavailableError
            If every owner dropped out.
        AbortedError
            If no owner has a point left, or the auction acquires none in more iterations
            than its repeats allow.
        """
        state = self.state
        p = self.config.summary_size
        val_features = random_fourier_features(state.validation, rff, dtype=np.float64)
        seed_features = random_fourier_features(state.seed_set, rff, dtype=np.float64)
        # Step 3: the validation embedding gtilde.
        g_val = await asyncio.to_thread(self.validation_embedding, val_features)
        self.auction = self.auction_params(len(state.slots))
        await state.gather(
            state.active(),
            lambda i: state.endpoint(i).set_validation_embedding(state.owner_session_id, g_val),
        )
        state.require_owners()
        # Running state of the summary S = D_init + acquired points, and its release.
        tracker = self.summary_release(seed_features)
        released_for = 0
        g_sum, q_sent = np.zeros(self.config.rff_dimension), 0
        max_repeats = repeat_limit(self.auction)
        repeats = 0
        while len(summary.points) < p:
            self.iterations += 1
            round_ = len(summary.points) + 1
            started = time.perf_counter()
            # Step 5: the summary embedding g_l (and the summary size the owners are told),
            # released once per summary size: a repeated iteration reuses it.
            if released_for != round_:
                g_sum, q_sent = await asyncio.to_thread(tracker.release, round_)
                released_for = round_
            this = _Round(self.iterations, round_, started, bid_direction(g_val, g_sum, q_sent))
            await self._bid(this, g_sum, q_sent)
            await self._acquire(this, rff)
            if not self.pool:
                repeats += 1
                self._nobody_asked(this, summary, repeats, max_repeats)
                continue
            repeats = 0
            await self._add_best(this, summary, tracker, rff)

    async def _bid(self, this: _Round, g_sum: NDArray[np.float64], q: int) -> None:
        """Step 6 (concurrent bids) and step 7 (PrivAuction, or the top bidder alone)."""
        state = self.state
        k = len(state.slots)
        this.bids = await state.gather(
            state.active(), self._bid_call(this.iteration, g_sum, q), stage="bid"
        )
        state.require_owners()
        this.values = np.full(k, np.nan)
        times_best = np.zeros(k, dtype=np.int64)
        for index, bid in this.bids.items():
            if bid is not None:
                this.values[index] = bid.bid
                times_best[index] = bid.times_best
        this.asked = np.zeros(k, dtype=bool)
        if np.isnan(this.values).all():
            return
        if self.auction is not None:
            if this.iteration == 1:
                self.charge_auction(self.auction)
            this.asked = choose_owners_to_ask(this.values, times_best, self.auction, state.rng)
        else:
            this.asked[int(np.nanargmax(this.values))] = True

    async def _acquire(self, this: _Round, rff: RFFParams) -> None:
        """Ask the chosen owners for their points and pool the verified ones. A point that
        failed verification drops its owner; if nothing valid came in, ask the remaining
        bidders in rank order (only ever after an owner broke the protocol)."""
        state = self.state
        rejected_before = state.rejected_points
        released = await state.gather(
            [int(i) for i in np.flatnonzero(this.asked)], self._release_call(this.iteration)
        )
        self.pool_released(released, this.bids, rff, this.direction)
        rejected = state.rejected_points > rejected_before
        for index in rank_owners(this.values) if rejected else []:
            if self.pool:
                break
            if this.asked[index] or not state.slots[index].active:
                continue
            this.asked[index] = True
            extra = await state.gather([int(index)], self._release_call(this.iteration))
            self.pool_released(extra, this.bids, rff, this.direction)

    def _nobody_asked(
        self, this: _Round, summary: SummaryState, repeats: int, max_repeats: int
    ) -> None:
        """An iteration that acquired nothing: fail when no owner has a point left or the
        repeats are used up, else bid again (the pure auction asked nobody)."""
        state = self.state
        p = self.config.summary_size
        if np.isnan(this.values).all():
            raise AbortedError(
                f"round {this.round}: no owner has a point left to offer "
                f"({len(summary.points)} of {p} points collected)" + state.drop_suffix()
            )
        if repeats > max_repeats:
            raise AbortedError(
                f"round {this.round}: the auction acquired no point in {repeats} iterations"
                + state.drop_suffix()
            )
        state.emit("rounds", f"round {this.round}: nobody asked, bidding again")

    async def _add_best(
        self, this: _Round, summary: SummaryState, tracker: SummaryRelease, rff: RFFParams
    ) -> None:
        """Step 15: add the best pool point; every message of this round has been sent."""
        state = self.state
        best = self.pool.pop(
            await asyncio.to_thread(self.choose_from_pool, this.direction, summary)
        )
        summary.points.append(best.point)
        summary.labels.append(best.label)
        summary.owners.append(best.owner)
        state.summary_size = len(summary.points)
        new_features = random_fourier_features(best.point[None, :], rff, dtype=np.float64)
        tracker.add(new_features[0], this.round)
        state.finish_round(this.round, this.started)
        state.emit("rounds", f"round {this.round}: {int(this.asked.sum())} owner(s) asked")

    def _bid_call(
        self, iteration: int, g_sum: NDArray[np.float64], q: int
    ) -> Callable[[int], Awaitable[OwnerBid | None]]:
        """The Bid call of one auction iteration, for :meth:`SessionState.gather`."""
        state = self.state

        def call(index: int) -> Awaitable[OwnerBid | None]:
            return state.endpoint(index).bid(state.owner_session_id, iteration, g_sum, q)

        return call

    def _release_call(self, iteration: int) -> Callable[[int], Awaitable[ReleasedPoint]]:
        """The ReleasePoint call of one auction iteration, for :meth:`SessionState.gather`."""
        state = self.state

        def call(index: int) -> Awaitable[ReleasedPoint]:
            return state.endpoint(index).release_point(state.owner_session_id, iteration)

        return call

    # -------------------------------------------------------------------- step 8: the pool
    def pool_released(
        self,
        released: dict[int, ReleasedPoint],
        bids: dict[int, OwnerBid | None],
        rff: RFFParams,
        direction: NDArray[np.float32],
    ) -> None:
        """Verify each released point against its owner's bid; pool the valid ones, drop the
        owners of the others."""
        for index in sorted(released):
            entry = self.verify(released[index], index, bids[index], rff, direction)
            if entry is None:
                self.state.drop(
                    index, "released a point that does not match its bid", "broke the protocol"
                )
            else:
                self.pool.append(entry)

    def verify(
        self,
        released: ReleasedPoint,
        index: int,
        bid: OwnerBid | None,
        rff: RFFParams,
        direction: NDArray[np.float32],
    ) -> PoolEntry | None:
        """Step 8: check a released point against its bid; a mismatch is counted and rejected."""
        state = self.state
        state.points_arrived(1)
        state.points_accessed += 1
        point = released.point
        if point.shape != (state.validation.shape[1],) or not np.isfinite(point).all():
            state.rejected_points += 1
            logger.warning("owner %s released a malformed point", state.owner_name(index))
            return None
        features = random_fourier_features(point[None, :], rff)[0]
        recomputed = float(bid_scores(features[None, :], direction)[0])
        reported = bid.bid if bid is not None else math.nan
        if not math.isclose(recomputed, reported, rel_tol=BID_RTOL, abs_tol=BID_ATOL):
            state.rejected_points += 1
            logger.warning(
                "owner %s: point rejected, bid %.6g does not match its point (%.6g)",
                state.owner_name(index),
                reported,
                recomputed,
            )
            return None
        return PoolEntry(point=point, features=features, label=released.label, owner=index)

    # -------------------------------------------------------------------------- the auction
    def charge_auction(self, params: AuctionParams) -> None:
        """Charge PrivAuction once: at most tau bad iterations (Theorem 6), each pure eps_auc-DP
        (pure variant) or (eps_auc, 1 - exp(-eps_auc))-DP (the printed variant)."""
        self.state.ledgers["owners"].charge(
            [
                Charge(
                    "owners",
                    f"PrivAuction ({params.variant}) winner notification: tau bad iterations",
                    event,
                )
                for event in auction_events(params)
            ]
        )

    def ledger(self, ledger: SessionLedger) -> SessionLedger:
        """``ledger`` with PrivAuction's parameters and iterations (unchanged without an
        auction)."""
        if self.auction is None:
            return ledger
        eps_auc = self.auction.eps_auc
        pure = self.auction.variant == "pure"
        auction = AuctionReport(
            variant=self.auction.variant,
            eps_auc=eps_auc,
            tau=self.auction.tau,
            # The printed auction: "not asked" at rank 1 (probability 0) versus rank 2
            # (1 - e^-eps_auc) has no bounded ratio, so a bad iteration is
            # (eps_auc, 1 - e^-eps_auc)-DP; charged so in the owners' ledger.
            delta_per_bad_iteration=0.0 if pure else -math.expm1(-eps_auc),
            iterations=self.iterations,
        )
        return dataclasses.replace(ledger, auction=auction)

    def paper_bound(self) -> float:
        """Lemma 5's ``p (1/eps_auc + K/tau) + m`` with an auction; 0 without."""
        if self.auction is None:
            return 0.0
        state = self.state
        return float(
            parsimony_bound(
                self.config.summary_size,
                len(state.slots),
                self.auction,
                state.validation.shape[0],
            )
        )


class GreedyStrategy(RoundsLoop[GreedyConfig]):
    """Non-private greedy: exact mean h1 embeddings, the top bidder asked every round."""

    def validation_embedding(self, val_features: NDArray[np.floating]) -> NDArray[np.float64]:
        """The exact mean of h1 over D_v (nothing charged: the method is non-private)."""
        return val_features.mean(axis=0)

    def summary_release(self, seed_features: NDArray[np.floating]) -> SummaryRelease:
        """The summary's exact mean h1 embedding."""
        return ExactSummary(seed_features)


class PrivateStrategy(RoundsLoop[PrivateConfig]):
    """Algorithm 3 as the paper runs it: h2 (MWEM) embeddings of D_v and of the summary,
    PrivAuction at Appendix D's parameters."""

    def validation_embedding(self, val_features: NDArray[np.floating]) -> NDArray[np.float64]:
        """h2(h1(D_v)), T_init iterations at ``epsilon_validation``."""
        return self.releases.mwem_validation_embedding(val_features, self.config)

    def summary_release(self, seed_features: NDArray[np.floating]) -> SummaryRelease:
        """h2 of the summary, warm-started across rounds."""
        return MWEMSummary(self.state, self.config, seed_features, self.releases.charge_mwem)

    def auction_params(self, n_owners: int) -> AuctionParams:
        """Appendix D's at ``(epsilon_auction, delta_owners)``."""
        return paper_auction(self.config, n_owners)


class RoundsStrategy(RoundsLoop[RoundsConfig]):
    """The rounds method: its validation release, summary release and pool scoring are the
    configuration's options."""

    def validation_embedding(self, val_features: NDArray[np.floating]) -> NDArray[np.float64]:
        """The Gaussian mechanism on ``mean h1(D_v)``, or h2 as the paper."""
        if self.config.validation_release == "gaussian":
            return self.releases.gaussian_validation_embedding(val_features, self.config)[0]
        return self.releases.mwem_validation_embedding(val_features, self.config)

    def summary_release(self, seed_features: NDArray[np.floating]) -> SummaryRelease:
        """The binary tree, h2 every round, or nothing."""
        cfg = self.config
        releases: dict[str, Callable[[], SummaryRelease]] = {
            "tree": lambda: TreeSummary(
                self.state, cfg, seed_features, rounds_tree_sigma(cfg, len(self.state.slots))
            ),
            "mwem": lambda: MWEMSummary(self.state, cfg, seed_features, self.releases.charge_mwem),
            "none": lambda: NoSummary(cfg.rff_dimension),
        }
        return releases[cfg.summary_release]()

    def auction_params(self, n_owners: int) -> AuctionParams:
        """:func:`~dpmarket.common.summarization.calibration.rounds_auction`."""
        return rounds_auction(self.config, n_owners)

    def choose_from_pool(self, direction: NDArray[np.float32], summary: SummaryState) -> int:
        """With ``pool_scoring="exact"``: the largest exact marginal gain on D_v and the
        current summary (seed set included), which the trusted curator holds; else the largest
        recomputed bid."""
        if self.config.pool_scoring != "exact":
            return super().choose_from_pool(direction, summary)
        state = self.state
        current = np.concatenate(
            [state.seed_set, np.reshape(summary.points, (-1, state.seed_set.shape[1]))]
        )
        exact = marginal_gain_score(
            state.kernel_points(np.stack([e.point for e in self.pool])),
            state.kernel_validation,
            state.kernel_points(current),
            self.config.gamma,
        )
        return int(np.argmax(exact))
