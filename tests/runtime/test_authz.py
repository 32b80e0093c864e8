"""Per-RPC authorization: every RPC is wrapped, states its roles, and refuses before its handler.

The structural tests walk the service descriptors of every ``dpmarket.v1`` proto module, so an
RPC (or a whole service) added to a ``.proto`` without an authorized implementation fails here:
the owner's OwnerService, CapeSiteService and SecureAggregationService are for its curators, the
curator's CuratorService and CapeService for consumers, its SketchCatalogService for consumers and
its configured owners, each RPC for the roles it names. The behavioural tests call every wrapped
servicer method with a fake call context carrying a real certificate of a test CA (or none) and a
back end that fails the test if it is reached.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.protobuf.message_factory import GetMessageClass

from dpmarket.common.errors import PermissionDeniedError, UnauthenticatedError
from dpmarket.curator.cape_service import CapeServicer
from dpmarket.curator.policy import CuratorPolicy
from dpmarket.curator.service import INSECURE_CONSUMER, CuratorServicer, curator_authorizer
from dpmarket.curator.sketch_service import SketchCatalogServicer, catalog_authorizer
from dpmarket.deploy.pki import CA_KEY, init_ca, issue_all
from dpmarket.owner.cape_service import CapeSiteServicer, SecureAggregationServicer
from dpmarket.owner.service import OwnerServicer, owner_authorizer
from dpmarket.runtime.authz import ROLES_ATTRIBUTE, Authorizer, rpc, rpc_stream
from dpmarket.runtime.identity import CA_CERT, Identity, identity_files
from dpmarket.runtime.transport import TransportSecurity
from dpmarket.v1 import (
    cape_pb2,
    cape_pb2_grpc,
    curator_pb2,
    curator_pb2_grpc,
    owner_pb2,
    owner_pb2_grpc,
    secure_aggregation_pb2,
    secure_aggregation_pb2_grpc,
    sketch_pb2,
    sketch_pb2_grpc,
)

OWNER_SERVICE = owner_pb2.DESCRIPTOR.services_by_name["OwnerService"]
CAPE_SITE_SERVICE = cape_pb2.DESCRIPTOR.services_by_name["CapeSiteService"]
SECURE_AGGREGATION_SERVICE = secure_aggregation_pb2.DESCRIPTOR.services_by_name[
    "SecureAggregationService"
]
CURATOR_SERVICE = curator_pb2.DESCRIPTOR.services_by_name["CuratorService"]
CAPE_SERVICE = cape_pb2.DESCRIPTOR.services_by_name["CapeService"]
SKETCH_CATALOG_SERVICE = sketch_pb2.DESCRIPTOR.services_by_name["SketchCatalogService"]

#: Every proto module of the API; each of their services must be listed in SERVICES.
PROTO_MODULES = (
    "array",
    "cape",
    "curator",
    "market",
    "owner",
    "privacy",
    "schema",
    "secure_aggregation",
    "sketch",
)

CURATOR = Identity("curator", "curator")
ROGUE = Identity("curator", "rogue")
OWNER = Identity("owner", "owner-0")
OTHER_OWNER = Identity("owner", "owner-1")
ALICE = Identity("consumer", "alice")

# (descriptor, servicer, generated base, roles): the owner's services are for its curators, the
# curator's for consumers; the sketch catalogue names the roles of each RPC (owners publish,
# consumers read sketches, both read specs).
SERVICES = [
    (OWNER_SERVICE, OwnerServicer, owner_pb2_grpc.OwnerServiceServicer, ("curator",)),
    (CAPE_SITE_SERVICE, CapeSiteServicer, cape_pb2_grpc.CapeSiteServiceServicer, ("curator",)),
    (
        SECURE_AGGREGATION_SERVICE,
        SecureAggregationServicer,
        secure_aggregation_pb2_grpc.SecureAggregationServiceServicer,
        ("curator",),
    ),
    (CURATOR_SERVICE, CuratorServicer, curator_pb2_grpc.CuratorServiceServicer, ("consumer",)),
    (CAPE_SERVICE, CapeServicer, cape_pb2_grpc.CapeServiceServicer, ("consumer",)),
    (
        SKETCH_CATALOG_SERVICE,
        SketchCatalogServicer,
        sketch_pb2_grpc.SketchCatalogServiceServicer,
        {
            "ListSketchSpecs": ("owner", "consumer"),
            "GetSketchSpec": ("owner", "consumer"),
            "PublishSketch": ("owner",),
            "ListSketches": ("consumer",),
        },
    ),
]


def _roles(roles: Any, method: str) -> tuple[str, ...]:
    """The roles an RPC states: the service's, or the method's when they differ per RPC."""
    return tuple(roles[method] if isinstance(roles, dict) else roles)


# ----------------------------------------------------------------------------- structure
def test_every_service_of_the_api_is_enumerated() -> None:
    """A service added to any ``dpmarket.v1`` proto must be added to SERVICES (and so checked)."""
    declared = set()
    for name in PROTO_MODULES:
        module = importlib.import_module(f"dpmarket.v1.{name}_pb2")
        declared |= {s.full_name for s in module.DESCRIPTOR.services_by_name.values()}
    assert declared == {s[0].full_name for s in SERVICES}


def test_every_proto_module_is_listed() -> None:
    """PROTO_MODULES names every generated module next to the .proto sources."""
    folder = Path(owner_pb2.__file__).parent
    assert {p.stem for p in folder.glob("*.proto")} == set(PROTO_MODULES)


@pytest.mark.parametrize(
    ("service", "servicer", "generated", "roles"), SERVICES, ids=lambda v: getattr(v, "name", "")
)
def test_every_rpc_is_implemented_and_states_its_roles(service, servicer, generated, roles) -> None:
    """Each RPC of the descriptor is defined on the servicer itself (the generated base answers
    UNIMPLEMENTED) and wrapped by ``rpc``/``rpc_stream`` with exactly the expected roles."""
    assert service.methods, "the descriptor lists no RPC"
    for method in service.methods:
        assert method.name in vars(servicer), (
            f"{service.name}.{method.name} is not implemented by {servicer.__name__}"
        )
        handler = vars(servicer)[method.name]
        assert handler is not getattr(generated, method.name)
        expected = _roles(roles, method.name)
        assert getattr(handler, ROLES_ATTRIBUTE, None) == expected, (
            f"{service.name}.{method.name} is not wrapped by dpmarket.runtime.authz.rpc{expected}"
        )
        streaming = method.server_streaming
        assert inspect.isasyncgenfunction(handler) == streaming, method.name
        # rpc_stream wraps server and bidirectional streams; nothing wraps client-only streams.
        assert streaming or not method.client_streaming, f"{method.name}: not wrapped"


@pytest.mark.parametrize(("service", "servicer"), [(s[0], s[1]) for s in SERVICES])
def test_every_public_servicer_method_is_an_rpc(service, servicer) -> None:
    """No public method of a servicer escapes the descriptor (and so the test above)."""
    rpcs = {m.name for m in service.methods}
    public = {
        name for name, value in vars(servicer).items() if callable(value) and name[0].isupper()
    }
    assert public == rpcs


def test_rpc_decorators_refuse_no_roles_and_unknown_roles() -> None:
    with pytest.raises(ValueError, match="at least one role"):
        rpc()
    with pytest.raises(ValueError, match="unknown role"):
        rpc("admin")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown role"):
        Authorizer({"admin": None})  # type: ignore[dict-item]

    async def not_a_generator(self, request, context, caller):
        return None

    with pytest.raises(TypeError, match="async generator"):
        rpc_stream("consumer")(not_a_generator)  # type: ignore[arg-type]


# ------------------------------------------------------------------------- certificates
def _no_identity_certificate(pki: Path) -> bytes:
    """A certificate the CA signed but with no SPIFFE URI (a DNS SAN only)."""
    ca_cert = x509.load_pem_x509_certificate((pki / CA_CERT).read_bytes())
    ca_key = serialization.load_pem_private_key((pki / CA_KEY).read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nobody")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("nobody.example")]), False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes | None]:
    """PEM certificates by label: every identity of the tests, none, and one without identity."""
    pki = tmp_path_factory.mktemp("pki")
    init_ca(pki)
    identities = [CURATOR, ROGUE, OWNER, OTHER_OWNER, ALICE]
    issue_all(pki, identities)
    out: dict[str, bytes | None] = {
        str(i): identity_files(pki, i)[1].read_bytes() for i in identities
    }
    out["none"] = None
    out["no-identity"] = _no_identity_certificate(pki)
    return out


class FakeContext:
    """What the wrappers use of a grpc.aio.ServicerContext: the auth context and abort."""

    def __init__(self, pem: bytes | None) -> None:
        self._auth = {} if pem is None else {"x509_pem_cert": [pem]}
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise grpc.aio.AbortError()


class Untouchable:
    """A back end (Owner or SessionManager) whose every attribute fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the handler ran: it used {name!r} of its back end")


