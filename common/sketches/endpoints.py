"""What an owner needs from a sketch catalogue to publish, independent of transport.

Implementations: a gRPC client (``dpmarket.owner.sketch_client.CatalogClient``, the owner's
certificate naming the publisher) and an in-process adapter
(``dpmarket.curator.sketches.SketchCatalog.endpoint``); both raise the errors of
:mod:`dpmarket.common.errors`, a transport failure being
:class:`dpmarket.common.errors.UnavailableError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from dpmarket.common.sketches.spec import AnySketch, PublishedSketch, SketchSpec

__all__ = ["CatalogEndpoint", "LedgerReceiptMessage", "SpecStatus"]

#: An owner's ledger receipt as the services carry it (``dpmarket.v1.privacy_pb2.LedgerReceipt``):
#: opaque here (the kernels use no generated code), read only by the owner's ledger.
LedgerReceiptMessage = Any


@dataclass(frozen=True)
class SpecStatus:
    """A spec as a catalogue serves it to one owner.

    Attributes
    ----------
    spec : SketchSpec
        Validated (its key recomputed from the parameters received).
    published : bool
        Whether the catalogue holds a sketch of this owner under it.
    publications_left : int
        How many more sketches the catalogue accepts from this owner.
    receipt : LedgerReceipt or None
        The curator's held receipt of this owner (its last, as presented at a session's open),
        which the owner checks against its ledger before it charges a publication; None: the
        curator holds none (or keeps no receipts, in process).
    receipt_certificate : bytes or None
        The owner certificate (PEM) the curator keeps with it, which the owner checks
        (:meth:`dpmarket.owner.ledger.OwnerLedger.check_receipt`); None: none.
    """

    spec: SketchSpec
    published: bool
    publications_left: int
    receipt: LedgerReceiptMessage | None = None
    receipt_certificate: bytes | None = None


class CatalogEndpoint(Protocol):
    """A curator's sketch catalogue as one owner sees it."""

    @property
    def curator(self) -> str:
        """The catalogue's curator identity, ``"curator:NAME"`` (recorded in the ledger)."""
        ...

    def spec(self, name: str) -> SpecStatus:
        """A spec, this owner's standing under it and the curator's held receipt of this owner
        (``NotFoundError`` if unknown)."""
        ...

    def publish(
        self, spec: str, sketch: AnySketch, receipt: LedgerReceiptMessage | None = None
    ) -> tuple[PublishedSketch, bool]:
        """Hand over a sketch (already charged and stored by the owner) with the owner's ledger
        receipt signed after its charge (kept by the curator as the owner's last receipt);
        return the catalogue entry and whether the catalogue held this very sketch already."""
        ...
