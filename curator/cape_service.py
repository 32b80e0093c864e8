"""The curator's CAPE service for consumers: policy, idempotency, durable charges, the servicer.

:class:`CapeJobs` checks a request against the curator's policy (the guarantee to every owner
against ``owners_epsilon`` / ``owners_delta``, the number of columns, a training's
hyper-parameters and work, seeded jobs, the consumer's request rate and the number of jobs
running), runs the job across the owners (:mod:`dpmarket.curator.cape`: a capeFM model, a mean or a
training), records the job, its charge (before any release) and its result in the curator's
store, and answers a retried request as the summarization sessions do
(:meth:`CapeJobs.fit`). :class:`CapeServicer` is the thin gRPC adapter, open to consumers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import Any

import numpy as np

from dpmarket.common import errors
from dpmarket.common.cape.endpoints import CapeSiteEndpoint
from dpmarket.common.cape.spec import AnyCapeSpec, CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.errors import (
    AbortedError,
    DPMarketError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
)
from dpmarket.common.ids import new_session_id, short_id
from dpmarket.common.market.pricing import OwnerPrices, Quote, check_cap
from dpmarket.common.market.statement import NO_SUMMARY, PrivateKey
from dpmarket.common.market.terms import FREE, MarketTerms, cape_quote, quote_to_json
from dpmarket.common.privacy.ledger import UNKNOWN_NOT_RETURNED, SessionSpend
from dpmarket.common.privacy.rng import make_rng
from dpmarket.common.schema import Schema, disagreement
from dpmarket.curator.cape import CapeMeanEstimate, CapeResult, CapeTrainingResult, job_for
from dpmarket.curator.owners import wait_for_owners
from dpmarket.curator.policy import DEFAULT_RANGES, CuratorPolicy, RequestRate
from dpmarket.curator.settlement import SessionMarket, SignedSettlement, settle_session
from dpmarket.curator.store import CAPE_METHOD_PREFIX, CuratorStore
from dpmarket.runtime import cape_messages as msg
from dpmarket.runtime.admission import COLUMN_BYTES, SMALL_REQUEST_BYTES, ServiceLimits
from dpmarket.runtime.authz import Authorizer, rpc, rpc_stream
from dpmarket.runtime.market import quote_to_proto
from dpmarket.runtime.schemas import schema_from_proto
from dpmarket.v1 import cape_pb2, cape_pb2_grpc

logger = logging.getLogger(__name__)

#: Longest accepted idempotency key.
MAX_REQUEST_ID_LENGTH = 128


#: Finished jobs whose progress is kept for a late watcher (the oldest are forgotten first).
MAX_FINISHED_PROGRESS = 1024
#: Seconds a watcher waits for the job it names to start.
WATCH_START_SECONDS = 60.0


@dataclasses.dataclass
class CapeProgress:
    """How far one consumer's CAPE job has come (public: counts only).

    Attributes
    ----------
    done, total : int
        Iterations done and in all (a training's T; 1 for a mean or a regression).
    finished : bool
    message : str
        Why it failed; empty otherwise.
    """

    done: int = 0
    total: int = 1
    finished: bool = False
    message: str = ""
    changed: asyncio.Condition = dataclasses.field(default_factory=asyncio.Condition, repr=False)


class _Refused(Exception):
    """A job that failed before any charge (nothing released): its key is freed."""

    def __init__(self, error: DPMarketError) -> None:
        super().__init__(str(error))
        self.error = error


def _failure(error: str, document: dict[str, Any] | None) -> DPMarketError:
    """The error a stored failure is answered with again: its class (recorded in the document,
    ``AbortedError`` when unknown, e.g. after a restart) and its message."""
    name = (document or {}).get("error_type", "")
    cls = getattr(errors, name, None) if name.endswith("Error") else None
    if not (isinstance(cls, type) and issubclass(cls, DPMarketError)):
        cls = AbortedError
    return cls(error)


class CapeJobs:
    """Runs CAPE jobs for consumers under the curator's policy.

    Parameters
    ----------
    owners : sequence of CapeSiteEndpoint
    policy : CuratorPolicy
    store : CuratorStore or None
        Jobs, charges and results (``None``: memory only).
    rate : RequestRate
        The per-consumer request rate, shared with the summarization sessions.
    call_timeout : float, optional
        Seconds after which an owner that has not answered is dropped.
    signing_key : EC or Ed25519 private key, optional
        The curator's certificate key, which signs a job's statement (None: jobs are quoted and
        capped, but not settled).
    deliver : callable, optional
        ``deliver(job_id)`` delivers each owner its part of a settled job's statement (the
        session manager's :meth:`~dpmarket.curator.sessions.SessionManager.deliver_statements`;
        its background retry delivers what this misses).
    """

    def __init__(
        self,
        owners: Sequence[CapeSiteEndpoint],
        *,
        policy: CuratorPolicy,
        store: CuratorStore | None,
        rate: RequestRate,
        call_timeout: float | None = None,
        signing_key: PrivateKey | None = None,
        deliver: Callable[[str], Coroutine[Any, Any, int]] | None = None,
    ) -> None:
        self.owners = list(owners)
        self.policy = policy
        self.store = store
        self.rate = rate
        self.call_timeout = call_timeout
        self.signing_key = signing_key
        self.deliver = deliver
        self._deliveries: set[asyncio.Task[int]] = set()
        self._running = 0
        self._done: dict[tuple[str, str], tuple[str, dict[str, Any] | DPMarketError]] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._progress: dict[tuple[str, str], CapeProgress] = {}
        self._progress_added = asyncio.Condition()

    async def fit(
        self,
        spec: AnyCapeSpec,
        seed: int | None,
        *,
        consumer: str,
        request_id: str = "",
        request_digest: str = "",
        schema: Schema | None = None,
        min_owners: int = 0,
        max_cost: int | None = None,
    ) -> dict[str, Any]:
        """Run a CAPE job; return its document: ``{"weights", "intercept", "report"}`` (capeFM),
        ``{"mean", "report"}`` (a mean) or ``{"parameters", "report"}`` (a training).

        A retry with the same ``request_id`` and request (as summarization's CreateSession):

        * of a job that succeeded returns its document, charging nothing new;
        * of a job that failed after its charge (the owners may have released) fails again with
          the same error class and message, charging and running nothing;
        * of a job refused before any charge (nothing released: an owner's refusal at open, a
          site count below two) runs afresh — a refusal leaves nothing under its key, as a
          refused CreateSession never stores one;
        * of a job whose result expired fails with ``NotFoundError``, charging nothing.

        With a ``schema`` (the consumer's, from which it took the spec's columns and bounds),
        every owner that answers must declare the same one, checked before anything else.
        The job needs every owner to open it, or ``min_owners`` of them when not 0 (as a
        summarization session's selection).

        The job is priced (:meth:`_quote`): before any owner opens it, the curator quotes it
        from every owner's published prices at the job's epsilon and refuses it above
        ``max_cost`` (micro-credits; None: no cap); each owner opens it with its line of the
        quote, and once it has charged, it is settled from the owners' records (:meth:`_settle`;
        the report's ``"quote"`` and ``"cost"``).

        Raises
        ------
        PermissionDeniedError
            For a seed on a curator that does not allow seeded sessions.
        InvalidArgumentError
            For a guarantee, a number of columns or a training hyper-parameter outside the
            policy, a malformed key, or a key reused with another request.
        ResourceExhaustedError
            Beyond the request rate or the jobs running at once.
        NotFoundError
            For a retry whose result has expired.
        FailedPreconditionError
            If an owner's schema differs from ``schema`` (naming the first column that
            differs); nothing is opened, released or charged. If fewer owners than required
            open the job; nothing is drawn, released or charged. If the quote exceeds
            ``max_cost`` (``CostCapExceededError``); nothing is stored, opened or charged.
        DPMarketError
            As the job's ``run`` (:mod:`dpmarket.curator.cape`): the refusal of an owner that
            refused at open when fewer than required opened it; nothing is released or charged.
        """
        await self._check(spec, seed, schema, min_owners)
        if not request_id:
            try:
                return await self._fit(
                    spec, seed, consumer, None, request_digest, min_owners, max_cost
                )
            except _Refused as refused:
                raise refused.error from None
        if len(request_id) > MAX_REQUEST_ID_LENGTH or not (
            request_id.isascii() and request_id.isprintable()
        ):
            raise InvalidArgumentError(
                f"request_id must be 1 to {MAX_REQUEST_ID_LENGTH} printable ASCII characters"
            )
        key = (consumer, request_id)
        async with self._locks.setdefault(key, asyncio.Lock()):
            done = self._done.get(key) or self._stored(consumer, request_id)
            if done is not None:
                digest, outcome = done
                if digest != request_digest:
                    raise InvalidArgumentError(
                        f"request_id {request_id!r} was already used for another request"
                    )
                if isinstance(outcome, DPMarketError):
                    raise type(outcome)(str(outcome))
                logger.info("CAPE request %r of %s retried: nothing new", request_id, consumer)
                return outcome
            try:
                document = await self._fit(
                    spec, seed, consumer, request_id, request_digest, min_owners, max_cost
                )
            except _Refused as refused:
                raise refused.error from None
            except DPMarketError as exc:  # failed after its charge: the same answer on retry
                self._done[key] = (request_digest, exc)
                raise
            self._done[key] = (request_digest, document)
            return document

    async def quote(
        self,
        spec: AnyCapeSpec,
        seed: int | None,
        *,
        consumer: str,
        schema: Schema | None = None,
        min_owners: int = 0,
        max_cost: int | None = None,
    ) -> Quote:
        """Quote a job without running it: its checks and its quote as :meth:`fit` makes them
        before any owner opens the job. Asks the owners for their prices (and their schemas,
        with ``schema``) only: nothing is opened, released, charged or stored.

        Raises
        ------
        PermissionDeniedError, InvalidArgumentError
            As :meth:`fit`.
        ResourceExhaustedError
            Beyond the consumer's request rate (a quote counts as a request).
        FailedPreconditionError
            If an owner's schema differs from ``schema``, or the quote exceeds ``max_cost``
            (``CostCapExceededError``).
        """
        await self._check(spec, seed, schema, min_owners)
        self.rate.check(consumer)
        quoted, _ = await self._quote(spec, max_cost)
        return quoted

    async def _check(
        self, spec: AnyCapeSpec, seed: int | None, schema: Schema | None, min_owners: int
    ) -> None:
        """What :meth:`fit` and :meth:`quote` check before anything else: the seed, the spec
        and the owner count against the policy, then every answering owner's schema."""
        if seed is not None and not self.policy.allow_seeded_sessions:
            raise PermissionDeniedError(
                "this curator does not accept seeded jobs (start it with --allow-seeded-sessions)"
            )
        self.policy.check_cape(spec)
        if not 0 <= min_owners <= len(self.owners):
            raise InvalidArgumentError(
                f"min_owners={min_owners} is outside [0, {len(self.owners)}], the owners this "
                "curator serves (0: every owner)"
            )
        # An owner restarted a moment ago (or whose last connection failed) is connected before
        # the job asks it anything, within a bounded wait.
        await wait_for_owners(self.owners)
        if schema is not None:
            await self._check_schema(schema)

    def _progress_for(self, consumer: str, request_id: str | None, total: int) -> CapeProgress:
        """A new progress entry for a keyed job (a job without a key has no watcher)."""
        progress = CapeProgress(total=total)
        if request_id is None:
            return progress
        self._progress[(consumer, request_id)] = progress
        finished = [k for k, p in self._progress.items() if p.finished]
        for key in finished[: max(0, len(finished) - MAX_FINISHED_PROGRESS)]:
            del self._progress[key]
        asyncio.get_running_loop().create_task(_notify(self._progress_added))
        return progress

    async def watch(
        self, consumer: str, request_id: str, *, start_timeout: float = WATCH_START_SECONDS
    ) -> AsyncIterator[CapeProgress]:
        """Yield the progress of ``consumer``'s job sent with ``request_id`` at every change,
        until it finishes; wait up to ``start_timeout`` seconds for it to start.

        Raises
        ------
        NotFoundError
            If no job of this consumer under this key starts in time (another consumer's key is
            not found either).
        """
        key = (consumer, request_id)
        try:
            async with self._progress_added:
                await asyncio.wait_for(
                    self._progress_added.wait_for(lambda: key in self._progress), start_timeout
                )
        except TimeoutError:
            raise NotFoundError(f"no CAPE job under request_id {request_id!r}") from None
        progress = self._progress[key]
        seen = -1
        while True:
            async with progress.changed:
                await progress.changed.wait_for(
                    lambda: progress.done != seen or progress.finished  # noqa: B023
                )
            seen = progress.done
            yield progress
            if progress.finished:
                return

    async def _check_schema(self, schema: Schema) -> None:
        """Refuse a consumer schema that an answering owner does not declare (an owner that
        does not answer is left to the job, which drops it)."""
        answers = await asyncio.gather(
            *(owner.schema() for owner in self.owners), return_exceptions=True
        )
        schemas = {
            owner.name: answer
            for owner, answer in zip(self.owners, answers, strict=True)
            if not isinstance(answer, BaseException)
        }
        found = disagreement(schema, schemas)
        if found is not None:
            raise FailedPreconditionError(f"the schemas differ: {found}")

    def _stored(
        self, consumer: str, request_id: str
    ) -> tuple[str, dict[str, Any] | DPMarketError] | None:
        """What the store holds under a key, with the digest of the request that used it: a
        document, a failure to answer again, or nothing (no job, or a job refused before any
        charge, whose key is freed here whatever request comes now: a refused summarization
        request stores no key either)."""
        if self.store is None:
            return None
        row = self.store.find_request(consumer, request_id)
        if row is None:
            return None
        digest = row.request_digest  # the caller refuses the key for another request
        if row.status == "done":
            document = self.store.document(row.id)
            if document is None:
                return digest, NotFoundError(
                    f"the result of request_id {request_id!r} (job {short_id(row.id)}) has "
                    "expired; nothing was charged again (send a new request_id to run it anew)"
                )
            return digest, document
        failure = self.store.failure(row.id)
        if failure is None:  # running: only while this curator restarts
            return digest, AbortedError(f"job {short_id(row.id)} of this request is running")
        if not self.store.charges(row.id):  # refused before any release: run it afresh
            self.store.forget_request(row.id)
            return None
        return digest, _failure(*failure)

    def _admit(self, consumer: str) -> None:
        """Refuse a job over ``consumer``'s rate or over the curator's running jobs.

        Raises
        ------
        ResourceExhaustedError
            When the consumer's rate limit or the policy's ``max_running`` is reached.
        """
        self.rate.check(consumer)
        if self._running >= self.policy.max_running:
            raise ResourceExhaustedError(
                f"this curator runs at most {self.policy.max_running} CAPE jobs at once; "
                "retry later"
            )

    async def _fit(
        self,
        spec: AnyCapeSpec,
        seed: int | None,
        consumer: str,
        request_id: str | None,
        digest: str,
        min_owners: int = 0,
        max_cost: int | None = None,
    ) -> dict[str, Any]:
        self._admit(consumer)
        try:
            quoted, prices = await self._quote(spec, max_cost)
        except DPMarketError as exc:  # refused before anything: nothing kept under its key
            raise _Refused(exc) from exc
        job_id = new_session_id()
        store = self.store
        market = SessionMarket(job_id, consumer, quoted, prices, NO_SUMMARY)
        charged = False

        def on_charge(charges: Sequence[Any]) -> None:
            nonlocal charged
            if store is not None:  # with the market: from now on the job is settled, surely
                store.record_charges(job_id, charges, market=market)
            charged = True

        if store is not None:
            _record_start(store, job_id, spec, consumer, request_id, digest, sorted(prices))
        progress = self._progress_for(
            consumer, request_id, spec.iterations if isinstance(spec, CapeTrainingSpec) else 1
        )

        def on_progress(done: int, total: int) -> None:
            progress.done, progress.total = done, total
            asyncio.get_running_loop().create_task(_notify(progress.changed))

        job = job_for(
            job_id,
            spec,
            self.owners,
            make_rng(seed),
            consumer=consumer,
            call_timeout=self.call_timeout,
            on_charge=on_charge,
            on_progress=on_progress,
            min_sites=min_owners or len(self.owners),
            market={o: MarketTerms.of(quoted, o, NO_SUMMARY) for o in prices},
        )
        self._running += 1
        try:
            result = await job.run()
        except BaseException as exc:
            progress.finished, progress.message = True, str(exc)
            await _notify(progress.changed)
            if not isinstance(exc, DPMarketError):
                raise
            logger.warning("CAPE job %s failed: %s", short_id(job_id), exc)
            self._failed(market, job.owner_spend, exc, charged, request_id is not None)
            if not charged:
                raise _Refused(exc) from exc
            raise
        finally:
            self._running -= 1
        document = self._finished(market, job.owner_spend, result)
        progress.finished = True
        await _notify(progress.changed)
        sites = len(result.report["sites"])
        logger.info(
            "CAPE job %s for %s: %s over %d sites", short_id(job_id), consumer, spec.task, sites
        )
        return document

    def _finished(
        self,
        market: SessionMarket,
        spend: Mapping[str, SessionSpend],
        result: CapeResult | CapeMeanEstimate | CapeTrainingResult,
    ) -> dict[str, Any]:
        """Record a job that succeeded: its owners' records, then its document and its statement
        in one transaction (so no curator stop leaves it done and unsettled); deliver each owner
        its part. Return the document (its report's ``"quote"`` and ``"cost"`` set)."""
        job_id = market.owner_session
        document = _result_document(result, spend)
        document["report"]["quote"] = quote_to_json(market.quote)
        settled = None
        if self.store is not None:
            self._record_spend(market, spend)
            settled = self._settle(market)
        document["report"]["cost"] = None if settled is None else settled.statement.total
        if self.store is not None:
            ttl = self.policy.result_ttl_seconds
            self.store.finish_document(job_id, document, ttl=ttl, settlement=settled)
        self._deliver(settled)
        return document

    def _failed(
        self,
        market: SessionMarket,
        spend: Mapping[str, SessionSpend],
        exc: DPMarketError,
        charged: bool,
        keyed: bool,
    ) -> None:
        """Record a job that failed: its owners' records, then its error and, when it charged
        (the owners are paid for what they released), its statement in one transaction; its
        idempotency key (``keyed``) is freed when it charged nothing. Deliver each owner its
        part."""
        if self.store is None:
            return
        self._record_spend(market, spend)
        settled = self._settle(market) if charged else None
        _record_failure(
            self.store,
            market.owner_session,
            spend,
            exc,
            ttl=self.policy.result_ttl_seconds,
            forget_request=keyed and not charged,
            settlement=settled,
        )
        self._deliver(settled)

    def _record_spend(self, market: SessionMarket, spend: Mapping[str, SessionSpend]) -> None:
        """Store what each quoted owner's ledger recorded for the job (an owner that returned
        no record is marked so: the background retry asks it, CloseCapeJob, until it answers)."""
        assert self.store is not None
        for owner in sorted(market.prices):
            got = spend.get(owner) or SessionSpend.unknown_because(UNKNOWN_NOT_RETURNED)
            self.store.record_owner_spend(market.owner_session, owner, got)

    async def _quote(
        self, spec: AnyCapeSpec, max_cost: int | None
    ) -> tuple[Quote, dict[str, OwnerPrices]]:
        """The job's quote from the published prices of every owner that answers (an owner that
        does not is not quoted: if it has prices it refuses the job at open, charging nothing),
        and the prices; refused above ``max_cost`` before any owner opens the job.

        Raises
        ------
        CostCapExceededError
            (``FAILED_PRECONDITION``) If the quote exceeds ``max_cost``.
        """

        async def prices_of(owner: CapeSiteEndpoint) -> OwnerPrices:
            ask = getattr(owner, "prices", None)
            return FREE if ask is None else await ask()

        answers = await asyncio.gather(*(prices_of(o) for o in self.owners), return_exceptions=True)
        prices = {
            o.name: a
            for o, a in zip(self.owners, answers, strict=True)
            if isinstance(a, OwnerPrices)
        }
        quoted = cape_quote(prices, spec.cost[0])
        check_cap(quoted, max_cost)
        return quoted, prices

    def _settle(self, market: SessionMarket) -> SignedSettlement | None:
        """The job's signed statement from its owners' stored records (as a session that
        delivered no point: :func:`~dpmarket.curator.settlement.settle_session`), or None (no
        store or key, or an owner's record unknown: the job is settled by the session manager's
        background retry once its records are known,
        :meth:`~dpmarket.curator.sessions.SessionManager.retry_settlement`). Never raises."""
        if self.store is None or self.signing_key is None:
            return None
        job_id = market.owner_session
        try:
            spends = self.store.owner_spend(job_id)
            settled = settle_session(market, spends, {}, self.signing_key)
        except Exception:
            logger.exception("CAPE job %s: settling it failed", short_id(job_id))
            return None
        if settled is None:
            logger.warning(
                "CAPE job %s: an owner's record is unknown: settled later", short_id(job_id)
            )
        return settled

    def _deliver(self, settled: SignedSettlement | None) -> None:
        """Deliver each owner its part of a stored statement, off the consumer's path."""
        if settled is None or self.deliver is None:
            return
        task = asyncio.get_running_loop().create_task(
            self.deliver(settled.statement.header.session_id)
        )
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)


