"""Per-RPC authentication and authorization: who calls, and whether that role may call this RPC.

A caller's role and name come only from its certificate, verified against the deployment's CA
during the mTLS handshake (:mod:`dpmarket.runtime.transport`); nothing in a message body names the
caller. Every servicer method is wrapped with :func:`rpc` (unary) or :func:`rpc_stream`
(server or bidirectional streaming), which states the roles that may call it; the wrapper

1. reads the caller's :class:`~dpmarket.runtime.identity.Identity` from the verified certificate, or
   answers ``UNAUTHENTICATED`` when there is none;
2. answers ``PERMISSION_DENIED`` when the role may not call this RPC or the name is not one this
   service serves (an owner serves only the curators its policy names; a curator serves the
   consumers its CA certified and is served only by the owners it was configured with);
3. passes the identity to the handler as ``caller`` and maps the handler's errors to statuses
   (:mod:`dpmarket.runtime.status`), so no stack trace reaches the wire.

On a server built by :func:`dpmarket.runtime.serving.start_server` the same check runs first at the
call's start, before its request is read (:class:`dpmarket.runtime.admission.Admission` reads the
roles this module sets on each wrapper, :data:`ROLES_ATTRIBUTE`, and the servicer's ``authorizer``),
so a refused party makes the service hold none of its request; the wrapper's own check stays, for
every other way a handler is called.

With ``require_client_auth`` a TLS client without a certificate never reaches a handler: the
handshake fails and the caller sees ``UNAVAILABLE``. ``UNAUTHENTICATED`` is what a handler answers
a connection whose certificate carries no dpmarket identity (a certificate of the CA without the
SPIFFE URI). With plaintext transport, which a service accepts only with an explicit
``--insecure`` flag and a logged warning, no caller can be authenticated: every caller is taken
to be the single identity the service was told to assume (``insecure_peer``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from typing import Any, Protocol

import grpc

from dpmarket.common.errors import PermissionDeniedError, UnauthenticatedError
from dpmarket.runtime.identity import ROLES, Identity, Role, peer_identity
from dpmarket.runtime.status import abort_for

#: Attribute set on every wrapped servicer method: the roles that may call it.
ROLES_ATTRIBUTE = "__dpmarket_roles__"


class Authorizer:
    """Decides who may call a service.

    Parameters
    ----------
    allowed : mapping of role to collection of names, or to None
        The roles this service serves. For each, the names it serves, or ``None`` for any name
        the CA certified (e.g. every consumer).
    insecure_peer : Identity, optional
        Plaintext transport only: the identity every caller is taken to have (there are no
        certificates). ``None`` on an mTLS service.

    Raises
    ------
    ValueError
        If ``allowed`` names an unknown role.
    """

    def __init__(
        self,
        allowed: Mapping[Role, Collection[str] | None],
        *,
        insecure_peer: Identity | None = None,
    ) -> None:
        for role in allowed:
            if role not in ROLES:
                raise ValueError(f"unknown role {role!r}; roles are {ROLES}")
        self.allowed = {
            role: None if names is None else frozenset(names) for role, names in allowed.items()
        }
        self.insecure_peer = insecure_peer

    def authenticate(self, context: grpc.aio.ServicerContext) -> Identity:
        """The caller's identity from its verified certificate.

        Raises
        ------
        UnauthenticatedError
            If the connection carries no verified certificate, or one without a dpmarket
            identity.
        """
        if self.insecure_peer is not None:
            return self.insecure_peer
        try:
            identity = peer_identity(context)
        except ValueError as exc:
            raise UnauthenticatedError(f"the client certificate is not usable: {exc}") from None
        if identity is None:
            raise UnauthenticatedError(
                "no verified client certificate: connect with mTLS and a certificate issued by "
                "this deployment's CA (dpmarket pki issue)"
            )
        return identity

    def authorize(self, context: grpc.aio.ServicerContext, roles: Collection[Role]) -> Identity:
        """Authenticate the caller and check that it may call an RPC open to ``roles``.

        Raises
        ------
        UnauthenticatedError
            As :meth:`authenticate`.
        PermissionDeniedError
            If the caller's role is not in ``roles`` or not served here, or its name is not
            one this service serves.
        """
        caller = self.authenticate(context)
        if caller.role not in roles or caller.role not in self.allowed:
            raise PermissionDeniedError(
                f"{caller} may not call this method (allowed roles: {', '.join(roles)})"
            )
        names = self.allowed[caller.role]
        if names is not None and caller.name not in names:
            raise PermissionDeniedError(f"{caller} is not served here")
        return caller


class _Servicer(Protocol):
    authorizer: Authorizer


Unary = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]
Streaming = Callable[[Any, Any, grpc.aio.ServicerContext], AsyncIterator[Any]]


def rpc(*roles: Role) -> Callable[[Callable[..., Awaitable[Any]]], Unary]:
    """Decorate an async unary servicer method ``(self, request, context, caller)``.

    The servicer must have an ``authorizer`` attribute (:class:`Authorizer`). The wrapper
    authorizes the caller for ``roles`` before the handler runs, passes its identity as
    ``caller`` and turns every error into a status (:func:`dpmarket.runtime.status.abort_for`).
    """
    _check_roles(roles)

    def decorate(handler: Callable[..., Awaitable[Any]]) -> Unary:
        @functools.wraps(handler)
        async def wrapper(self: _Servicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                caller = self.authorizer.authorize(context, roles)
                return await handler(self, request, context, caller)
            except Exception as exc:  # the boundary: every error becomes a status
                await abort_for(exc, context, handler.__name__)

        setattr(wrapper, ROLES_ATTRIBUTE, roles)
        return wrapper

    return decorate


def rpc_stream(*roles: Role) -> Callable[[Callable[..., AsyncIterator[Any]]], Streaming]:
    """Decorate an async-generator servicer method, as :func:`rpc`: server streaming
    ``(self, request, context, caller)`` or bidirectional streaming ``(self, request_iterator,
    context, caller)``. The caller is authorized before the handler reads any request."""
    _check_roles(roles)

    def decorate(handler: Callable[..., AsyncIterator[Any]]) -> Streaming:
        if not inspect.isasyncgenfunction(handler):
            raise TypeError(f"{handler.__name__} must be an async generator function")

        @functools.wraps(handler)
        async def wrapper(
            self: _Servicer, request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            try:
                caller = self.authorizer.authorize(context, roles)
                async for message in handler(self, request, context, caller):
                    yield message
            except Exception as exc:  # the boundary: every error becomes a status
                await abort_for(exc, context, handler.__name__)

        setattr(wrapper, ROLES_ATTRIBUTE, roles)
        return wrapper

    return decorate


def _check_roles(roles: tuple[Role, ...]) -> None:
    if not roles:
        raise ValueError("an RPC must name at least one role that may call it")
    for role in roles:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles are {ROLES}")
