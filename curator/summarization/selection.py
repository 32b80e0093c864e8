"""How a session selects the summary's points from the owners.

Uniform sampling (p/K points from every owner), the candidates method (an allocation, local
greedy proposals, exact re-ranking by the curator) and the per-round loop of Algorithm 3 (bids,
PrivAuction, the pool of released points verified against their bids, the pool point added each
round), for the private, greedy and rounds methods.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import AbortedError, UnavailableError
from dpmarket.common.privacy.ledger import Charge
from dpmarket.common.summarization.auction import (
    AuctionParams,
    auction_events,
    choose_owners_to_ask,
    rank_owners,
    repeat_limit,
)
from dpmarket.common.summarization.calibration import session_auction
from dpmarket.common.summarization.endpoints import OwnerBid, ReleasedPoint
from dpmarket.common.summarization.hashes import leader_of
from dpmarket.common.summarization.kernels import (
    bid_direction,
    bid_scores,
    embedding_greedy,
    exact_kernel_greedy,
    exact_kernel_summary,
    marginal_gain_score,
    mmd2,
)
from dpmarket.common.summarization.methods import CandidatesConfig, HashesConfig, RoundsConfig
from dpmarket.common.summarization.rff import RFFParams, random_fourier_features
from dpmarket.curator.summarization.allocation import Allocator, split_evenly
from dpmarket.curator.summarization.release import Releases
from dpmarket.curator.summarization.state import RoundsMode, SessionState, SummaryState

__all__ = ["BID_ATOL", "BID_RTOL", "PoolEntry", "Selection"]

logger = logging.getLogger(__name__)

#: Relative and absolute tolerance when checking a reported bid against the released point
#: (owner and curator compute the same float32 products; only summation order may differ).
BID_RTOL = 1e-4
BID_ATOL = 1e-5


@dataclass
class PoolEntry:
    """A released point the curator verified against its bid, waiting in the pool."""

    point: NDArray[np.float64]
    features: NDArray[np.float32]
    label: int | None
    owner: int


class Selection:
    """The session's selection of summary points, one method per session method.

    Parameters
    ----------
    state : SessionState
    allocator : Allocator
        The candidates method's allocation.
    releases : Releases
        The validation and summary embeddings the per-round loop broadcasts.
    """

    def __init__(self, state: SessionState, allocator: Allocator, releases: Releases) -> None:
        self.state = state
        self.allocator = allocator
        self.releases = releases

    async def uniform(self, summary: SummaryState) -> None:
        """Draw p/K points uniformly from every owner (the paper's uniform sampling baseline)."""
        state = self.state
        round_start = time.perf_counter()
        active = state.active()
        shares = split_evenly(state.config.summary_size, [state.capacity(i) for i in active])
        requests = {i: s for i, s in zip(active, shares, strict=True) if s > 0}
        results = await state.gather(
            list(requests),
            lambda i: state.endpoint(i).sample_uniform(state.owner_session_id, requests[i]),
            stage="sample",
        )
        if len(results) != len(requests):
            raise UnavailableError(
                "uniform sampling lost owners mid-session: " + state.drop_notes()
            )
        for index in sorted(results):
            points, labels = results[index]
            self.check_points(points, index)
            state.points_accessed += points.shape[0]
            for row in range(points.shape[0]):
                summary.points.append(points[row])
                summary.labels.append(None if labels is None else int(labels[row]))
                summary.owners.append(index)
        state.rounds_done = 1
        state.round_seconds.append(time.perf_counter() - round_start)
        state.emit("rounds", "uniform sample received")

    async def candidates(self, summary: SummaryState, rff: RFFParams) -> None:
        """The candidates method (:mod:`dpmarket.common.summarization.candidates`): one private
        embedding,
        a private allocation of the candidate budget (by the owners' sketches or by their noisy
        relevance counts) after a uniform sample of p points (:meth:`Allocator.hedge`), local
        greedy proposals, exact re-ranking by the trusted curator, which returns the uniform
        sample instead when its own choice is not closer to D_v."""
        state = self.state
        cfg = state.config
        assert isinstance(cfg, CandidatesConfig | HashesConfig)
        round_start = time.perf_counter()
        p = cfg.summary_size
        val_features = random_fourier_features(state.validation, rff, dtype=np.float64)
        if state.allocation == "sketch":
            requests, g_val = await self.allocator.by_sketches(val_features)
        else:
            requests, g_val = await self.allocator.by_counts(val_features)
        counts = sorted((r.points for r in requests.values()), reverse=True)
        state.emit("rounds", f"candidate shares: {counts}")
        if isinstance(cfg, HashesConfig):
            await self.hashes(summary, {i: r.points for i, r in requests.items()})
            state.rounds_done = 1
            state.round_seconds.append(time.perf_counter() - round_start)
            return
        proposals = await state.gather(
            list(requests),
            lambda i: state.endpoint(i).propose_candidates(
                state.owner_session_id, requests[i].points, uniform_count=requests[i].uniform
            ),
            stage="candidates",
        )
        points: list[NDArray[np.float64]] = []
        labels: list[int | None] = []
        owner_of: list[int] = []
        uniform_rows: list[int] = []
        for index in sorted(proposals):
            pts, lbl = proposals[index]
            self.check_points(pts, index)
            if pts.shape[0] != requests[index].points:
                raise AbortedError(
                    f"owner {state.owner_name(index)} sent {pts.shape[0]} candidates, "
                    f"not the {requests[index].points} asked for"
                )
            uniform_rows.extend(range(len(owner_of), len(owner_of) + requests[index].uniform))
            state.points_accessed += pts.shape[0]
            points.append(pts)
            labels.extend([None] * pts.shape[0] if lbl is None else [int(v) for v in lbl])
            owner_of.extend([index] * pts.shape[0])
        pool = np.concatenate(points) if points else np.zeros((0, state.validation.shape[1]))
        if pool.shape[0] < p:
            raise AbortedError(
                f"owners proposed {pool.shape[0]} candidates, fewer than p = {p}"
                + state.drop_suffix()
            )
        # Re-ranking, after the last message to any owner: the summary's own MMD² to D_v by the
        # exact kernel (the curator holds D_v), or the private embedding alone. The seed set is
        # not part of the summary the consumer receives, so it is not counted.
        if isinstance(cfg, CandidatesConfig) and cfg.embedding_rerank:
            order = await asyncio.to_thread(
                embedding_greedy,
                random_fourier_features(pool, rff),
                g_val,
                np.zeros((0, cfg.rff_dimension)),
                p,
            )
        else:
            order = await asyncio.to_thread(
                exact_kernel_summary, pool, state.validation, p, cfg.gamma
            )
            if len(uniform_rows) == p:
                order = await asyncio.to_thread(self.hedged, pool, order, uniform_rows)
        for j in order:
            summary.points.append(pool[j])
            summary.labels.append(labels[j])
            summary.owners.append(owner_of[j])
        state.rounds_done = 1
        state.round_seconds.append(time.perf_counter() - round_start)
        state.emit("rounds", f"{p} of {pool.shape[0]} candidates chosen")

    def hedged(
        self, pool: NDArray[np.float64], chosen: NDArray[np.int64], uniform: Sequence[int]
    ) -> NDArray[np.int64]:
        """``chosen``, or the uniform sample in the pool (:meth:`Allocator.hedge`) when its MMD²
        to D_v is lower: the summary is never farther from D_v than uniform sampling's with the
        same session seed. The report says which was kept (``ledger.candidates.hedge``), as the
        summary itself shows; no statistic of the points not delivered leaves the curator."""
        state = self.state
        gamma = state.config.gamma
        sample = np.asarray(uniform, dtype=np.int64)
        ours = mmd2(pool[chosen], state.validation, gamma)
        kept = (
            "uniform sample" if mmd2(pool[sample], state.validation, gamma) < ours else "selection"
        )
        state.candidates_info["hedge"] = {"uniform_points": int(sample.size), "kept": kept}
        if kept == "selection":
            return chosen
        empty = np.zeros((0, pool.shape[1]))
        return sample[
            exact_kernel_greedy(pool[sample], state.validation, empty, sample.size, gamma)
        ]

    async def hashes(self, summary: SummaryState, requests: dict[int, int]) -> None:
        """The hashes mode (the less-trusted curator,
        :mod:`dpmarket.common.summarization.hashes`): the owners agree on a secret hash map among
        themselves, the curator relaying their signed keys and encrypted envelopes, then send h1
        hashes of their proposals under it; the curator never receives a raw point, nor the
        map."""
        state = self.state
        active = state.active()
        adverts = await state.gather(
            active, lambda i: state.endpoint(i).hash_advertise(state.owner_session_id)
        )
        by_name = {state.owner_name(i): a for i, a in adverts.items()}
        for i, advert in adverts.items():
            if advert.owner != state.owner_name(i):
                state.drop(i, f"advertised a hash key as {advert.owner!r}")
                by_name.pop(state.owner_name(i), None)
        state.require_owners()
        names = {state.owner_name(i): i for i in state.active()}
        leader = leader_of(by_name)
        envelopes = await state.gather(
            [names[leader]],
            lambda i: state.endpoint(i).hash_distribute(state.owner_session_id, by_name),
        )
        if names[leader] not in envelopes:
            raise UnavailableError(
                f"owner {leader} could not draw the hash key: " + state.drop_notes()
            )
        sent = envelopes[names[leader]]
        followers = [i for name, i in names.items() if name != leader and name in sent]
        ids = await state.gather(
            followers,
            lambda i: state.endpoint(i).hash_receive(
                state.owner_session_id, by_name, sent[state.owner_name(i)]
            ),
        )
        if len(set(ids.values())) > 1:
            raise AbortedError("the owners did not agree on one hash key")
        asked = {i: c for i, c in requests.items() if i == names[leader] or i in ids}
        proposals = await state.gather(
            list(asked),
            lambda i: state.endpoint(i).propose_hashes(
                state.owner_session_id, asked[i], state.config.gamma
            ),
        )
        for index in sorted(proposals):
            hashes, labels = proposals[index]
            if hashes.ndim != 2 or hashes.shape[1] != state.config.rff_dimension:
                raise AbortedError(
                    f"owner {state.owner_name(index)} sent hashes of shape {hashes.shape}"
                )
            state.points_accessed += hashes.shape[0]
            for row in range(hashes.shape[0]):
                summary.hashes.append(hashes[row])
                summary.labels.append(None if labels is None else int(labels[row]))
                summary.owners.append(index)
        state.summary_size = len(summary.hashes)
        state.candidates_info["hash_key_id"] = next(iter(ids.values()), "")
        state.emit("rounds", f"{len(summary.hashes)} hashed summary points received")

    async def rounds(self, summary: SummaryState, rff: RFFParams, *, mode: RoundsMode) -> None:
        """The per-round loop: Algorithm 3 (``"private"``), non-private greedy on exact mean h1
        embeddings (``"greedy"``), or the rounds method (``"rounds"``: its validation release,
        summary release and pool scoring are the configuration's options)."""
        state = self.state
        cfg = state.config
        p = cfg.summary_size
        val_features = random_fourier_features(state.validation, rff, dtype=np.float64)
        seed_features = random_fourier_features(state.seed_set, rff, dtype=np.float64)
        # Step 3: the validation embedding gtilde.
        g_val = await asyncio.to_thread(self.releases.validation_embedding, val_features, mode)
        state.auction = session_auction(cfg, len(state.slots))
        await state.gather(
            state.active(),
            lambda i: state.endpoint(i).set_validation_embedding(state.owner_session_id, g_val),
        )
        state.require_owners()
        # Running state of the summary S = D_init + acquired points, and its release.
        tracker = self.releases.summary_release(mode, seed_features)
        pool: list[PoolEntry] = []
        # Auction iterations: one per summary point, plus a repeat whenever the pure auction
        # asked nobody and the pool is empty (the tau rule ends a run of repeats within tau).
        iteration = 0
        released_for = 0
        g_sum, q_sent = np.zeros(cfg.rff_dimension), 0
        # The owners' terms state the iterations this allows (iteration_limit): each owner
        # refuses a Bid beyond them.
        max_repeats = repeat_limit(state.auction)
        repeats = 0
        while len(summary.points) < p:
            iteration += 1
            state.iterations = iteration
            round_ = len(summary.points) + 1
            round_start = time.perf_counter()
            # Step 5: the summary embedding g_l (and the summary size the owners are told),
            # released once per summary size: a repeated iteration reuses it.
            if released_for != round_:
                g_sum, q_sent = await asyncio.to_thread(tracker.release, round_)
                released_for = round_
            direction = bid_direction(g_val, g_sum, q_sent)
            # Step 6: concurrent bids.
            active = state.active()
            bids_by_owner = await state.gather(
                active,
                self._bid_call(iteration, g_sum, q_sent),
                stage="bid",
            )
            state.require_owners()
            bids = np.full(len(state.slots), np.nan)
            times_best = np.zeros(len(state.slots), dtype=np.int64)
            for index, bid in bids_by_owner.items():
                if bid is not None:
                    bids[index] = bid.bid
                    times_best[index] = bid.times_best
            # Step 7: PrivAuction (steps 11-16), or the top bidder alone without privacy.
            if np.isnan(bids).all():
                asked = np.zeros(len(state.slots), dtype=bool)
            elif state.auction is not None:
                if iteration == 1:
                    self.charge_auction(state.auction)
                asked = choose_owners_to_ask(bids, times_best, state.auction, state.rng)
            else:
                asked = np.zeros(len(state.slots), dtype=bool)
                asked[int(np.nanargmax(bids))] = True
            rejected_before = state.rejected_points
            released = await state.gather(
                [int(i) for i in np.flatnonzero(asked)],
                self._release_call(iteration),
            )
            self.pool_released(released, bids_by_owner, rff, direction, pool)
            # A point that failed verification drops its owner; if nothing valid came in, ask
            # the remaining bidders in rank order (only ever after an owner broke the protocol).
            rejected = state.rejected_points > rejected_before
            for index in rank_owners(bids) if rejected else []:
                if pool:
                    break
                if asked[index] or not state.slots[index].active:
                    continue
                asked[index] = True
                extra = await state.gather(
                    [int(index)],
                    self._release_call(iteration),
                )
                self.pool_released(extra, bids_by_owner, rff, direction, pool)
            if not pool:
                if np.isnan(bids).all():
                    raise AbortedError(
                        f"round {round_}: no owner has a point left to offer "
                        f"({len(summary.points)} of {p} points collected)" + state.drop_suffix()
                    )
                repeats += 1
                if repeats > max_repeats:
                    raise AbortedError(
                        f"round {round_}: the auction acquired no point in {repeats} iterations"
                        + state.drop_suffix()
                    )
                # The pure auction asked nobody: bid again (the tau rule bounds the repeats).
                state.emit("rounds", f"round {round_}: nobody asked, bidding again")
                continue
            repeats = 0
            # Step 15: add the best pool point. Every message of this round has been sent.
            best = pool.pop(
                await asyncio.to_thread(self.choose_from_pool, pool, direction, summary)
            )
            summary.points.append(best.point)
            summary.labels.append(best.label)
            summary.owners.append(best.owner)
            state.summary_size = len(summary.points)
            new_features = random_fourier_features(best.point[None, :], rff, dtype=np.float64)
            tracker.add(new_features[0], round_)
            state.rounds_done = round_
            state.round_seconds.append(time.perf_counter() - round_start)
            state.emit("rounds", f"round {round_}: {int(asked.sum())} owner(s) asked")

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

    def choose_from_pool(
        self, pool: list[PoolEntry], direction: NDArray[np.float32], summary: SummaryState
    ) -> int:
        """Index of the pool point to add: the largest recomputed bid (step 15), or in the rounds
        method with ``pool_scoring="exact"`` the largest exact marginal gain on D_v and the current
        summary (seed set included), which the trusted curator holds."""
        state = self.state
        cfg = state.config
        if isinstance(cfg, RoundsConfig) and cfg.pool_scoring == "exact":
            current = np.concatenate(
                [
                    state.seed_set,
                    np.reshape(summary.points, (-1, state.seed_set.shape[1])),
                ]
            )
            exact = marginal_gain_score(
                np.stack([e.point for e in pool]), state.validation, current, cfg.gamma
            )
            return int(np.argmax(exact))
        return int(np.argmax(bid_scores(np.stack([e.features for e in pool]), direction)))

    def pool_released(
        self,
        released: dict[int, ReleasedPoint],
        bids: dict[int, OwnerBid | None],
        rff: RFFParams,
        direction: NDArray[np.float32],
        pool: list[PoolEntry],
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
                pool.append(entry)

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

    def check_points(self, points: NDArray[np.float64], index: int) -> None:
        """Abort when owner ``index`` sent points that are not rows of the validation width."""
        state = self.state
        if points.ndim != 2 or points.shape[1] != state.validation.shape[1]:
            raise AbortedError(
                f"owner {state.owner_name(index)} sent points of shape {points.shape}"
            )

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