def _record_start(
    store: CuratorStore,
    job_id: str,
    spec: AnyCapeSpec,
    consumer: str,
    request_id: str | None,
    digest: str,
    owners: Sequence[str],
) -> None:
    """Record a job as running in the store, under the consumer's request id and digest (what
    a repeated request is matched against), with its spec as the session's config, and the
    quoted ``owners`` it opens at (a restarted curator asks them what they charged it)."""
    store.create(
        job_id,
        consumer=consumer,
        request_id=request_id,
        request_digest=digest,
        method=f"{CAPE_METHOD_PREFIX}{spec.task}",
        config=dataclasses.asdict(spec),
    )
    store.owners_opened(job_id, job_id, owners)


def _result_document(
    result: CapeResult | CapeMeanEstimate | CapeTrainingResult, owner_spend: Mapping[str, Any]
) -> dict[str, Any]:
    """A finished job's stored document: its report (with what each owner spent) and its
    estimate (``weights`` and ``intercept``, ``mean`` or ``parameters``, as lists)."""
    report = {
        **result.report,
        "owner_spend": {n: dataclasses.asdict(s) for n, s in owner_spend.items()},
    }
    document: dict[str, Any] = {"report": report}
    if isinstance(result, CapeResult):
        document["weights"] = result.weights.tolist()
        document["intercept"] = result.intercept
    elif isinstance(result, CapeMeanEstimate):
        document["mean"] = result.mean.tolist()
    else:
        assert isinstance(result, CapeTrainingResult)
        document["parameters"] = result.parameters.tolist()
    return document


