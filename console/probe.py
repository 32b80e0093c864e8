"""Is a service up? One ``grpc.health.v1`` Check over mTLS with the party's own certificate.

The owner's console asks its own service; the curator's console asks each of its owners (their
health service admits any identity of the deployment, at most two calls at once per caller). One
probe is one small RPC: the only load a page puts on an owner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dpmarket.common.errors import DPMarketError
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.transport import TransportSecurity, connected_channel

__all__ = ["Probe", "probe"]


@dataclass(frozen=True)
class Probe:
    """What one health check found.

    Attributes
    ----------
    target : str
    status : str
        ``SERVING``, ``NOT_SERVING``, ... (the health service's answer), or ``UNREACHABLE``.
    detail : str
        Why it is unreachable ("" otherwise).
    seconds : float
        Round trip of the check (connection included).
    at : float
        Unix time of the check.
    """

    target: str
    status: str
    detail: str
    seconds: float
    at: float

    @property
    def up(self) -> bool:
        return self.status == "SERVING"


def probe(
    target: str, security: TransportSecurity, expected: Identity | None, timeout: float = 2.0
) -> Probe:
    """Check ``target``'s health (service ``""``), proving ``security``'s identity and checking
    that the server is ``expected``; never raises for a service that is down."""
    start, at = time.perf_counter(), time.time()
    try:
        channel = connected_channel(target, security, expected, connect_timeout=timeout)
    except DPMarketError as exc:
        return Probe(target, "UNREACHABLE", str(exc), time.perf_counter() - start, at)
    with channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout
            )
        except grpc.RpcError as exc:
            detail = f"{exc.code().name}: {exc.details()}"
            return Probe(target, "UNREACHABLE", detail, time.perf_counter() - start, at)
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return Probe(target, status, "", time.perf_counter() - start, at)