def _call(servicer: Any, method: Any, request: Any, context: FakeContext) -> None:
    """Call a servicer method as gRPC would (a bidirectional stream gets a request iterator)."""

    async def requests() -> Any:
        yield request

    async def run() -> None:
        handler = getattr(servicer, method.name)
        if method.server_streaming:
            async for _ in handler(requests() if method.client_streaming else request, context):
                raise AssertionError(f"{method.name} streamed a message")
        else:
            await handler(request, context)

    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(run())


def _servicers() -> dict[str, Any]:
    """Every servicer over back ends that fail the test if a handler reaches them."""
    owner_side = Authorizer({"curator": ("curator",)})
    curator_side = Authorizer({"consumer": None})
    return {
        "OwnerService": OwnerServicer(Untouchable(), owner_side),  # type: ignore[arg-type]
        "CapeSiteService": CapeSiteServicer(Untouchable(), Untouchable(), owner_side),  # type: ignore[arg-type]
        "SecureAggregationService": SecureAggregationServicer(
            Untouchable(),  # type: ignore[arg-type]
            Untouchable(),
            owner_side,
        ),
        "CuratorService": CuratorServicer(Untouchable(), curator_side),  # type: ignore[arg-type]
        "CapeService": CapeServicer(Untouchable(), curator_side),  # type: ignore[arg-type]
        "SketchCatalogService": SketchCatalogServicer(
            Untouchable(),  # type: ignore[arg-type]
            Authorizer({"consumer": None, "owner": (OWNER.name,)}),
        ),
    }


