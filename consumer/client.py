"""Client library of the consumer: submit a validation set, follow progress, get the summary;
run CAPE jobs; read the sketch catalogue (exploration itself is local:
:mod:`dpmarket.consumer.explore`).

The channel is mTLS: the consumer proves its identity with its certificate and checks the
curator's (role and name) at the handshake.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from numpy.typing import NDArray

from dpmarket.common.cape.dpgd import accuracy, predict_proba
from dpmarket.common.cape.spec import AnyCapeSpec, CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.cape.uncertainty import Estimate, training_estimates
from dpmarket.common.errors import AbortedError, DPMarketError, InvalidArgumentError
from dpmarket.common.market.pricing import Quote
from dpmarket.common.market.statement import (
    PublicKey,
    StatementError,
    decode_statement,
    verify_statement,
)
from dpmarket.common.market.terms import NO_REWARD, RewardOffer
from dpmarket.common.schema import Schema
from dpmarket.common.sketches.spec import PublishedSketch, SketchSpec
from dpmarket.common.summarization.methods import SummarizationConfig
from dpmarket.common.summarization.summary import (
    OwnerSelection,
    ProgressEvent,
    SessionReport,
    SummaryResult,
)
from dpmarket.common.summarization.terms import MethodOffer
from dpmarket.consumer import convert
from dpmarket.consumer.cape_report import CapeFitReport, CapeMeanReport, CapeTrainingReport
from dpmarket.consumer.convert import CURATOR_TEXT_CHARS
from dpmarket.consumer.market import SettledStatement
from dpmarket.runtime import cape_messages, sketch_messages
from dpmarket.runtime.identity import Identity, certified_public_key
from dpmarket.runtime.market import quote_from_proto
from dpmarket.runtime.schemas import schema_to_proto
from dpmarket.runtime.serving import CHANNEL_OPTIONS
from dpmarket.runtime.status import error_from_rpc
from dpmarket.runtime.transport import CONNECT_TIMEOUT_SECONDS, TransportSecurity, connected_channel
from dpmarket.v1 import (
    cape_pb2,
    cape_pb2_grpc,
    curator_pb2,
    curator_pb2_grpc,
    sketch_pb2,
    sketch_pb2_grpc,
)


class SessionFailedError(AbortedError):
    """A session that failed on the curator; ``report`` holds what it spent (its ledger).

    Attributes
    ----------
    session_id : str
    report : SessionReport or None
        The failed session's report (ledger included), when the curator sent one.
    """

    def __init__(self, message: str, session_id: str, report: SessionReport | None) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.report = report


class CuratorClient:
    """Synchronous client of a curator service.

    Parameters
    ----------
    target : str
        ``host:port`` of the curator.
    security : TransportSecurity
        The consumer's mTLS credentials (or plaintext, for an ``--insecure`` curator).
    curator : Identity, optional
        The curator identity the server must prove (default ``curator:curator``).
    timeout : float
        Deadline of unary calls, seconds.
    connect_timeout : float or None
        The channel must connect within this many seconds (TCP and the mTLS handshake), or the
        constructor raises :class:`dpmarket.runtime.transport.ConnectError` saying why (nothing
        listening, a certificate of another CA, a server of another name); None: no check,
        calls wait for the curator up to their deadline.

    Raises
    ------
    dpmarket.runtime.transport.ConnectError
        From the constructor, as ``connect_timeout`` says.
    dpmarket.common.errors.DPMarketError
        Every method raises the error matching the curator's status (e.g.
        ``InvalidArgumentError`` for a malformed validation set, ``NotFoundError`` for an unknown
        session, ``UnavailableError`` when the curator cannot be reached).
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
        expected = None if security.insecure else (curator or Identity("curator", "curator"))
        self._ca_pem = security.ca_pem
        self._curator = expected
        self._channel = connected_channel(
            target,
            security,
            expected,
            CHANNEL_OPTIONS,
            connect_timeout=connect_timeout,
            peer="the curator",
        )
        self._stub = curator_pb2_grpc.CuratorServiceStub(self._channel)
        self._cape = cape_pb2_grpc.CapeServiceStub(self._channel)
        self._sketches = sketch_pb2_grpc.SketchCatalogServiceStub(self._channel)
        #: The quote of the last session :meth:`create_session` started (None before).
        self.last_quote: Quote | None = None

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> CuratorClient:
        return self

    def _error(self, exc: grpc.RpcError) -> DPMarketError:
        """The curator's failed call as a ``DPMarketError`` naming it, its text kept as one
        line of at most :data:`~dpmarket.consumer.convert.CURATOR_TEXT_CHARS` characters
        (:func:`~dpmarket.common.texts.peer_text`)."""
        return error_from_rpc(exc, f"curator at {self.target}", limit=CURATOR_TEXT_CHARS)

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_session(
        self,
        config: SummarizationConfig,
        validation: NDArray[np.float64],
        seed_set: NDArray[np.float64],
        *,
        seed: int | None = None,
        request_id: str = "",
        selection: OwnerSelection | None = None,
        schema: Schema | None = None,
        feature_names: Sequence[str] = (),
        max_cost: int | None = None,
        reward: RewardOffer = NO_REWARD,
    ) -> str:
        """Start a session; return its id (CreateSession). A retry with the same
        ``request_id`` returns the same session and charges nothing new.
        The quote it was accepted under is :attr:`last_quote` afterwards.

        ``selection``: owners to leave out by name and the fewest the session may open with
        (default: every owner asked; an owner that refuses its terms or cannot be reached
        fails the request, nothing spent). ``schema`` is the
        public schema the validation set was read through (the curator refuses owners that
        declare another); ``feature_names`` the validation set's column names when it was read
        from a table without one (owners with a schema must have these features, in this
        order). ``max_cost``: the most the session may cost, micro-credits (None: no cap; a
        quote above it is refused with ``FailedPreconditionError``, nothing released or charged
        anywhere); ``reward``: a value-based reward split by the private payout release."""
        request = self._request(
            config,
            validation,
            seed_set,
            seed,
            request_id,
            selection,
            schema,
            feature_names,
            max_cost,
            reward,
        )
        try:
            response = self._stub.CreateSession(request, timeout=self.timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        self.last_quote = quote_from_proto(response.quote) if response.HasField("quote") else None
        return str(response.session_id)

    @staticmethod
    def _request(
        config: SummarizationConfig,
        validation: NDArray[np.float64],
        seed_set: NDArray[np.float64],
        seed: int | None,
        request_id: str,
        selection: OwnerSelection | None,
        schema: Schema | None,
        feature_names: Sequence[str],
        max_cost: int | None,
        reward: RewardOffer,
    ) -> curator_pb2.CreateSessionRequest:
        request = convert.create_request_to_proto(
            config,
            validation,
            seed_set,
            seed,
            request_id,
            selection,
            max_cost=max_cost,
            reward=reward,
        )
        if schema is not None:
            request.schema.CopyFrom(schema_to_proto(schema))
        request.feature_names.extend(feature_names)
        return request

    def quote_session(
        self,
        config: SummarizationConfig,
        validation: NDArray[np.float64],
        seed_set: NDArray[np.float64],
        *,
        seed: int | None = None,
        selection: OwnerSelection | None = None,
        schema: Schema | None = None,
        feature_names: Sequence[str] = (),
        max_cost: int | None = None,
        reward: RewardOffer = NO_REWARD,
    ) -> Quote:
        """The most a request would cost, without running it (QuoteSession): nothing is
        released or charged, no session is created. Raises as :meth:`create_session` would
        before the session opens (a quote above ``max_cost``: ``FailedPreconditionError``)."""
        request = self._request(
            config,
            validation,
            seed_set,
            seed,
            "",
            selection,
            schema,
            feature_names,
            max_cost,
            reward,
        )
        try:
            response = self._stub.QuoteSession(
                curator_pb2.QuoteSessionRequest(request=request),
                timeout=self.timeout,
                wait_for_ready=True,
            )
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        return quote_from_proto(response.quote)

    def statements(
        self, session_id: str | None = None, limit: int | None = None
    ) -> list[SettledStatement]:
        """The consumer's settlement statements, newest first (ListStatements); only
        ``session_id``'s if given. Every statement's signature is checked first
        (:meth:`_statement_key`, :func:`~dpmarket.common.market.statement.verify_statement`).

        Raises
        ------
        StatementError
            (an ``InvalidArgumentError``) If a statement the curator returns is not a canonical
            statement, or its signature does not verify with the key of the curator's
            certificate (tampered, unsigned, signed by another key): the whole answer is refused.
        """
        request = curator_pb2.ListStatementsRequest(session_id=session_id or "", limit=limit or 0)
        try:
            response = self._stub.ListStatements(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        if not response.statements:
            return []
        key = self._statement_key(bytes(response.curator_certificate))
        settled = []
        for m in response.statements:
            statement = decode_statement(bytes(m.statement.statement))
            signature = bytes(m.statement.signature)
            verify_statement(statement, signature, key)
            settled.append(
                SettledStatement(
                    session_id=m.session_id,
                    settled_at=m.settled_at.ToNanoseconds() / 1e9,
                    statement=statement,
                    signature=signature,
                    owners_recorded=int(m.owners_recorded),
                )
            )
        return settled

    def _statement_key(self, certificate: bytes) -> PublicKey:
        """The key statements must be signed with: that of the curator's certificate, checked
        against this consumer's CA and the curator identity its channel expects
        (:func:`~dpmarket.runtime.identity.certified_public_key`).

        Raises
        ------
        StatementError
            With plaintext transport (no CA to check a certificate against), without a
            certificate, or for one that fails a check or holds a key of another kind.
        """
        if self._ca_pem is None or self._curator is None:
            raise StatementError(
                "statements cannot be checked over a plaintext channel (no CA): connect to the "
                "curator over mTLS to read them"
            )
        if not certificate:
            raise StatementError(
                f"the curator at {self.target} sent statements without its certificate: they "
                "cannot be checked, refused"
            )
        try:
            key = certified_public_key(certificate, self._ca_pem, self._curator)
        except ValueError as exc:
            raise StatementError(f"the curator's statements are refused: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey):
            raise StatementError(
                f"the curator's certificate holds a {type(key).__name__}, not an EC or Ed25519 "
                "key: its statements cannot be checked, refused"
            )
        return key

    def methods(self) -> list[MethodOffer]:
        """Which summarization methods the deployment serves, and why not (ListMethods: the
        curator's policy and each owner's published access flags); nothing is asked of the
        owners but their descriptions.

        Raises
        ------
        UnavailableError
            If the curator or every owner is unreachable.
        """
        try:
            response = self._stub.ListMethods(
                curator_pb2.ListMethodsRequest(), timeout=self.timeout
            )
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        return [convert.method_offer_from_proto(m) for m in response.methods]

    def watch(self, session_id: str) -> Iterator[tuple[ProgressEvent, SessionReport | None]]:
        """Yield progress events until the session ends (WatchSession); the last one comes with
        the session's report (ledger included), also when the session failed."""
        request = curator_pb2.WatchSessionRequest(session_id=session_id)
        try:
            for message in self._stub.WatchSession(request):
                report = convert.report_from_proto(message.report) if message.finished else None
                yield convert.event_from_proto(message), report
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def get_summary(self, session_id: str) -> SummaryResult:
        """Return the finished summary (GetSummary)."""
        request = curator_pb2.GetSummaryRequest(session_id=session_id)
        try:
            response = self._stub.GetSummary(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        return convert.result_from_proto(response)

    def summarize(
        self,
        config: SummarizationConfig,
        validation: NDArray[np.float64],
        seed_set: NDArray[np.float64],
        *,
        seed: int | None = None,
        on_progress: Callable[[ProgressEvent], None] | None = None,
        request_id: str | None = None,
        selection: OwnerSelection | None = None,
        schema: Schema | None = None,
        feature_names: Sequence[str] = (),
        max_cost: int | None = None,
        reward: RewardOffer = NO_REWARD,
        on_quote: Callable[[Quote], None] | None = None,
        on_created: Callable[[str], None] | None = None,
    ) -> SummaryResult:
        """Create a session, follow it to the end and return its summary.

        ``request_id`` defaults to a fresh random key, so a retried CreateSession (the client
        retries while the curator is starting) never opens a second session. ``schema``,
        ``feature_names``, ``max_cost`` (micro-credits) and ``reward`` as
        :meth:`create_session`; ``on_created`` is called with the session's id as soon as
        the curator has created it, before it is followed (a caller that loses the curator
        afterwards still knows which session to ask about); ``on_quote`` receives the quote
        the session was accepted under, once it is created.

        Raises
        ------
        SessionFailedError
            If the session failed; its ``report`` holds the ledger of what it spent.
        """
        key = request_id if request_id is not None else uuid.uuid4().hex
        session_id = self.create_session(
            config,
            validation,
            seed_set,
            seed=seed,
            request_id=key,
            selection=selection,
            schema=schema,
            feature_names=feature_names,
            max_cost=max_cost,
            reward=reward,
        )
        if on_created is not None:
            on_created(session_id)
        if on_quote is not None and self.last_quote is not None:
            on_quote(self.last_quote)
        last: tuple[ProgressEvent, SessionReport | None] | None = None
        for event, report in self.watch(session_id):
            last = (event, report)
            if on_progress is not None:
                on_progress(event)
        if last is not None and last[0].stage == "failed":
            raise SessionFailedError(f"session failed: {last[0].message}", session_id, last[1])
        return self.get_summary(session_id)

    def _cape_call(
        self, method: str, request: Any, seed: int | None, timeout: float, schema: Schema | None
    ) -> Any:
        """Call a CapeService RPC with a seed and a schema (when given); map its status to an
        error."""
        if seed is not None:
            request.seed = seed
        if schema is not None:
            request.schema.CopyFrom(schema_to_proto(schema))
        try:
            return getattr(self._cape, method)(request, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def fit_cape(
        self,
        spec: CapeJobSpec,
        *,
        seed: int | None = None,
        request_id: str | None = None,
        timeout: float = 600.0,
        schema: Schema | None = None,
        min_owners: int = 0,
        max_cost: int | None = None,
    ) -> CapeFit:
        """Fit a model by capeFM across the curator's owners (FitCape).

        ``request_id`` defaults to a fresh random key (a retry never fits twice). With ``schema``
        (the consumer's, the spec's columns and bounds taken from it), the curator refuses owners
        that declare another before anything is charged. The job needs every owner unless
        ``min_owners`` (not 0) says how many. ``max_cost``: the most it may cost, micro-credits
        (None: no cap; a quote above it: ``FailedPreconditionError``, nothing charged); the
        report's ``quote`` and ``cost`` say what it was quoted and what it cost.

        Raises
        ------
        dpmarket.common.errors.DPMarketError
            The error matching the curator's status.
        """
        request = cape_pb2.FitCapeRequest(
            spec=cape_messages.spec_to_proto(spec),
            request_id=_key(request_id),
            min_owners=min_owners,
            max_cost=max_cost,
        )
        response = self._cape_call("FitCape", request, seed, timeout, schema)
        return CapeFit(
            weights=cape_messages.vector_from_proto(response.weights, "weights"),
            intercept=float(response.intercept),
            report=CapeFitReport.from_json(json.loads(response.report_json)),
        )

    def estimate_cape_mean(
        self,
        spec: CapeMeanSpec,
        *,
        seed: int | None = None,
        request_id: str | None = None,
        timeout: float = 600.0,
        schema: Schema | None = None,
        min_owners: int = 0,
        max_cost: int | None = None,
    ) -> CapeMean:
        """The mean vector of some columns across the curator's owners (EstimateCapeMean).

        ``request_id`` defaults to a fresh random key (a retry never spends twice). With ``schema``
        (the consumer's, the spec's columns and bounds taken from it), the curator refuses owners
        that declare another before anything is charged. The job needs every owner unless
        ``min_owners`` (not 0) says how many. ``max_cost`` as :meth:`fit_cape`.

        Raises
        ------
        dpmarket.common.errors.DPMarketError
            The error matching the curator's status.
        """
        request = cape_pb2.EstimateCapeMeanRequest(
            spec=cape_messages.spec_to_proto(spec),
            request_id=_key(request_id),
            min_owners=min_owners,
            max_cost=max_cost,
        )
        response = self._cape_call("EstimateCapeMean", request, seed, timeout, schema)
        mean = cape_messages.vector_from_proto(response.mean, "mean", len(spec.features))
        report = CapeMeanReport.from_json(json.loads(response.report_json))
        return CapeMean(spec=spec, mean=mean, report=report)

    def train_cape(
        self,
        spec: CapeTrainingSpec,
        *,
        seed: int | None = None,
        request_id: str | None = None,
        timeout: float = 1800.0,
        schema: Schema | None = None,
        min_owners: int = 0,
        on_progress: Callable[[int, int], None] | None = None,
        max_cost: int | None = None,
    ) -> CapeNetwork:
        """Train the 2-layer network by CAPE gradient descent across the curator's owners
        (TrainCape).

        ``request_id`` defaults to a fresh random key (a retry never trains twice). With ``schema``
        (the consumer's, the spec's columns and bounds taken from it), the curator refuses owners
        that declare another before anything is charged. ``on_progress(done, total)`` is called
        after every iteration, from the curator's WatchCapeJob stream (best effort: a lost
        stream only stops the calls). ``max_cost`` as :meth:`fit_cape`.

        Raises
        ------
        dpmarket.common.errors.DPMarketError
            The error matching the curator's status.
        """
        key = _key(request_id)
        request = cape_pb2.TrainCapeRequest(
            spec=cape_messages.training_to_proto(spec),
            request_id=key,
            min_owners=min_owners,
            max_cost=max_cost,
        )
        if on_progress is None:
            response = self._cape_call("TrainCape", request, seed, timeout, schema)
        else:
            response = self._train_watched(request, seed, timeout, key, on_progress, schema)
        parameters = cape_messages.vector_from_proto(
            response.parameters, "parameters", spec.n_params
        )
        report = CapeTrainingReport.from_json(json.loads(response.report_json))
        return CapeNetwork(spec=spec, parameters=parameters, report=report)

    def quote_cape(
        self,
        spec: AnyCapeSpec,
        *,
        seed: int | None = None,
        schema: Schema | None = None,
        min_owners: int = 0,
        max_cost: int | None = None,
    ) -> Quote:
        """The most a CAPE job would cost, without running it (QuoteCape): the owners are asked
        for their prices only; nothing is opened, released or charged, and no job is recorded.
        Raises as :meth:`fit_cape`, :meth:`estimate_cape_mean` or :meth:`train_cape` would
        before any owner opens the job (a quote above ``max_cost``:
        ``FailedPreconditionError``)."""
        job: Any
        if isinstance(spec, CapeTrainingSpec):
            field = "training"
            job = cape_pb2.TrainCapeRequest(spec=cape_messages.training_to_proto(spec))
        elif isinstance(spec, CapeMeanSpec):
            field = "mean"
            job = cape_pb2.EstimateCapeMeanRequest(spec=cape_messages.spec_to_proto(spec))
        else:
            field = "fit"
            job = cape_pb2.FitCapeRequest(spec=cape_messages.spec_to_proto(spec))
        job.min_owners = min_owners
        if max_cost is not None:
            job.max_cost = max_cost
        if seed is not None:
            job.seed = seed
        if schema is not None:
            job.schema.CopyFrom(schema_to_proto(schema))
        request = cape_pb2.QuoteCapeRequest(**{field: job})
        response = self._cape_call("QuoteCape", request, None, self.timeout, None)
        return quote_from_proto(response.quote)

    def _train_watched(
        self,
        request: Any,
        seed: int | None,
        timeout: float,
        key: str,
        on_progress: Callable[[int, int], None],
        schema: Schema | None,
    ) -> Any:
        """TrainCape while a thread follows WatchCapeJob; the stream is cancelled when the
        training answers (also when it was refused before it started)."""
        if seed is not None:
            request.seed = seed
        if schema is not None:
            request.schema.CopyFrom(schema_to_proto(schema))
        future = self._cape.TrainCape.future(request, timeout=timeout, wait_for_ready=True)
        stream = self._cape.WatchCapeJob(
            cape_pb2.WatchCapeJobRequest(request_id=key), timeout=timeout
        )

        def follow() -> None:
            try:
                for message in stream:
                    on_progress(int(message.iteration), int(message.iterations))
            except grpc.RpcError:
                pass  # cancelled when the training answered, or the job never started

        follower = threading.Thread(target=follow, name="cape-progress", daemon=True)
        follower.start()
        try:
            return future.result()
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        finally:
            stream.cancel()
            follower.join(timeout=5.0)

    # ------------------------------------------------------------------ sketch catalogue
    def _catalog_call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._sketches, method)(
                request, timeout=self.timeout, wait_for_ready=True
            )
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def sketch_specs(self) -> list[SketchSpec]:
        """The catalogue's specs (ListSketchSpecs), each validated (its key recomputed)."""
        return self.sketch_catalogue()[0]

    def sketch_catalogue(self) -> tuple[list[SketchSpec], str | None]:
        """The catalogue's specs, each validated, and the spec the curator's summarization
        allocation reads (None: none) (ListSketchSpecs)."""
        response = self._catalog_call("ListSketchSpecs", sketch_pb2.ListSketchSpecsRequest())
        specs = [sketch_messages.spec_from_proto(m) for m in response.specs]
        return specs, response.allocation_spec or None

    def sketch_spec(self, name: str) -> SketchSpec:
        """One spec (GetSketchSpec); ``NotFoundError`` for an unknown name."""
        response = self._catalog_call("GetSketchSpec", sketch_pb2.GetSketchSpecRequest(name=name))
        return sketch_messages.spec_from_proto(response.spec)

    def sketches(
        self, spec: str | SketchSpec, owners: list[str] | None = None
    ) -> list[PublishedSketch]:
        """The published sketches of a spec (ListSketches): every owner's, or ``owners``'.

        Every sketch is validated on receipt (:meth:`PrivateSketch.validate`: its noise scales
        recomputed from its public parameters) and checked against the spec (same map, domain and
        noise as every other owner's: :meth:`SketchSpec.check_sketch`). Reading costs no owner
        anything and calls none: what the consumer computes from them stays here.

        Raises
        ------
        dpmarket.common.errors.DPMarketError
            ``NotFoundError`` for an unknown spec, ``PermissionDeniedError`` for a consumer the
            curator does not serve; ``InvalidArgumentError`` for a sketch that is inconsistent
            or not made under the spec.
        """
        target = spec if isinstance(spec, SketchSpec) else self.sketch_spec(spec)
        request = sketch_pb2.ListSketchesRequest(spec=target.name, owners=owners or [])
        response = self._catalog_call("ListSketches", request)
        out = []
        for message in response.sketches:
            entry = sketch_messages.published_from_proto(message)
            if entry.spec != target.name:
                raise InvalidArgumentError(
                    f"the curator answered {target.name!r} with a sketch of {entry.spec!r}"
                )
            target.check_sketch(entry.sketch)
            out.append(entry)
        return out


def _key(request_id: str | None) -> str:
    """The idempotency key sent: the caller's, or a fresh random one."""
    return request_id if request_id is not None else uuid.uuid4().hex


@dataclass(frozen=True)
class CapeFit:
    """A model fitted by capeFM.

    Attributes
    ----------
    weights : ndarray of shape (D,), float64
        Coefficients on the raw feature columns, in the spec's order.
    intercept : float
        Prediction (or logit) = ``intercept + x @ weights``.
    report : CapeFitReport
        Sites, dropped sites, noise, epsilon and delta per site (exact profile and Theorem 1),
        each owner's spend, timings, the estimates.
    """

    weights: NDArray[np.float64]
    intercept: float
    report: CapeFitReport

    @property
    def estimates(self) -> tuple[Estimate, ...]:
        """Every coefficient (the columns, then the intercept) with its standard error, 95 %
        interval and flags, as the curator computed them from the release
        (:func:`dpmarket.common.cape.uncertainty.capefm_estimates`)."""
        return self.report.estimates


@dataclass(frozen=True)
class CapeMean:
    """A mean vector estimated by CAPE.

    Attributes
    ----------
    spec : CapeMeanSpec
        The request (columns, bounds, guarantee).
    mean : ndarray of shape (D,), float64
        The mean of each column, in the spec's order and the columns' units.
    report : CapeMeanReport
        Sites, dropped sites, noise std at the aggregator and of the baselines, epsilon and
        delta per site (exact profile and Theorem 1), each owner's spend, timings, the estimates.
    """

    spec: CapeMeanSpec
    mean: NDArray[np.float64]
    report: CapeMeanReport

    @property
    def by_column(self) -> dict[str, float]:
        """Column -> its estimated mean."""
        return dict(zip(self.spec.columns, self.mean.tolist(), strict=True))

    @property
    def estimates(self) -> tuple[Estimate, ...]:
        """Every column's mean with its exact standard error, 95 % interval and flags
        (:func:`dpmarket.common.cape.uncertainty.mean_estimates`)."""
        return self.report.estimates


@dataclass(frozen=True)
class CapeNetwork:
    """The 2-layer network trained by CAPE gradient descent (CAPE paper, Section 5.1).

    Attributes
    ----------
    spec : CapeTrainingSpec
        The request (columns, bounds, hyper-parameters, budget).
    parameters : ndarray of shape (P,), float64
        ``W1`` (row-major), ``b1``, ``w2``, ``b2`` on the features mapped to [-1, 1].
    report : CapeTrainingReport
        Sites and iterations, noise per iteration, the total epsilon charged, delta by Theorem 1
        and exactly, each owner's spend, timings.
    """

    spec: CapeTrainingSpec
    parameters: NDArray[np.float64]
    report: CapeTrainingReport

    @property
    def estimates(self) -> tuple[Estimate, ...]:
        """Every parameter (``spec.parameter_labels``), flagged ``no_interval``: no interval can
        be computed for a network; its noise std is at least the learning rate times the last
        iteration's (:func:`dpmarket.common.cape.uncertainty.training_estimates`).

        Raises
        ------
        InvalidArgumentError
            If the report states no noise per iteration.
        """
        if not self.report.noise_std_per_iteration:
            raise InvalidArgumentError("the curator's report states no noise per iteration")
        last = self.report.noise_std_per_iteration[-1]
        return training_estimates(
            self.parameters, self.spec.parameter_labels, self.spec.learning_rate, last
        )

    def predict_proba(self, features: NDArray[np.float64]) -> NDArray[np.float64]:
        """``P[y = 1 | x]`` for raw feature rows of shape (n, D) (clamped to the spec's bounds and
        mapped by them, as the owners mapped theirs)."""
        return predict_proba(self.parameters, self.spec.scale(features), self.spec.hidden)

    def accuracy(self, features: NDArray[np.float64], labels: NDArray[np.float64]) -> float:
        """Percent of rows whose rounded prediction equals the 0/1 label."""
        return accuracy(self.parameters, self.spec.scale(features), labels, self.spec.hidden)
