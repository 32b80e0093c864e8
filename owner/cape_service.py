"""gRPC servicers of an owner's joint-statistics protocols: secure aggregation and CAPE.

Thin adapters like :mod:`dpmarket.owner.service`: every RPC is open to the curators the owner's
policy names (the same :class:`dpmarket.runtime.authz.Authorizer`), converts, and calls
:class:`dpmarket.owner.secagg.SiteRounds` or :class:`dpmarket.owner.cape.CapeSite` in a worker
thread.

Their receive limits (:mod:`dpmarket.runtime.admission`) are sized for jobs and rounds of at most
:data:`MAX_SITES` sites and trainings of at most :data:`MAX_HIDDEN_UNITS` hidden units over the
owner's own columns (:func:`cape_site_limits`, :func:`secure_aggregation_limits`).
"""

from __future__ import annotations

import asyncio
import functools
import logging

from dpmarket.common.ids import short_id
from dpmarket.owner import convert
from dpmarket.owner.cape import CapeSite
from dpmarket.owner.secagg import RoundJobs, SiteRounds
from dpmarket.runtime import cape_messages as msg
from dpmarket.runtime.admission import (
    COLUMN_BYTES,
    DEFAULT_CONCURRENT_CALLS,
    SMALL_REQUEST_BYTES,
    VALUE_BYTES,
    ServiceLimits,
)
from dpmarket.runtime.authz import Authorizer, rpc
from dpmarket.runtime.market import market_terms_from_proto
from dpmarket.v1 import cape_pb2, cape_pb2_grpc, secure_aggregation_pb2, secure_aggregation_pb2_grpc

logger = logging.getLogger(__name__)

#: Sites of a CAPE job or a secure-aggregation round the owner's messages are sized for.
MAX_SITES = 1024
#: Bytes one site may add to a message: its name, two public keys, a signature and its PEM
#: certificate (an advertisement: 1.3 KiB measured, P-256, a 63-character name), a graph nonce, a
#: message of its shares (200 bytes: the advertisement tag and the ciphertext) and two pair tags
#: (2.4 KiB in all; tests/runtime/test_admission.py).
SITE_BYTES = 4 << 10
#: Hidden units of a CAPE training the owner's messages are sized for: the curator's default
#: policy's bound (``train_hidden_units``).
MAX_HIDDEN_UNITS = 256
_ROUND_RPCS = (
    "AdvertiseKeys",
    "RevealNonce",
    "ShareKeys",
    "MaskedInput",
    "ConsistencyCheck",
    "Unmask",
)


def _calls(max_jobs: int | None) -> dict[str, int]:
    """Calls at once: per caller (a curator), four per job the owner keeps open, at least the
    default; in all, twice that (:func:`dpmarket.owner.service.owner_limits`' reasoning)."""
    calls = max(DEFAULT_CONCURRENT_CALLS, 4 * (max_jobs or 0))
    return {"concurrent_calls": 2 * calls, "calls_per_caller": calls}


def secure_aggregation_limits() -> ServiceLimits:
    """SecureAggregationService's receive limits: every round message carries the round's
    sites and, per site, at most its keys, certificate, nonce, ciphertext and tags
    (:data:`MAX_SITES` x :data:`SITE_BYTES` beside the ids and scalars). Calls at once: the
    default, half of them per caller (a curator's CAPE job makes one round call at a time, and
    it runs at most its policy's ``max_running`` jobs, 4 by default)."""
    round_message = SMALL_REQUEST_BYTES + MAX_SITES * SITE_BYTES
    return ServiceLimits(dict.fromkeys(_ROUND_RPCS, round_message))


def cape_site_limits(cape: CapeSite) -> ServiceLimits:
    """CapeSiteService's receive limits, from the owner's columns ``C`` (float64 values):

    * ``OpenCapeJob``: a spec naming at most ``C`` feature columns and a target;
    * ``AttestCapePlan``, ``PlanCapeJob``: the sites, and each site's signed row count and
      certificate (:data:`MAX_SITES` x :data:`SITE_BYTES`);
    * ``ReleaseCape``: the noise total of a statistic of at most ``(C + 2)^2`` values (capeFM's
      packed coefficients ``1 + D + D^2`` with ``D <= C + 1``; a mean's ``C``);
    * ``ReleaseCapeGradient``: the parameters and the noise total, ``P = H (D + 2) + 1`` values
      each with ``D <= C`` and ``H <=`` :data:`MAX_HIDDEN_UNITS`;
    * ``CloseCapeJob``: ids only.
    """
    c = 0 if cape.table is None else len(cape.table.columns)
    parameters = MAX_HIDDEN_UNITS * (c + 2) + 1
    sites = SMALL_REQUEST_BYTES + MAX_SITES * SITE_BYTES
    return ServiceLimits(
        {
            "OpenCapeJob": SMALL_REQUEST_BYTES + (c + 1) * COLUMN_BYTES,
            "AttestCapePlan": sites,
            "PlanCapeJob": sites,
            "ReleaseCape": SMALL_REQUEST_BYTES + VALUE_BYTES * (c + 2) ** 2,
            "ReleaseCapeGradient": SMALL_REQUEST_BYTES + 2 * VALUE_BYTES * parameters,
        },
        **_calls(cape.max_jobs),
    )