def _record_failure(
    store: CuratorStore,
    job_id: str,
    owner_spend: Mapping[str, Any],
    exc: BaseException,
    *,
    ttl: float,
    forget_request: bool,
    settlement: SignedSettlement | None = None,
) -> None:
    """Store a failed job's error and what each owner spent, with its settlement in the same
    transaction; forget its idempotency key when nothing was charged (a retry under the same
    key runs afresh)."""
    spend = {n: dataclasses.asdict(s) for n, s in owner_spend.items()}
    failed = {"owner_spend": spend, "error_type": type(exc).__name__}
    store.fail_document(job_id, str(exc), failed, ttl=ttl, settlement=settlement)
    if forget_request:
        store.forget_request(job_id)


def request_digest(request: Any) -> str:
    """SHA-256 of a CapeService request (its type's full name, then its deterministic bytes)
    without its idempotency key: the same key reused for another RPC is another request."""
    copy = type(request)()
    copy.CopyFrom(request)
    copy.request_id = ""
    body = copy.SerializeToString(deterministic=True)
    return hashlib.sha256(request.DESCRIPTOR.full_name.encode() + b"\0" + body).hexdigest()


def cape_limits(policy: CuratorPolicy) -> ServiceLimits:
    """CapeService's receive limits, from the curator's policy: ``FitCape``,
    ``EstimateCapeMean`` and ``TrainCape`` carry a spec naming at most the policy's
    ``cape_columns`` bound of columns and a schema of as many
    (:data:`~dpmarket.runtime.admission.COLUMN_BYTES` each, twice), ``WatchCapeJob`` a request
    id; ``QuoteCape`` one of those three jobs."""
    columns = int(policy.ranges.get("cape_columns", DEFAULT_RANGES["cape_columns"])[1])
    job = SMALL_REQUEST_BYTES + 2 * (columns + 1) * COLUMN_BYTES
    return ServiceLimits(
        {"FitCape": job, "EstimateCapeMean": job, "TrainCape": job, "QuoteCape": job}
    )