# Expected status of each caller: an owner's services serve only the curator its policy names,
# the curator's serve consumers only.
OWNER_SIDE = {
    "none": grpc.StatusCode.UNAUTHENTICATED,
    "no-identity": grpc.StatusCode.UNAUTHENTICATED,
    str(ALICE): grpc.StatusCode.PERMISSION_DENIED,
    str(OWNER): grpc.StatusCode.PERMISSION_DENIED,
    str(OTHER_OWNER): grpc.StatusCode.PERMISSION_DENIED,
    str(ROGUE): grpc.StatusCode.PERMISSION_DENIED,
}
CURATOR_SIDE = {
    "none": grpc.StatusCode.UNAUTHENTICATED,
    "no-identity": grpc.StatusCode.UNAUTHENTICATED,
    str(OWNER): grpc.StatusCode.PERMISSION_DENIED,
    str(CURATOR): grpc.StatusCode.PERMISSION_DENIED,
    str(ROGUE): grpc.StatusCode.PERMISSION_DENIED,
}
EXPECTED = {
    service.name: OWNER_SIDE if roles == ("curator",) else CURATOR_SIDE
    for service, _, _, roles in SERVICES
    if service is not SKETCH_CATALOG_SERVICE
}
#: The catalogue serves every consumer and the configured owner (owner-0), each RPC to its roles;
#: an unconfigured owner and every curator are refused everywhere.
_CATALOG_ANY = {
    "none": grpc.StatusCode.UNAUTHENTICATED,
    "no-identity": grpc.StatusCode.UNAUTHENTICATED,
    str(OTHER_OWNER): grpc.StatusCode.PERMISSION_DENIED,
    str(CURATOR): grpc.StatusCode.PERMISSION_DENIED,
    str(ROGUE): grpc.StatusCode.PERMISSION_DENIED,
}
CATALOG_EXPECTED = {
    "ListSketchSpecs": _CATALOG_ANY,
    "GetSketchSpec": _CATALOG_ANY,
    "PublishSketch": {**_CATALOG_ANY, str(ALICE): grpc.StatusCode.PERMISSION_DENIED},
    "ListSketches": {**_CATALOG_ANY, str(OWNER): grpc.StatusCode.PERMISSION_DENIED},
}


