"""gRPC servicer of the curator: converts messages and calls a ``SessionManager``."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from common.summarization.endpoints import OwnerEndpoint
from curator import convert
from curator.sessions import SessionManager
from dpmarket.serving import serve_until_signalled, start_server, write_port
from dpmarket.status import grpc_errors, status_for
from dpmarket.v1 import curator_pb2, curator_pb2_grpc

logger = logging.getLogger(__name__)


class CuratorServicer(curator_pb2_grpc.CuratorServiceServicer):
    """Thin adapter over a :class:`SessionManager`."""

    def __init__(self, manager: SessionManager) -> None:
        self.manager = manager

    @grpc_errors
    async def CreateSession(self, request, context):  # type: ignore[no-untyped-def]
        config, validation, seed_set, seed = convert.create_request_from_proto(request)
        session_id = await self.manager.create(config, validation, seed_set, seed)
        return curator_pb2.CreateSessionResponse(session_id=session_id)

    async def WatchSession(self, request, context):  # type: ignore[no-untyped-def]
        try:
            async for event in self.manager.watch(request.session_id):
                yield convert.event_to_proto(event)
        except Exception as exc:
            code = status_for(exc)
            if code is None:
                logger.exception("internal error in WatchSession")
                raise
            await context.abort(code, str(exc))

    @grpc_errors
    async def GetSummary(self, request, context):  # type: ignore[no-untyped-def]
        return convert.result_to_proto(self.manager.result(request.session_id))


async def serve_curator(
    owners: Sequence[OwnerEndpoint],
    address: str,
    *,
    allow_seeded_sessions: bool = False,
    call_timeout: float | None = None,
    port_file: str | None = None,
) -> None:
    """Serve a curator for ``owners`` on ``address`` until SIGTERM/SIGINT."""
    manager = SessionManager(
        owners, allow_seeded_sessions=allow_seeded_sessions, call_timeout=call_timeout
    )
    server, port, _ = await start_server(
        lambda s: curator_pb2_grpc.add_CuratorServiceServicer_to_server(
            CuratorServicer(manager), s
        ),
        curator_pb2.DESCRIPTOR.services_by_name["CuratorService"].full_name,
        address,
    )
    logger.info("curator serving on port %d for %d owner(s)", port, len(owners))
    if port_file:
        write_port(port_file, port)
    await serve_until_signalled(server)
