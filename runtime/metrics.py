"""Prometheus metrics of a service, for its operator (``prometheus_client``).

Off by default. ``owner serve`` and ``curator serve`` take ``--metrics-port PORT`` (config key
``metrics-port``) and ``--metrics-host`` (default 127.0.0.1: only this machine scrapes; the
compose stack's monitoring profile binds 0.0.0.0 on its internal networks): the service then
serves ``/metrics`` over plain HTTP on that port, from a thread of its own. Every server the
process starts afterwards (:func:`dpmarket.runtime.serving.start_server`) counts its calls.

What is exported (``party`` is the service's identity, ``owner:NAME`` or ``curator:NAME``):

* ``dpmarket_rpc_requests_total{party, service, method, code}``: calls answered, by gRPC status;
* ``dpmarket_rpc_latency_seconds{party, service, method}``: a histogram of the time from a call's
  start (before its request is read) to its status;
* ``dpmarket_rpc_in_progress{party, service}``: calls being served;
* ``dpmarket_refusals_total{party, service, method, reason}``: calls refused, the reason being the
  status a refusal carries (``permission_denied``, ``unauthenticated``, ``resource_exhausted``,
  ``failed_precondition``, ``invalid_argument``, ``not_found``, ``already_exists``,
  ``out_of_range``);
* what each role adds through :meth:`ServiceMetrics.register`: an owner's budget from its own
  ledger (:mod:`dpmarket.owner.metrics`), a curator's sessions by stage
  (:mod:`dpmarket.curator.metrics`).

Notes
-----
Nothing in a metric depends on a party's data beyond what the ledger already records for that
party: labels come from fixed sets (the API's service and method names, status codes, stages), and
the values are counts of calls, their durations (what every caller of the service measures of its
own calls anyway) and the ledger's own totals. No message text, session id or name taken from a
request is a label, so a caller cannot grow the number of series either.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import click
import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.registry import Collector

__all__ = [
    "REFUSAL_CODES",
    "MetricsInterceptor",
    "ServiceMetrics",
    "enable_metrics",
    "installed_metrics",
    "metrics_options",
    "register_all",
    "start_metrics",
]

#: The statuses counted as refusals (``dpmarket_refusals_total``'s ``reason``).
REFUSAL_CODES = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)
#: Latency buckets, seconds: a health check (ms) to a long owner step (minutes).
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


class ServiceMetrics:
    """The metrics of one process's services, in their own registry.

    Parameters
    ----------
    registry : CollectorRegistry, optional
        Default: a new one (not the library's global registry, so a test can hold several).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "dpmarket_rpc_requests",
            "gRPC calls answered, by status",
            ["party", "service", "method", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "dpmarket_rpc_latency_seconds",
            "Time from a call's start to its status, seconds",
            ["party", "service", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_progress = Gauge(
            "dpmarket_rpc_in_progress",
            "gRPC calls being served",
            ["party", "service"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "dpmarket_refusals",
            "gRPC calls refused, by the status of the refusal",
            ["party", "service", "method", "reason"],
            registry=self.registry,
        )
        self.address: tuple[str, int] | None = None
        self._server: Any = None

    def interceptor(self, party: str) -> MetricsInterceptor:
        """A server interceptor counting the calls of a server whose identity is ``party``."""
        return MetricsInterceptor(self, party)

    def register(self, collector: Collector) -> None:
        """Add a role's own collector (read at every scrape)."""
        self.registry.register(collector)

    def unregister(self, collector: Collector) -> None:
        """Remove a collector added by :meth:`register` (a service that stopped)."""
        self.registry.unregister(collector)

    def observe(self, party: str, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """Count one answered call of ``method`` (``/package.Service/Method``)."""
        service, rpc = _split(method)
        self.requests.labels(party, service, rpc, code.name).inc()
        self.latency.labels(party, service, rpc).observe(seconds)
        if code in REFUSAL_CODES:
            self.refusals.labels(party, service, rpc, code.name.lower()).inc()

    def serve(self, host: str, port: int) -> tuple[str, int]:
        """Serve ``/metrics`` on ``host:port`` (port 0: any free port) from a daemon thread;
        return the address bound.

        Raises
        ------
        OSError
            If the address cannot be bound.
        """
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        self.address = (host, int(server.server_address[1]))
        return self.address

    def close(self) -> None:
        """Stop serving ``/metrics``."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _split(method: str) -> tuple[str, str]:
    service, _, rpc = method.lstrip("/").rpartition("/")
    return service, rpc


def _code(context: grpc.aio.ServicerContext, error: BaseException | None) -> grpc.StatusCode:
    """The status a call ended with: the one the handler set (an abort included), else OK, or
    CANCELLED / UNKNOWN for a call that ended by cancellation or an exception."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, int):  # some grpc versions report the numeric value
        return next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
    if error is None:
        return grpc.StatusCode.OK
    if isinstance(error, BaseException) and type(error).__name__ == "CancelledError":
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts every call of a server: its status, its time, the calls in progress.

    Installed first (before :class:`dpmarket.runtime.admission.Admission`), so that calls
    refused at admission are counted with their refusal's status. It reads nothing of a
    request.
    """

    def __init__(self, metrics: ServiceMetrics, party: str) -> None:
        self.metrics = metrics
        self.party = party
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(  # type: ignore[override]
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        inner = await continuation(handler_call_details)
        if inner is None:
            return None
        cached = self._handlers.get(method)
        if cached is not None and getattr(cached, "_dpmarket_inner", None) is inner:
            return cached
        handler = self._wrap(method, inner)
        self._handlers[method] = handler
        return handler

    def _wrap(self, method: str, inner: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        metrics, party = self.metrics, self.party
        service, _ = _split(method)
        behaviour: Any = (
            inner.unary_unary or inner.unary_stream or inner.stream_unary or inner.stream_stream
        )
        if behaviour is None:
            return inner
        gauge = metrics.in_progress.labels(party, service)

        def finish(context: Any, start: float, error: BaseException | None) -> None:
            gauge.dec()
            metrics.observe(party, method, _code(context, error), time.perf_counter() - start)

        if inspect.isasyncgenfunction(behaviour):

            async def streaming(request: Any, context: Any) -> Any:
                start, error = time.perf_counter(), None
                gauge.inc()
                try:
                    async for response in behaviour(request, context):
                        yield response
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    finish(context, start, error)

            wrapped: Callable[..., Any] = streaming
        else:

            async def unary(request: Any, context: Any) -> Any:
                start, error = time.perf_counter(), None
                gauge.inc()
                try:
                    return await behaviour(request, context)
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    finish(context, start, error)

            wrapped = unary
        make = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(inner.request_streaming, inner.response_streaming)]
        handler = make(wrapped, inner.request_deserializer, inner.response_serializer)
        handler._dpmarket_inner = inner  # type: ignore[attr-defined]
        return handler


_installed: ServiceMetrics | None = None
_lock = threading.Lock()


def enable_metrics(host: str, port: int) -> ServiceMetrics:
    """Serve this process's metrics on ``host:port`` (once per process: a second call returns
    the metrics already served) and have every server started afterwards counted.

    Raises
    ------
    OSError
        If the address cannot be bound (the message names it).
    """
    global _installed
    with _lock:
        if _installed is not None:
            return _installed
        metrics = ServiceMetrics()
        try:
            metrics.serve(host, port)
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
        _installed = metrics
        return metrics


def installed_metrics() -> ServiceMetrics | None:
    """The process's metrics, when :func:`enable_metrics` was called; else None."""
    return _installed


def metrics_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--metrics-port`` and ``--metrics-host`` (config keys ``metrics-port``,
    ``metrics-host``) of a service's command."""
    func = click.option(
        "--metrics-host",
        default="127.0.0.1",
        help="Address of the metrics endpoint (plain HTTP, no authentication: bind it where "
        "only your Prometheus reaches).",
    )(func)
    return click.option(
        "--metrics-port",
        default=None,
        type=click.IntRange(0, 65535),
        help="Serve Prometheus metrics on this port (/metrics; 0: any free port, logged). "
        "Default: no metrics.",
    )(func)


def start_metrics(host: str, port: int | None, logger: Any) -> ServiceMetrics | None:
    """What a service command does with :func:`metrics_options`: nothing without a port; else
    :func:`enable_metrics` and a log line with the address.

    Raises
    ------
    click.ClickException
        If the address cannot be bound.
    """
    if port is None:
        return None
    try:
        metrics = enable_metrics(host, port)
    except OSError as exc:
        raise click.ClickException(str(exc)) from exc
    assert metrics.address is not None
    logger.info("metrics on http://%s:%d/metrics", *metrics.address)
    return metrics


def register_all(collectors: Iterable[Collector]) -> list[Collector]:
    """Register ``collectors`` with the process's metrics, when enabled; return those
    registered (to unregister when the service stops)."""
    metrics = installed_metrics()
    if metrics is None:
        return []
    done = []
    for collector in collectors:
        metrics.register(collector)
        done.append(collector)
    return done