class CapeServicer(cape_pb2_grpc.CapeServiceServicer):
    """Thin adapter over :class:`CapeJobs`, open to consumers."""

    def __init__(self, jobs: CapeJobs, authorizer: Authorizer) -> None:
        self.jobs = jobs
        self.authorizer = authorizer

    @functools.cached_property
    def limits(self) -> ServiceLimits:
        """This service's receive limits and calls at once (:func:`cape_limits`), read by
        :class:`dpmarket.runtime.admission.Admission` when the service is first called."""
        return cape_limits(self.jobs.policy)

    async def _run(self, request: Any, spec: AnyCapeSpec, caller: object) -> dict[str, Any]:
        seed = int(request.seed) if request.HasField("seed") else None
        return await self.jobs.fit(
            spec,
            seed,
            consumer=str(caller),
            request_id=request.request_id,
            request_digest=request_digest(request),
            schema=schema_from_proto(request.schema, "the consumer"),
            min_owners=int(request.min_owners),
            max_cost=_max_cost(request),
        )

    @rpc("consumer")
    async def FitCape(self, request, context, caller):
        document = await self._run(request, _fit_spec(request), caller)
        return cape_pb2.FitCapeResponse(
            weights=msg.vector_to_proto(np.asarray(document["weights"], dtype=np.float64)),
            intercept=float(document["intercept"]),
            report_json=json.dumps(document["report"], sort_keys=True),
        )

    @rpc("consumer")
    async def EstimateCapeMean(self, request, context, caller):
        document = await self._run(request, _mean_spec(request), caller)
        return cape_pb2.EstimateCapeMeanResponse(
            mean=msg.vector_to_proto(np.asarray(document["mean"], dtype=np.float64)),
            report_json=json.dumps(document["report"], sort_keys=True),
        )

    @rpc_stream("consumer")
    async def WatchCapeJob(self, request, context, caller):
        async for progress in self.jobs.watch(str(caller), request.request_id):
            yield cape_pb2.WatchCapeJobResponse(
                iteration=progress.done,
                iterations=progress.total,
                finished=progress.finished,
                message=progress.message,
            )

    @rpc("consumer")
    async def TrainCape(self, request, context, caller):
        spec: CapeTrainingSpec = msg.training_from_proto(request.spec)
        document = await self._run(request, spec, caller)
        return cape_pb2.TrainCapeResponse(
            parameters=msg.vector_to_proto(np.asarray(document["parameters"], dtype=np.float64)),
            report_json=json.dumps(document["report"], sort_keys=True),
        )

    @rpc("consumer")
    async def QuoteCape(self, request, context, caller):
        kind = request.WhichOneof("job")
        if kind is None:
            raise InvalidArgumentError("QuoteCape needs the job to quote: fit, mean or training")
        job = getattr(request, kind)
        quoted = await self.jobs.quote(
            _SPECS[kind](job),
            int(job.seed) if job.HasField("seed") else None,
            consumer=str(caller),
            schema=schema_from_proto(job.schema, "the consumer"),
            min_owners=int(job.min_owners),
            max_cost=_max_cost(job),
        )
        return cape_pb2.QuoteCapeResponse(quote=quote_to_proto(quoted))


