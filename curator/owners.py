"""gRPC client of an owner, seen by the curator as a
:class:`common.summarization.endpoints.OwnerEndpoint`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
import numpy as np
from numpy.typing import NDArray

from common.summarization.endpoints import OwnerBid, OwnerInfo, ReleasedPoint
from common.summarization.rff import RFFParams
from curator import convert
from dpmarket.arrays import array_to_proto
from dpmarket.serving import GRPC_OPTIONS
from dpmarket.status import error_from_rpc
from dpmarket.v1 import owner_pb2, owner_pb2_grpc

T = TypeVar("T")

#: Deadline of a round-trip call (bids, releases), seconds.
CALL_DEADLINE_SECONDS = 30.0
#: Deadline of OpenSession, which computes the features of every owned point, seconds.
OPEN_DEADLINE_SECONDS = 300.0


class GrpcOwnerEndpoint:
    """Talks to one owner service over a ``grpc.aio`` channel, with a deadline on every call.

    Parameters
    ----------
    target : str
        ``host:port`` of the owner service.
    """

    def __init__(self, target: str, *, deadline: float = CALL_DEADLINE_SECONDS) -> None:
        self.target = target
        self.deadline = deadline
        self._channel = grpc.aio.insecure_channel(target, options=GRPC_OPTIONS)
        self._stub = owner_pb2_grpc.OwnerServiceStub(self._channel)

    @property
    def name(self) -> str:
        """The owner's address."""
        return self.target

    async def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        try:
            return await make()
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, f"owner at {self.target}") from None

    async def info(self) -> OwnerInfo:
        """GetOwnerInfo."""
        response = await self._call(
            lambda: self._stub.GetOwnerInfo(owner_pb2.GetOwnerInfoRequest(), timeout=self.deadline)
        )
        return convert.info_from_proto(response)

    async def open_session(self, session_id: str, rff: RFFParams, sampling_seed: int) -> int:
        """OpenSession: send h1's frequencies and phases as data."""
        request = owner_pb2.OpenSessionRequest(
            session_id=session_id,
            omega=array_to_proto(rff.omega),
            phase=array_to_proto(rff.phase),
            sampling_seed=sampling_seed,
            gamma=rff.gamma,
        )
        response = await self._call(
            lambda: self._stub.OpenSession(request, timeout=OPEN_DEADLINE_SECONDS)
        )
        return int(response.num_points)

    async def set_validation_embedding(
        self, session_id: str, embedding: NDArray[np.float64]
    ) -> None:
        """SetValidationEmbedding."""
        request = owner_pb2.SetValidationEmbeddingRequest(
            session_id=session_id, validation_embedding=array_to_proto(embedding)
        )
        await self._call(lambda: self._stub.SetValidationEmbedding(request, timeout=self.deadline))

    async def bid(
        self, session_id: str, round_: int, summary_embedding: NDArray[np.float64], q: int
    ) -> OwnerBid | None:
        """Bid."""
        request = owner_pb2.BidRequest(
            session_id=session_id,
            round=round_,
            summary_embedding=array_to_proto(summary_embedding),
            summary_size=q,
        )
        response = await self._call(lambda: self._stub.Bid(request, timeout=self.deadline))
        return convert.bid_from_proto(response)

    async def release_point(self, session_id: str, round_: int) -> ReleasedPoint:
        """ReleasePoint."""
        request = owner_pb2.ReleasePointRequest(session_id=session_id, round=round_)
        response = await self._call(lambda: self._stub.ReleasePoint(request, timeout=self.deadline))
        return convert.released_from_proto(response)

    async def sample_uniform(
        self, session_id: str, count: int
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """SampleUniform."""
        request = owner_pb2.SampleUniformRequest(session_id=session_id, count=count)
        response = await self._call(
            lambda: self._stub.SampleUniform(request, timeout=self.deadline)
        )
        return convert.points_from_proto(response)

    async def count_relevant(self, session_id: str, threshold: float) -> int:
        """CountRelevant."""
        request = owner_pb2.CountRelevantRequest(session_id=session_id, threshold=threshold)
        response = await self._call(
            lambda: self._stub.CountRelevant(request, timeout=self.deadline)
        )
        return int(response.count)

    async def propose_candidates(
        self, session_id: str, count: int
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """ProposeCandidates (the owner runs a local greedy: allow the open-session deadline)."""
        request = owner_pb2.ProposeCandidatesRequest(session_id=session_id, count=count)
        response = await self._call(
            lambda: self._stub.ProposeCandidates(request, timeout=OPEN_DEADLINE_SECONDS)
        )
        return convert.points_from_proto(response)

    async def close_session(self, session_id: str) -> None:
        """CloseSession."""
        request = owner_pb2.CloseSessionRequest(session_id=session_id)
        await self._call(lambda: self._stub.CloseSession(request, timeout=self.deadline))

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(None)
