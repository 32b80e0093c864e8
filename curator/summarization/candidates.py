"""The candidates method and its hashes mode on the curator's side.

Both split a budget of owner points among the owners by a private allocation
(:class:`~dpmarket.curator.summarization.allocation.Allocator`: the owners' published sketches or
their noisy relevance counts) after one private validation embedding. The candidates method then
takes each owner's local greedy proposals and re-ranks them with the exact kernel
(:class:`CandidatesStrategy`); the hashes mode (the less-trusted curator,
:mod:`dpmarket.common.summarization.hashes`) receives only h1 hashes of p proposals under a map the
owners agree on among themselves (:class:`HashesStrategy`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Literal, TypeVar

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import AbortedError, UnavailableError
from dpmarket.common.summarization.candidates import validation_embedding_in_chunks
from dpmarket.common.summarization.hashes import leader_of
from dpmarket.common.summarization.kernels import (
    embedding_greedy,
    exact_kernel_greedy,
    exact_kernel_summary,
    mmd2,
)
from dpmarket.common.summarization.methods import AllocationFields, CandidatesConfig, HashesConfig
from dpmarket.common.summarization.rff import RFFParams, random_fourier_features
from dpmarket.common.summarization.session_ledger import (
    AllocationReport,
    HedgeReport,
    SessionLedger,
    SketchCost,
)
from dpmarket.common.summarization.terms import OwnerTerms
from dpmarket.curator.summarization.allocation import (
    Allocation,
    Allocator,
    CandidateBudget,
    CandidateRequest,
)
from dpmarket.curator.summarization.release import Releases
from dpmarket.curator.summarization.state import SessionState, SummaryState, rows_received
from dpmarket.curator.summarization.strategy import Strategy

__all__ = ["AllocatedStrategy", "CandidatesStrategy", "HashesStrategy"]

A = TypeVar("A", bound=AllocationFields)


class AllocatedStrategy(Strategy[A]):
    """What the candidates method and its hashes mode share: the budget's allocation among the
    owners, chosen once the owners have described themselves, and its report."""

    one_round = True

    def __init__(self, state: SessionState, config: A) -> None:
        super().__init__(state, config)
        self.allocator = Allocator(state, config, Releases(state), self.budget())
        self._allocation: Literal["sketch", "counts"] = "counts"
        self._note = ""
        #: The allocation's report (the ledger's ``candidates``), once allocated.
        self.info: AllocationReport | None = None

    def budget(self) -> CandidateBudget:
        """The most owner points the method reads, and whether it starts with a uniform
        sample."""
        raise NotImplementedError

    def points_bound(self, terms: OwnerTerms) -> int:
        """The whole candidate budget: the allocation may give it all to one owner."""
        return self.allocator.budget.total

    @property
    def allocation(self) -> Literal["sketch", "counts"]:
        """The allocation in effect (decided by :meth:`choose`)."""
        return self._allocation

    def choose(self) -> None:
        """By sketches when asked for and every owner has one, else by noisy counts
        (:meth:`Allocator.choose`)."""
        self._allocation, self._note = self.allocator.choose()

    async def allocate(self, rff: RFFParams) -> Allocation:
        """The validation embedding and every owner's request, by the allocation in effect."""
        embedding = await asyncio.to_thread(
            validation_embedding_in_chunks, self.state.validation, rff
        )
        if self._allocation == "sketch":
            return await self.allocator.by_sketches(embedding)
        return await self.allocator.by_counts(embedding, self._note)

    def ledger(self, ledger: SessionLedger) -> SessionLedger:
        """``ledger`` with the allocation's report and, with the sketch allocation, what the
        sketches cost their owners: charged once, at publication, to each owner's own ledger
        (in-process runs release them without a ledger), not to this session."""
        state = self.state
        sketches = None
        if self._allocation == "sketch":
            names = {state.owner_name(i) for i in range(len(state.slots))}
            sketches = {
                owner: SketchCost(
                    epsilon=sketch.mechanism.epsilon,
                    delta=sketch.mechanism.delta,
                    mechanism=sketch.mechanism.mechanism,
                    frequencies=sketch.feature_map.dimension // 2,
                    sigma=getattr(sketch.feature_map, "sigma", None),
                )
                for owner, sketch in sorted(state.owner_sketches.items())
                if owner in names
            }
        return dataclasses.replace(ledger, candidates=self.info, owner_sketches=sketches)


