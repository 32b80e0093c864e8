"""The owner's client of a curator's sketch catalogue: fetch a spec, send a published sketch.

The channel is mTLS: the owner proves its identity with its certificate (the catalogue takes the
publisher's name from it) and checks the curator's at the handshake. The owner only ever sends
what :class:`dpmarket.owner.sketches.SketchPublisher` charged and stored first.
"""

from __future__ import annotations

from typing import Any

import grpc

from dpmarket.common.sketches.endpoints import SpecStatus
from dpmarket.common.sketches.spec import AnySketch, PublishedSketch, SketchSpec
from dpmarket.runtime import sketch_messages as msg
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.serving import CHANNEL_OPTIONS
from dpmarket.runtime.status import error_from_rpc
from dpmarket.runtime.transport import CONNECT_TIMEOUT_SECONDS, TransportSecurity, connected_channel
from dpmarket.v1 import privacy_pb2, sketch_pb2, sketch_pb2_grpc

__all__ = ["CatalogClient"]


class CatalogClient:
    """Synchronous client of the curator's ``SketchCatalogService``, as an owner.

    Parameters
    ----------
    target : str
        ``host:port`` of the curator.
    security : TransportSecurity
        The owner's mTLS credentials (an owner certificate).
    curator : Identity, optional
        The curator identity the server must prove (default ``curator:curator``).
    timeout : float
        Deadline of every call, seconds.
    connect_timeout : float or None
        The channel must connect within this many seconds, or the constructor raises
        :class:`dpmarket.runtime.transport.ConnectError` saying why; None: no check.

    Raises
    ------
    dpmarket.runtime.transport.ConnectError
        From the constructor, as ``connect_timeout`` says.
    dpmarket.common.errors.DPMarketError
        Every method raises the error matching the curator's status.
    """

    def __init__(
        self,
        target: str,
        security: TransportSecurity,
        *,
        curator: Identity | None = None,
        timeout: float = 60.0,
        connect_timeout: float | None = CONNECT_TIMEOUT_SECONDS,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.identity = curator or Identity("curator", "curator")
        self._channel = connected_channel(
            target,
            security,
            self.identity,
            CHANNEL_OPTIONS,
            connect_timeout=connect_timeout,
            peer="the curator",
        )
        self._stub = sketch_pb2_grpc.SketchCatalogServiceStub(self._channel)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> CatalogClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def curator(self) -> str:
        """The curator identity the server proved, ``"curator:NAME"``."""
        return str(self.identity)

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, f"curator at {self.target}") from None

    def spec_names(self) -> list[str]:
        """The names of the catalogue's specs (ListSketchSpecs)."""
        return [s.name for s in self.catalogue()[0]]

    def catalogue(self) -> tuple[list[SketchSpec], str | None]:
        """The catalogue's specs, each validated, and the spec the curator's summarization
        allocation reads (None: none) (ListSketchSpecs)."""
        response = self._call("ListSketchSpecs", sketch_pb2.ListSketchSpecsRequest())
        specs = [msg.spec_from_proto(s) for s in response.specs]
        return specs, response.allocation_spec or None

    def spec(self, name: str) -> SpecStatus:
        """A spec, this owner's standing under it and the curator's held receipt of this owner
        (GetSketchSpec)."""
        response = self._call("GetSketchSpec", sketch_pb2.GetSketchSpecRequest(name=name))
        return SpecStatus(
            msg.spec_from_proto(response.spec),
            bool(response.published),
            int(response.publications_left),
            response.receipt if response.HasField("receipt") else None,
            response.receipt_certificate or None,
        )

    def publish(
        self, spec: str, sketch: AnySketch, receipt: privacy_pb2.LedgerReceipt | None = None
    ) -> tuple[PublishedSketch, bool]:
        """Send a stored sketch (PublishSketch) with the ledger's receipt after its charge;
        return the catalogue entry and whether the catalogue held it already."""
        request = sketch_pb2.PublishSketchRequest(
            spec=spec, sketch=msg.sketch_to_proto(sketch), receipt=receipt
        )
        response = self._call("PublishSketch", request)
        return msg.published_from_proto(response.published), bool(response.already_published)