class SecureAggregationServicer(secure_aggregation_pb2_grpc.SecureAggregationServiceServicer):
    """The owner as a secure-aggregation site; rounds belong to jobs of the calling curator
    (``jobs``: the owner's CAPE jobs in production)."""

    def __init__(self, rounds: SiteRounds, jobs: RoundJobs, authorizer: Authorizer) -> None:
        self.rounds = rounds
        self.jobs = jobs
        self.authorizer = authorizer

    @functools.cached_property
    def limits(self) -> ServiceLimits:
        """This service's receive limits and calls at once
        (:func:`secure_aggregation_limits`), read by :class:`dpmarket.runtime.admission.Admission`
        when the
        service is first called."""
        return secure_aggregation_limits()

    def _job_of(self, job_id: str, caller: object) -> None:
        """A round may only be run for a job the calling curator opened."""
        self.jobs.check_curator(job_id, str(caller))

    @rpc("curator")
    async def AdvertiseKeys(self, request, context, caller):
        job_id, params = msg.round_from_proto(request.round)
        self._job_of(job_id, caller)
        ad, certificate = await asyncio.to_thread(self.rounds.advertise, job_id, params)
        return secure_aggregation_pb2.AdvertiseKeysResponse(
            advertisement=msg.advertisement_to_proto(ad, certificate)
        )

    @rpc("curator")
    async def RevealNonce(self, request, context, caller):
        job_id, params = msg.round_from_proto(request.round)
        self._job_of(job_id, caller)
        ads, certificates = msg.advertisements_from_proto(request.advertisements)
        nonce = await asyncio.to_thread(
            self.rounds.reveal, job_id, params.round_id, ads, certificates
        )
        return secure_aggregation_pb2.RevealNonceResponse(nonce=nonce)

    @rpc("curator")
    async def ShareKeys(self, request, context, caller):
        job_id, params = msg.round_from_proto(request.round)
        self._job_of(job_id, caller)
        ads, certificates = msg.advertisements_from_proto(request.advertisements)
        nonces = msg.nonces_from_proto(request.nonces) if params.sparse else None
        out = await asyncio.to_thread(
            self.rounds.share, job_id, params.round_id, ads, certificates, nonces
        )
        me = self.jobs.name
        return secure_aggregation_pb2.ShareKeysResponse(
            ciphertexts=msg.ciphertexts_to_proto((me, r, c) for r, c in sorted(out.items()))
        )

    @rpc("curator")
    async def MaskedInput(self, request, context, caller):
        job_id, params = msg.round_from_proto(request.round)
        self._job_of(job_id, caller)
        me = self.jobs.name
        cts = {c.sender: bytes(c.ciphertext) for c in request.ciphertexts if c.recipient == me}
        masked = await asyncio.to_thread(self.rounds.masked, job_id, params.round_id, cts)
        return secure_aggregation_pb2.MaskedInputResponse(
            masked=msg.masked_to_proto(masked.vector),
            acknowledgements=msg.tags_to_proto(
                (me, r, t) for r, t in sorted(masked.acknowledgements.items())
            ),
        )

    @rpc("curator")
    async def ConsistencyCheck(self, request, context, caller):
        job_id, params = msg.round_from_proto(request.round)
        self._job_of(job_id, caller)
        attestation = await asyncio.to_thread(
            self.rounds.check, job_id, params.round_id, list(request.survivors)
        )
        me = self.jobs.name
        return secure_aggregation_pb2.ConsistencyCheckResponse(
            signature=attestation.signature,
            attestations=msg.tags_to_proto((me, r, t) for r, t in sorted(attestation.tags.items())),
        )

    @rpc("curator")
    async def Unmask(self, request, context, caller):
        job_id, params = msg.round_from_proto(request.round)
        self._job_of(job_id, caller)
        if params.sparse:
            me = self.jobs.name
            signatures = msg.tags_from_proto(request.attestations, recipient=me)
            acknowledgements = msg.tags_from_proto(request.acknowledgements, recipient=me)
        else:
            signatures = msg.signatures_from_proto(request.signatures)
            acknowledgements = {}
        response = await asyncio.to_thread(
            self.rounds.unmask,
            job_id,
            params.round_id,
            list(request.survivors),
            list(request.dropped),
            signatures,
            acknowledgements,
        )
        return msg.unmask_to_proto(response)