def _expected(service: Any, method: str) -> dict[str, grpc.StatusCode]:
    if service is SKETCH_CATALOG_SERVICE:
        return CATALOG_EXPECTED[method]
    return EXPECTED[service.name]


@pytest.mark.parametrize("service", [s[0] for s in SERVICES], ids=lambda s: s.name)
def test_every_rpc_refuses_unauthorized_callers_before_its_handler(
    pems: dict[str, bytes | None], service: Any
) -> None:
    servicer = _servicers()[service.name]
    for method in service.methods:
        request = GetMessageClass(method.input_type)()
        for caller, code in _expected(service, method.name).items():
            context = FakeContext(pems[caller])
            _call(servicer, method, request, context)
            assert context.code == code, (method.name, caller, context.code, context.details)
            assert "Traceback" not in context.details


def test_refusals_say_who_was_refused_and_why(pems: dict[str, bytes | None]) -> None:
    authorizer = Authorizer({"curator": ("curator",)})
    with pytest.raises(UnauthenticatedError, match="no verified client certificate"):
        authorizer.authorize(FakeContext(None), ("curator",))  # type: ignore[arg-type]
    with pytest.raises(UnauthenticatedError, match=r"not usable.*URI"):
        authorizer.authorize(FakeContext(pems["no-identity"]), ("curator",))  # type: ignore[arg-type]
    with pytest.raises(PermissionDeniedError, match="consumer:alice may not call"):
        authorizer.authorize(FakeContext(pems[str(ALICE)]), ("curator",))  # type: ignore[arg-type]
    with pytest.raises(PermissionDeniedError, match="curator:rogue is not served here"):
        authorizer.authorize(FakeContext(pems[str(ROGUE)]), ("curator",))  # type: ignore[arg-type]
    # A role the service serves but the RPC does not admit.
    both = Authorizer({"curator": None, "consumer": None})
    with pytest.raises(PermissionDeniedError, match="allowed roles: curator"):
        both.authorize(FakeContext(pems[str(ALICE)]), ("curator",))  # type: ignore[arg-type]
    assert authorizer.authorize(FakeContext(pems[str(CURATOR)]), ("curator",)) == CURATOR  # type: ignore[arg-type]


def test_services_build_the_authorizers_their_policies_name(pems: dict[str, bytes | None]) -> None:
    security = TransportSecurity.plaintext()
    owner_side = owner_authorizer(("curator", "backup"), _mtls_placeholder())
    assert owner_side.allowed == {"curator": frozenset({"curator", "backup"})}
    assert owner_side.insecure_peer is None
    # Plaintext (--insecure only): every caller is taken to be the first curator named.
    assert owner_authorizer(("curator",), security).insecure_peer == CURATOR
    named = curator_authorizer(CuratorPolicy(consumers=("alice",)), _mtls_placeholder())
    assert named.allowed == {"consumer": frozenset({"alice"})}
    anyone = curator_authorizer(CuratorPolicy(), _mtls_placeholder())
    assert anyone.allowed == {"consumer": None}
    assert named.authorize(FakeContext(pems[str(ALICE)]), ("consumer",)) == ALICE  # type: ignore[arg-type]
    catalog = catalog_authorizer(
        CuratorPolicy(consumers=("alice",)), ("owner-0",), _mtls_placeholder(), INSECURE_CONSUMER
    )
    assert catalog.allowed == {
        "consumer": frozenset({"alice"}),
        "owner": frozenset({"owner-0"}),
    }
    # Plaintext: every caller is the insecure consumer, so nothing can be published.
    plain = catalog_authorizer(CuratorPolicy(), ("owner-0",), security, INSECURE_CONSUMER)
    assert plain.allowed == {"consumer": None} and plain.insecure_peer == INSECURE_CONSUMER


class _Mtls:
    """Stands in for an mTLS TransportSecurity where only ``insecure`` is read."""

    insecure = False


def _mtls_placeholder() -> TransportSecurity:
    return _Mtls()  # type: ignore[return-value]
