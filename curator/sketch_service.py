"""gRPC servicer of the curator's sketch catalogue: authorizes, converts, calls a SketchCatalog.

Roles per RPC: the configured owners (by certificate name) list and read specs and publish;
consumers (the policy's names, or any the CA certified) list and read specs and read sketches.
An owner never reads the catalogue's sketches (other owners' releases are not its business); a
curator identity is served nothing. The publisher's name is its certificate's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Collection
from typing import TYPE_CHECKING

from dpmarket.common.sketches.marginals import MarginalsMap
from dpmarket.common.sketches.marginals_fit import MAX_FIT_BYTES
from dpmarket.curator.owners import held_receipt
from dpmarket.curator.policy import CuratorPolicy
from dpmarket.curator.sketches import SketchCatalog
from dpmarket.runtime import sketch_messages as msg
from dpmarket.runtime.admission import (
    DEFAULT_CONCURRENT_CALLS,
    SMALL_REQUEST_BYTES,
    VALUE_BYTES,
    ServiceLimits,
)
from dpmarket.runtime.authz import Authorizer, rpc
from dpmarket.runtime.identity import Identity, peer_certificate_pem
from dpmarket.runtime.transport import TransportSecurity
from dpmarket.v1 import sketch_pb2, sketch_pb2_grpc

if TYPE_CHECKING:
    from dpmarket.curator.owners import ReceiptBook

logger = logging.getLogger(__name__)


def catalog_authorizer(
    policy: CuratorPolicy,
    owners: Collection[str],
    security: TransportSecurity,
    insecure_peer: Identity,
) -> Authorizer:
    """Consumers as the curator serves them, and the configured owners by name. With plaintext
    transport every caller is ``insecure_peer`` (a consumer): no owner can be authenticated, so
    nothing can be published (``--insecure`` only)."""
    if security.insecure:
        return Authorizer({"consumer": None}, insecure_peer=insecure_peer)
    return Authorizer({"consumer": policy.consumers or None, "owner": tuple(owners)})


def catalog_limits(catalog: SketchCatalog) -> ServiceLimits:
    """SketchCatalogService's receive limits, from the catalogue's specs.

    ``PublishSketch`` carries one sketch of a spec: its mechanism (the spec's feature map and
    domain again: at most twice the spec's encoding), its noisy sum (the map's dimension ``m``
    values) and, for a marginals sketch, its noisy marginals (``m`` one-way cells and at most
    ``measurements x max_cells`` two-way ones) and the fit its owner may attach (at most
    :data:`~dpmarket.common.sketches.marginals_fit.MAX_FIT_BYTES`, framing included); the
    largest over the specs, beside the ids. The other RPCs carry names only. Calls at once: one
    per configured owner (each publishes on its own schedule, all may at once) beside the
    default.
    """
    largest = 0
    for spec in catalog.specs():
        fmap = spec.feature_map
        values = fmap.dimension
        fit = 0
        if isinstance(fmap, MarginalsMap):
            values += fmap.dimension + fmap.measurements * fmap.max_cells
            fit = MAX_FIT_BYTES
        largest = max(largest, 2 * len(msg.spec_bytes(spec)) + VALUE_BYTES * values + fit)
    owners = 0 if catalog.owners is None else len(catalog.owners)
    return ServiceLimits(
        {"PublishSketch": SMALL_REQUEST_BYTES + largest},
        concurrent_calls=DEFAULT_CONCURRENT_CALLS + owners,
    )


class SketchCatalogServicer(sketch_pb2_grpc.SketchCatalogServiceServicer):
    """Thin adapter over a :class:`SketchCatalog`; reads and writes run in worker threads.

    ``allocation_spec`` (the spec the curator's summarization allocation reads, or None) is
    announced with the list of specs. ``receipts`` (the curator's store) keeps the ledger
    receipt an owner sends with a publication as that owner's last receipt."""

    def __init__(
        self,
        catalog: SketchCatalog,
        authorizer: Authorizer,
        allocation_spec: str | None = None,
        receipts: ReceiptBook | None = None,
    ) -> None:
        self.catalog = catalog
        self.authorizer = authorizer
        self.allocation_spec = allocation_spec
        self.receipts = receipts

    @functools.cached_property
    def limits(self) -> ServiceLimits:
        """This service's receive limits and calls at once (:func:`catalog_limits`), read by
        :class:`dpmarket.runtime.admission.Admission` when the service is first called."""
        return catalog_limits(self.catalog)

    @rpc("owner", "consumer")
    async def ListSketchSpecs(self, request, context, caller):
        specs = [msg.spec_to_proto(s) for s in self.catalog.specs()]
        return sketch_pb2.ListSketchSpecsResponse(
            specs=specs, allocation_spec=self.allocation_spec or ""
        )

    @rpc("owner", "consumer")
    async def GetSketchSpec(self, request, context, caller):
        spec = self.catalog.spec(request.name)
        response = sketch_pb2.GetSketchSpecResponse(spec=msg.spec_to_proto(spec))
        if caller.role == "owner":
            published, left = await asyncio.to_thread(
                self.catalog.status, caller.name, request.name
            )
            response.published, response.publications_left = published, left
            # The caller's held receipt, which it checks before charging a publication (as at
            # a session's open): a ledger restored from an older copy is found before it spends.
            held = await asyncio.to_thread(held_receipt, self.receipts, caller.name)
            if held is not None:
                response.receipt.CopyFrom(held[0])
                response.receipt_certificate = held[1]
        return response

    @rpc("owner")
    async def PublishSketch(self, request, context, caller):
        if self.receipts is not None and request.HasField("receipt"):
            # The owner's receipt after the publication's charge: its last receipt, presented
            # at its next session or job like a session's, unless the one held names the same
            # ledger at a later charge (a restored ledger must not overwrite it). Kept before
            # the catalogue's answer: the owner charged it whatever the catalogue does.
            # With it, the certificate the owner presented in this call's mTLS handshake.
            receipt = request.receipt.SerializeToString()
            await asyncio.to_thread(
                functools.partial(
                    self.receipts.record_owner_receipt,
                    only_later=True,
                    certificate=peer_certificate_pem(context),
                ),
                caller.name,
                receipt,
            )
        sketch = await asyncio.to_thread(msg.sketch_from_proto, request.sketch)
        entry, again = await asyncio.to_thread(
            self.catalog.publish, caller.name, request.spec, sketch
        )
        logger.info(
            "sketch %s by %s %s: epsilon %g, delta %g, noisy count %.1f",
            request.spec,
            caller,
            "received again" if again else "published",
            sketch.mechanism.epsilon,
            sketch.mechanism.delta,
            sketch.noisy_count,
        )
        return sketch_pb2.PublishSketchResponse(
            published=msg.published_to_proto(entry), already_published=again
        )

    @rpc("consumer")
    async def ListSketches(self, request, context, caller):
        owners = list(request.owners) or None
        entries = await asyncio.to_thread(self.catalog.sketches, request.spec, owners)
        return sketch_pb2.ListSketchesResponse(
            sketches=[msg.published_to_proto(e) for e in entries]
        )