class CandidatesStrategy(AllocatedStrategy[CandidatesConfig]):
    """The candidates method (:mod:`dpmarket.common.summarization.candidates`): one private
    embedding, a private allocation of the candidate budget after a uniform sample of p points
    (:meth:`Allocator.hedge`), local greedy proposals, exact re-ranking by the trusted curator,
    which returns the uniform sample instead when its own choice is not closer to D_v."""

    def budget(self) -> CandidateBudget:
        """``max(p, floor(c * p))`` with ``c = candidate_multiple``, whatever K; or, with
        ``candidate_fraction`` > 0, growing with K, ``max(p, floor(candidate_fraction * K *
        p))``. At least p, so a single owner can serve a whole summary; it hedges when it holds
        2p."""
        cfg = self.config
        p = cfg.summary_size
        if cfg.candidate_fraction > 0:
            total = max(p, math.floor(cfg.candidate_fraction * len(self.state.slots) * p + 1e-9))
        else:
            total = max(p, math.floor(cfg.candidate_multiple * p + 1e-9))
        return CandidateBudget(total, total >= 2 * p)

    async def run(self, summary: SummaryState, rff: RFFParams) -> None:
        """Allocate, take every owner's proposals, re-rank them.

        Raises
        ------
        AbortedError
            If an owner sends another number of candidates than asked, or points of another
            width, or the owners propose fewer than p candidates.
        """
        state = self.state
        round_start = time.perf_counter()
        requests, g_val, self.info = await self.allocate(rff)
        counts = sorted((r.points for r in requests.values()), reverse=True)
        state.emit("rounds", f"candidate shares: {counts}")
        pool, labels, owner_of, uniform_rows = await self._proposals(requests)
        order = await self._rerank(pool, g_val, uniform_rows, rff)
        for j in order:
            summary.points.append(pool[j])
            summary.labels.append(labels[j])
            summary.owners.append(owner_of[j])
        state.finish_round(1, round_start)
        state.emit("rounds", f"{self.config.summary_size} of {pool.shape[0]} candidates chosen")

    async def _proposals(
        self, requests: dict[int, CandidateRequest]
    ) -> tuple[NDArray[np.float64], list[int | None], list[int], list[int]]:
        """Every owner's candidates: ``(pool, labels, owner of each, rows of the uniform
        sample)``."""
        state = self.state
        p = self.config.summary_size
        proposals = await state.gather(
            list(requests),
            lambda i: state.endpoint(i).propose_candidates(
                state.owner_session_id, requests[i].points, uniform_count=requests[i].uniform
            ),
            stage="candidates",
        )
        state.points_arrived(rows_received(proposals))
        points: list[NDArray[np.float64]] = []
        labels: list[int | None] = []
        owner_of: list[int] = []
        uniform_rows: list[int] = []
        for index in sorted(proposals):
            pts, lbl = proposals[index]
            state.check_points(pts, index)
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
        return pool, labels, owner_of, uniform_rows

    async def _rerank(
        self,
        pool: NDArray[np.float64],
        g_val: NDArray[np.float64],
        uniform_rows: Sequence[int],
        rff: RFFParams,
    ) -> NDArray[np.int64]:
        """The summary's rows of ``pool``, after the last message to any owner: by the
        summary's own MMD² to D_v with the exact kernel (the curator holds D_v), or by the
        private embedding alone. The seed set is not part of the summary the consumer
        receives, so it is not counted."""
        state = self.state
        cfg = self.config
        p = cfg.summary_size
        if cfg.embedding_rerank:
            return await asyncio.to_thread(
                embedding_greedy,
                random_fourier_features(pool, rff),
                g_val,
                np.zeros((0, cfg.rff_dimension)),
                p,
            )
        order = await asyncio.to_thread(
            exact_kernel_summary,
            state.kernel_points(pool),
            state.kernel_validation,
            p,
            cfg.gamma,
        )
        if len(uniform_rows) == p:
            order, hedge = await asyncio.to_thread(self.hedged, pool, order, uniform_rows)
            assert self.info is not None
            self.info = dataclasses.replace(self.info, hedge=hedge)
        return order

    def hedged(
        self, pool: NDArray[np.float64], chosen: NDArray[np.int64], uniform: Sequence[int]
    ) -> tuple[NDArray[np.int64], HedgeReport]:
        """``chosen``, or the uniform sample in the pool (:meth:`Allocator.hedge`) when its MMD²
        to D_v is lower: the summary is never farther from D_v than uniform sampling's with the
        same session seed; and which was kept, for the report (``ledger.candidates.hedge``), as
        the summary itself shows. No statistic of the points not delivered leaves the
        curator."""
        state = self.state
        gamma = self.config.gamma
        sample = np.asarray(uniform, dtype=np.int64)
        points, validation = state.kernel_points(pool), state.kernel_validation
        ours = mmd2(points[chosen], validation, gamma)
        kept: Literal["selection", "uniform sample"] = (
            "uniform sample" if mmd2(points[sample], validation, gamma) < ours else "selection"
        )
        hedge = HedgeReport(uniform_points=int(sample.size), kept=kept)
        if kept == "selection":
            return chosen, hedge
        empty = np.zeros((0, pool.shape[1]))
        order = exact_kernel_greedy(points[sample], validation, empty, sample.size, gamma)
        return sample[order], hedge


