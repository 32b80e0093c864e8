"""Is a service up? One ``grpc.health.v1`` Check over mTLS with the party's own certificate.

The owner's console asks its own service; the curator's console asks each of its owners (their
health service admits any identity of the deployment, at most two calls at once per caller). One
check is one small RPC on a channel kept between pages: the only load a page puts on an owner.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dpmarket.common.errors import DPMarketError
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.transport import TransportSecurity, connected_channel

__all__ = ["Probe", "Prober"]


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


class Prober:
    """Health checks over channels kept open between pages (one TCP and TLS handshake per
    service, not per page; an idle channel sends nothing: no keepalive). A channel whose check
    failed is closed and made anew at the next check.

    Parameters
    ----------
    security : TransportSecurity
        The party's own certificate.
    timeout : float
        Seconds a check (connection included) may take.
    """

    def __init__(self, security: TransportSecurity, timeout: float = 2.0) -> None:
        self.security = security
        self.timeout = timeout
        self._channels: dict[tuple[str, Identity | None], grpc.Channel] = {}
        self._lock = threading.Lock()

    def check(self, target: str, expected: Identity | None, service: str = "") -> Probe:
        """Check ``target``'s health (of ``service``; ``""``: the whole server), proving the
        party's identity and checking that the server is ``expected``; never raises for a
        service that is down."""
        start, at = time.perf_counter(), time.time()
        key = (target, expected)
        with self._lock:
            channel = self._channels.get(key)
        try:
            if channel is None:
                channel = connected_channel(
                    target, self.security, expected, connect_timeout=self.timeout
                )
                with self._lock:
                    self._channels[key] = channel
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self.timeout
            )
        except DPMarketError as exc:
            return Probe(target, "UNREACHABLE", str(exc), time.perf_counter() - start, at)
        except grpc.RpcError as exc:
            self._drop(key)
            detail = f"{exc.code().name}: {exc.details()}"
            return Probe(target, "UNREACHABLE", detail, time.perf_counter() - start, at)
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
        return Probe(target, status, "", time.perf_counter() - start, at)

    def _drop(self, key: tuple[str, Identity | None]) -> None:
        with self._lock:
            channel = self._channels.pop(key, None)
        if channel is not None:
            channel.close()

    def close(self) -> None:
        """Close every channel."""
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()
