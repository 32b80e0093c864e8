"""Client library of the consumer: submit a validation set, follow progress, get the summary."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import numpy as np
from numpy.typing import NDArray

from common.summarization.summary import ProgressEvent, SummarizationConfig, SummaryResult
from consumer import convert
from dpmarket.serving import GRPC_OPTIONS
from dpmarket.status import error_from_rpc
from dpmarket.v1 import curator_pb2, curator_pb2_grpc


class CuratorClient:
    """Synchronous client of a curator service.

    Parameters
    ----------
    target : str
        ``host:port`` of the curator.
    timeout : float
        Deadline of unary calls, seconds.

    Raises
    ------
    common.errors.DPMarketError
        Every method raises the error matching the curator's status (e.g.
        ``InvalidArgumentError`` for a malformed validation set, ``NotFoundError`` for an unknown
        session, ``UnavailableError`` when the curator cannot be reached).
    """

    def __init__(self, target: str, *, timeout: float = 60.0) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = grpc.insecure_channel(target, options=GRPC_OPTIONS)
        self._stub = curator_pb2_grpc.CuratorServiceStub(self._channel)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> CuratorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_session(
        self,
        config: SummarizationConfig,
        validation: NDArray[np.float64],
        seed_set: NDArray[np.float64],
        *,
        seed: int | None = None,
    ) -> str:
        """Start a session; return its id (CreateSession)."""
        request = convert.create_request_to_proto(config, validation, seed_set, seed)
        try:
            response = self._stub.CreateSession(request, timeout=self.timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, f"curator at {self.target}") from None
        return str(response.session_id)

    def watch(self, session_id: str) -> Iterator[ProgressEvent]:
        """Yield progress events until the session ends (WatchSession)."""
        request = curator_pb2.WatchSessionRequest(session_id=session_id)
        try:
            for message in self._stub.WatchSession(request):
                yield convert.event_from_proto(message)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, f"curator at {self.target}") from None

    def get_summary(self, session_id: str) -> SummaryResult:
        """Return the finished summary (GetSummary)."""
        request = curator_pb2.GetSummaryRequest(session_id=session_id)
        try:
            response = self._stub.GetSummary(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, f"curator at {self.target}") from None
        return convert.result_from_proto(response)

    def summarize(
        self,
        config: SummarizationConfig,
        validation: NDArray[np.float64],
        seed_set: NDArray[np.float64],
        *,
        seed: int | None = None,
        on_progress: Callable[[ProgressEvent], None] | None = None,
    ) -> SummaryResult:
        """Create a session, follow it to the end and return its summary."""
        session_id = self.create_session(config, validation, seed_set, seed=seed)
        for event in self.watch(session_id):
            if on_progress is not None:
                on_progress(event)
        return self.get_summary(session_id)