def _fit_spec(request: Any) -> CapeJobSpec:
    """A FitCapeRequest's spec.

    Raises
    ------
    InvalidArgumentError
        For a malformed spec, or the mean's task.
    """
    spec = msg.spec_from_proto(request.spec)
    if not isinstance(spec, CapeJobSpec):
        raise InvalidArgumentError("FitCape fits regressions; ask EstimateCapeMean for a mean")
    return spec


def _mean_spec(request: Any) -> CapeMeanSpec:
    """An EstimateCapeMeanRequest's spec.

    Raises
    ------
    InvalidArgumentError
        For a malformed spec, or a regression's task.
    """
    spec = msg.spec_from_proto(request.spec)
    if not isinstance(spec, CapeMeanSpec):
        raise InvalidArgumentError(
            "EstimateCapeMean needs the task CAPE_TASK_MEAN; ask FitCape for a regression"
        )
    return spec


#: The spec of each job a QuoteCapeRequest may hold, by its field.
_SPECS: dict[str, Callable[[Any], AnyCapeSpec]] = {
    "fit": _fit_spec,
    "mean": _mean_spec,
    "training": lambda request: msg.training_from_proto(request.spec),
}


def _max_cost(request: Any) -> int | None:
    """A CAPE request's cap, micro-credits (None: unset).

    Raises
    ------
    InvalidArgumentError
        If it is negative.
    """
    if not request.HasField("max_cost"):
        return None
    if request.max_cost < 0:
        raise InvalidArgumentError(f"max_cost must be >= 0 micro-credits, got {request.max_cost}")
    return int(request.max_cost)


async def _notify(condition: asyncio.Condition) -> None:
    async with condition:
        condition.notify_all()