class CapeSiteServicer(cape_pb2_grpc.CapeSiteServiceServicer):
    """The owner as a CAPE site."""

    def __init__(self, cape: CapeSite, rounds: SiteRounds, authorizer: Authorizer) -> None:
        self.cape = cape
        self.rounds = rounds
        self.authorizer = authorizer

    @functools.cached_property
    def limits(self) -> ServiceLimits:
        """This service's receive limits and calls at once (:func:`cape_site_limits`), read by
        :class:`dpmarket.runtime.admission.Admission` when the service is first called."""
        return cape_site_limits(self.cape)

    @rpc("curator")
    async def OpenCapeJob(self, request, context, caller):
        spec = msg.job_from_proto(request)
        consumer = convert.consumer_from_proto(request.consumer)
        ledger = self.cape.ledger
        if ledger is not None:  # a ledger behind a receipt its owner signed refuses the open
            presented = convert.presented_receipt(request)
            await asyncio.to_thread(
                ledger.check_receipt,
                presented,
                curator=str(caller),
                certificate=request.receipt_certificate or None,
            )
        rows = await asyncio.to_thread(
            self.cape.open,
            request.job_id,
            spec,
            int(request.seed),
            curator=str(caller),
            consumer=consumer,
            market=market_terms_from_proto(request.market) if request.HasField("market") else None,
        )
        logger.info(
            "CAPE job %s opened by %s for %s: %s on %d columns, epsilon=%g, delta=%g",
            short_id(request.job_id),
            caller,
            consumer,
            spec.task,
            len(spec.features),
            spec.epsilon,
            spec.delta,
        )
        return cape_pb2.OpenCapeJobResponse(num_rows=rows, min_colluders=self.cape.min_colluders)

    @rpc("curator")
    async def AttestCapePlan(self, request, context, caller):
        attestation, certificate = await asyncio.to_thread(
            self.cape.attest,
            request.job_id,
            list(request.sites),
            int(request.colluders),
            curator=str(caller),
            first_iteration=int(request.first_iteration),
        )
        return cape_pb2.AttestCapePlanResponse(
            attestation=msg.attestation_to_proto(attestation, certificate)
        )

    @rpc("curator")
    async def PlanCapeJob(self, request, context, caller):
        sites = list(request.sites)
        attestations, certificates = msg.attestations_from_proto(request.attestations)
        plan = await asyncio.to_thread(
            self.cape.plan,
            request.job_id,
            sites,
            int(request.colluders),
            attestations,
            certificates,
            curator=str(caller),
            first_iteration=int(request.first_iteration),
        )
        scale = float(plan.entry_scales(sites.index(self.cape.name)).max())
        return cape_pb2.PlanCapeJobResponse(statistic_length=plan.size, max_noise_scale=scale)

    @rpc("curator")
    async def ReleaseCape(self, request, context, caller):
        total = msg.vector_from_proto(request.noise_total, "noise_total")
        release = await asyncio.to_thread(
            self.cape.release, request.job_id, bytes(request.round_id), total, curator=str(caller)
        )
        logger.info("CAPE job %s: released", short_id(request.job_id))
        return cape_pb2.ReleaseCapeResponse(release=msg.vector_to_proto(release))

    @rpc("curator")
    async def ReleaseCapeGradient(self, request, context, caller):
        parameters = msg.vector_from_proto(request.parameters, "parameters")
        total = msg.vector_from_proto(request.noise_total, "noise_total")
        release = await asyncio.to_thread(
            self.cape.release_gradient,
            request.job_id,
            bytes(request.round_id),
            int(request.iteration),
            parameters,
            total,
            curator=str(caller),
        )
        return cape_pb2.ReleaseCapeGradientResponse(release=msg.vector_to_proto(release))

    @rpc("curator")
    async def CloseCapeJob(self, request, context, caller):
        spent = await asyncio.to_thread(self.cape.close, request.job_id, curator=str(caller))
        self.rounds.forget(request.job_id)
        ledger = self.cape.ledger
        receipt = None if ledger is None else await asyncio.to_thread(ledger.close_receipt)
        logger.info(
            "CAPE job %s closed: spent epsilon=%g, delta=%g",
            short_id(request.job_id),
            spent.epsilon,
            spent.delta,
        )
        return cape_pb2.CloseCapeJobResponse(
            spent=convert.spend_to_proto(spent),
            receipt=receipt,
            receipt_certificate=(ledger.certificate if ledger and receipt else None) or b"",
        )
