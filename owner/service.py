"""gRPC servicer of a data owner: converts messages, calls :class:`owner.protocol.Owner`."""

from __future__ import annotations

import asyncio
import logging

from dpmarket.serving import serve_until_signalled, start_server, write_port
from dpmarket.status import grpc_errors
from dpmarket.v1 import owner_pb2, owner_pb2_grpc
from owner import convert
from owner.protocol import Owner

logger = logging.getLogger(__name__)


class OwnerServicer(owner_pb2_grpc.OwnerServiceServicer):
    """Thin adapter: every method converts, calls the owner, converts back."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner

    @grpc_errors
    async def GetOwnerInfo(self, request, context):  # type: ignore[no-untyped-def]
        return convert.info_to_proto(self.owner.info())

    @grpc_errors
    async def OpenSession(self, request, context):  # type: ignore[no-untyped-def]
        rff = convert.rff_from_proto(request.omega, request.phase, request.gamma)
        num_points = await asyncio.to_thread(
            self.owner.open_session, request.session_id, rff, int(request.sampling_seed)
        )
        logger.info(
            "session %s opened: d=%d, gamma=%g, %d points",
            request.session_id,
            rff.d,
            rff.gamma,
            num_points,
        )
        return owner_pb2.OpenSessionResponse(num_points=num_points)

    @grpc_errors
    async def SetValidationEmbedding(self, request, context):  # type: ignore[no-untyped-def]
        session = self.owner.session(request.session_id)
        embedding = convert.vector_from_proto(request.validation_embedding, "validation_embedding")
        session.set_validation_embedding(embedding)
        return owner_pb2.SetValidationEmbeddingResponse()

    @grpc_errors
    async def Bid(self, request, context):  # type: ignore[no-untyped-def]
        session = self.owner.session(request.session_id)
        embedding = convert.vector_from_proto(request.summary_embedding, "summary_embedding")
        bid = session.bid(int(request.round), embedding, int(request.summary_size))
        return convert.bid_to_proto(bid)

    @grpc_errors
    async def ReleasePoint(self, request, context):  # type: ignore[no-untyped-def]
        released = self.owner.release_point(request.session_id, int(request.round))
        logger.debug("session %s round %d: point released", request.session_id, request.round)
        return convert.released_to_proto(released)

    @grpc_errors
    async def SampleUniform(self, request, context):  # type: ignore[no-untyped-def]
        points, labels = self.owner.sample_uniform(request.session_id, int(request.count))
        return convert.points_to_proto(points, labels, owner_pb2.SampleUniformResponse)

    @grpc_errors
    async def CountRelevant(self, request, context):  # type: ignore[no-untyped-def]
        count = self.owner.session(request.session_id).count_relevant(float(request.threshold))
        return owner_pb2.CountRelevantResponse(count=count)

    @grpc_errors
    async def ProposeCandidates(self, request, context):  # type: ignore[no-untyped-def]
        points, labels = await asyncio.to_thread(
            self.owner.propose_candidates, request.session_id, int(request.count)
        )
        logger.info("session %s: %d candidates released", request.session_id, len(points))
        return convert.points_to_proto(points, labels, owner_pb2.ProposeCandidatesResponse)

    @grpc_errors
    async def CloseSession(self, request, context):  # type: ignore[no-untyped-def]
        self.owner.close_session(request.session_id)
        logger.info("session %s closed", request.session_id)
        return owner_pb2.CloseSessionResponse()


async def serve_owner(owner: Owner, address: str, port_file: str | None = None) -> None:
    """Serve ``owner`` on ``address`` until SIGTERM/SIGINT; write the bound port to a file."""
    server, port, _ = await start_server(
        lambda s: owner_pb2_grpc.add_OwnerServiceServicer_to_server(OwnerServicer(owner), s),
        owner_pb2.DESCRIPTOR.services_by_name["OwnerService"].full_name,
        address,
    )
    logger.info("owner %s serving on port %d", owner.owner_id, port)
    if port_file:
        write_port(port_file, port)
    await serve_until_signalled(server)
