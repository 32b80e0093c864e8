"""Run summarization sessions in one process (``dpmarket simulate``), on the same protocol code.

The curator's :class:`curator.protocol.SummarizationSession` drives in-process owners through
:class:`owner.local.LocalOwnerEndpoint`; the networked run drives gRPC clients instead. With the
same seed both produce the same summary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from common.privacy.noise import OpenDPNoise
from common.privacy.rng import make_rng
from common.summarization.endpoints import OwnerEndpoint
from common.summarization.summary import SummarizationConfig, SummaryResult
from curator.protocol import ProgressCallback, SummarizationSession
from owner.data import PointSet
from owner.local import LocalOwnerEndpoint
from owner.protocol import Owner


def simulate(
    owners: Sequence[PointSet],
    validation: NDArray[np.float64],
    seed_set: NDArray[np.float64],
    config: SummarizationConfig,
    *,
    seed: int | None,
    owner_ids: Sequence[str] | None = None,
    on_progress: ProgressCallback | None = None,
) -> SummaryResult:
    """Run one session with every owner in this process.

    Parameters
    ----------
    owners : sequence of PointSet
        Each owner's data, shape (n_i, n).
    validation : ndarray of shape (m, n)
    seed_set : ndarray of shape (n0, n)
    config : SummarizationConfig
    seed : int or None
        Session seed (None: cryptographically seeded).
    owner_ids : sequence of str, optional
        Names of the owners (default: each point set's name).

    Raises
    ------
    common.errors.DPMarketError
        As :meth:`SummarizationSession.prepare` and :meth:`SummarizationSession.run`.
    """
    ids = list(owner_ids) if owner_ids is not None else [o.name for o in owners]
    # Unseeded runs draw production randomness everywhere: the owners ignore the curator's seeds.
    seeded = seed is not None
    endpoints = [
        LocalOwnerEndpoint(Owner(i, data, allow_seeded_sessions=seeded))
        for i, data in zip(ids, owners, strict=True)
    ]
    return run_session(endpoints, validation, seed_set, config, seed=seed, on_progress=on_progress)


def run_session(
    endpoints: Sequence[OwnerEndpoint],
    validation: NDArray[np.float64],
    seed_set: NDArray[np.float64],
    config: SummarizationConfig,
    *,
    seed: int | None,
    on_progress: ProgressCallback | None = None,
) -> SummaryResult:
    """Prepare and run one session against given owner endpoints, in a fresh event loop.

    Parameters
    ----------
    endpoints : sequence of OwnerEndpoint
        In-process owners, or wrappers of them (tests record or alter their messages).
    validation, seed_set, config, seed, on_progress
        As :func:`simulate`.

    Raises
    ------
    common.errors.DPMarketError
        As :meth:`SummarizationSession.prepare` and :meth:`SummarizationSession.run`.
    """

    async def run() -> SummaryResult:
        session = SummarizationSession(
            "simulated-session",
            config,
            validation,
            seed_set,
            endpoints,
            make_rng(seed),
            on_progress=on_progress,
            # Seeded runs (tests, evaluation) keep numpy's seeded draws; others use OpenDP.
            noise=None if seed is not None else OpenDPNoise(),
        )
        await session.prepare()
        return await session.run()

    return asyncio.run(run())
