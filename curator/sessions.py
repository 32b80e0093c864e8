"""Session registry of the curator service: runs sessions in the background, records progress.

Plain asyncio, no gRPC: the servicer (:mod:`curator.service`) only converts messages.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from common.errors import (
    AbortedError,
    DPMarketError,
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
)
from common.privacy.rng import make_rng
from common.summarization.endpoints import OwnerEndpoint
from common.summarization.summary import ProgressEvent, SummarizationConfig, SummaryResult
from curator.protocol import SummarizationSession

logger = logging.getLogger(__name__)


@dataclass
class _Managed:
    session: SummarizationSession
    events: list[ProgressEvent] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    result: SummaryResult | None = None
    error: str | None = None
    task: asyncio.Task[None] | None = None


class SessionManager:
    """Creates, runs and remembers summarization sessions against a fixed set of owners.

    Parameters
    ----------
    owners : sequence of OwnerEndpoint
    allow_seeded_sessions : bool
        Whether a request may fix the session's random seed (reproducible runs and tests). A
        production curator refuses: a party that knows the seed knows the noise.
    call_timeout : float, optional
        Seconds after which an owner that has not answered a call is dropped.
    """

    def __init__(
        self,
        owners: Sequence[OwnerEndpoint],
        *,
        allow_seeded_sessions: bool = False,
        call_timeout: float | None = None,
    ) -> None:
        self.owners = list(owners)
        self.allow_seeded_sessions = allow_seeded_sessions
        self.call_timeout = call_timeout
        self._sessions: dict[str, _Managed] = {}

    async def create(
        self,
        config: SummarizationConfig,
        validation: NDArray[np.float64],
        seed_set: NDArray[np.float64],
        seed: int | None,
    ) -> str:
        """Validate a request against the owners and start the session in the background.

        Returns
        -------
        str
            The new session id.

        Raises
        ------
        PermissionDeniedError
            If ``seed`` is given and seeded sessions are not allowed.
        InvalidArgumentError, UnavailableError
            From :meth:`SummarizationSession.prepare`; nothing is released or charged.
        """
        if seed is not None and not self.allow_seeded_sessions:
            raise PermissionDeniedError(
                "this curator does not accept seeded sessions (start it with "
                "--allow-seeded-sessions for reproducible runs)"
            )
        session_id = uuid.uuid4().hex
        managed: _Managed | None = None

        def record(event: ProgressEvent) -> None:
            assert managed is not None
            managed.events.append(event)
            asyncio.get_running_loop().create_task(_notify(managed.changed))

        session = SummarizationSession(
            session_id,
            config,
            validation,
            seed_set,
            self.owners,
            make_rng(seed),
            on_progress=record,
            call_timeout=self.call_timeout,
        )
        await session.prepare()
        managed = _Managed(session=session)
        self._sessions[session_id] = managed
        managed.task = asyncio.create_task(self._run(managed))
        logger.info(
            "session %s: %s summary of %d points for %d validation points",
            session_id,
            config.method,
            config.summary_size,
            validation.shape[0],
        )
        return session_id

    async def _run(self, managed: _Managed) -> None:
        try:
            managed.result = await managed.session.run()
        except DPMarketError as exc:
            managed.error = str(exc)
            managed.session.fail(str(exc))
            logger.warning("session %s failed: %s", managed.session.session_id, exc)
        except Exception:
            managed.error = "internal error; see the curator log"
            managed.session.fail(managed.error)
            logger.exception("session %s crashed", managed.session.session_id)

    def _get(self, session_id: str) -> _Managed:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise NotFoundError(f"unknown session {session_id!r}") from None

    async def watch(self, session_id: str) -> AsyncIterator[ProgressEvent]:
        """Yield every progress event of a session, past and future, until it ends.

        Raises
        ------
        NotFoundError
            If the session is unknown.
        """
        managed = self._get(session_id)
        sent = 0
        while True:
            async with managed.changed:
                await managed.changed.wait_for(lambda: len(managed.events) > sent)  # noqa: B023
            while sent < len(managed.events):
                event = managed.events[sent]
                sent += 1
                yield event
                if event.finished:
                    return

    def result(self, session_id: str) -> SummaryResult:
        """Return a finished session's summary.

        Raises
        ------
        NotFoundError
            If the session is unknown.
        FailedPreconditionError
            If it is still running.
        AbortedError
            If it failed; the message says why.
        """
        managed = self._get(session_id)
        if managed.error is not None:
            raise AbortedError(f"session {session_id} failed: {managed.error}")
        if managed.result is None:
            raise FailedPreconditionError(
                f"session {session_id} is still running (round {managed.session.rounds_done})"
            )
        return managed.result


async def _notify(condition: asyncio.Condition) -> None:
    async with condition:
        condition.notify_all()