class HashesStrategy(AllocatedStrategy[HashesConfig]):
    """The hashes mode (the less-trusted curator, :mod:`dpmarket.common.summarization.hashes`):
    the owners agree on a secret hash map among themselves, the curator relaying their signed
    keys and encrypted envelopes, then send h1 hashes of their proposals under it; the curator
    never receives a raw point, nor the map."""

    def budget(self) -> CandidateBudget:
        """Exactly p, without a uniform sample: the curator cannot re-rank hashes, so the
        proposals are the summary."""
        return CandidateBudget(self.config.summary_size, False)

    async def run(self, summary: SummaryState, rff: RFFParams) -> None:
        """Allocate, agree on the owners' hash key, take their hashes.

        Raises
        ------
        UnavailableError
            If the owner that draws the key cannot.
        AbortedError
            If the owners do not agree on one key, or send hashes of another shape.
        """
        state = self.state
        round_start = time.perf_counter()
        requests, _, self.info = await self.allocate(rff)
        counts = sorted((r.points for r in requests.values()), reverse=True)
        state.emit("rounds", f"candidate shares: {counts}")
        asked, key_id = await self._agree_on_a_key({i: r.points for i, r in requests.items()})
        proposals = await state.gather(
            list(asked),
            lambda i: state.endpoint(i).propose_hashes(
                state.owner_session_id, asked[i], self.config.gamma
            ),
        )
        state.points_arrived(rows_received(proposals))
        for index in sorted(proposals):
            hashes, labels = proposals[index]
            if hashes.ndim != 2 or hashes.shape[1] != self.config.rff_dimension:
                raise AbortedError(
                    f"owner {state.owner_name(index)} sent hashes of shape {hashes.shape}"
                )
            state.points_accessed += hashes.shape[0]
            for row in range(hashes.shape[0]):
                summary.hashes.append(hashes[row])
                summary.labels.append(None if labels is None else int(labels[row]))
                summary.owners.append(index)
        state.summary_size = len(summary.hashes)
        assert self.info is not None
        self.info = dataclasses.replace(self.info, hash_key_id=key_id)
        state.emit("rounds", f"{len(summary.hashes)} hashed summary points received")
        state.finish_round(1, round_start)

    async def _agree_on_a_key(self, requests: dict[int, int]) -> tuple[dict[int, int], str]:
        """The owners' key agreement, relayed: adverts, the leader's envelopes, the followers'
        receipts. Returns the requests of the owners that hold the key, and its id."""
        state = self.state
        adverts = await state.gather(
            state.active(), lambda i: state.endpoint(i).hash_advertise(state.owner_session_id)
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
        return asked, next(iter(ids.values()), "")
