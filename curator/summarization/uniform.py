"""The uniform method: p/K points drawn uniformly from every owner (the paper's baseline)."""

from __future__ import annotations

import time

from dpmarket.common.errors import UnavailableError
from dpmarket.common.summarization.methods import UniformConfig
from dpmarket.common.summarization.rff import RFFParams
from dpmarket.curator.summarization.allocation import split_evenly
from dpmarket.curator.summarization.state import SummaryState, rows_received
from dpmarket.curator.summarization.strategy import Strategy

__all__ = ["UniformStrategy"]


class UniformStrategy(Strategy[UniformConfig]):
    """Draw p/K points uniformly from every owner, within each owner's capacity
    (:func:`~dpmarket.curator.summarization.allocation.split_evenly`); the owners release raw
    points only (terms ``(0, 0)``)."""

    one_round = True

    async def run(self, summary: SummaryState, rff: RFFParams) -> None:
        """One SampleUniform per owner; the points in the owners' order.

        Raises
        ------
        UnavailableError
            If an owner drops out: the sample would no longer be uniform over the owners.
        AbortedError
            If an owner sends points of another width.
        """
        state = self.state
        round_start = time.perf_counter()
        active = state.active()
        shares = split_evenly(self.config.summary_size, [state.capacity(i) for i in active])
        requests = {i: s for i, s in zip(active, shares, strict=True) if s > 0}
        results = await state.gather(
            list(requests),
            lambda i: state.endpoint(i).sample_uniform(state.owner_session_id, requests[i]),
            stage="sample",
        )
        state.points_arrived(rows_received(results))
        if len(results) != len(requests):
            raise UnavailableError(
                "uniform sampling lost owners mid-session: " + state.drop_notes()
            )
        for index in sorted(results):
            points, labels = results[index]
            state.check_points(points, index)
            state.points_accessed += points.shape[0]
            for row in range(points.shape[0]):
                summary.points.append(points[row])
                summary.labels.append(None if labels is None else int(labels[row]))
                summary.owners.append(index)
        state.finish_round(1, round_start)
        state.emit("rounds", "uniform sample received")
