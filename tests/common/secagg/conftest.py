"""Fixtures of the secure-aggregation tests: site identities, reproducible byte sources, and a
round driven stage by stage so that a test can look at (or tamper with) every message."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from numpy.typing import NDArray

from dpmarket.common.secagg.crypto import EcdsaSigner, EcdsaVerifier
from dpmarket.common.secagg.fixedpoint import FixedPoint
from dpmarket.common.secagg.protocol import (
    KeyAdvertisement,
    RoundParams,
    SecAggAggregator,
    SecAggSite,
    UnmaskResponse,
)


@dataclass
class Identities:
    """Each site's ECDSA P-256 identity key (standing in for its mTLS certificate key) and a
    verifier that knows every site's public key (standing in for the deployment CA)."""

    keys: dict[str, ec.EllipticCurvePrivateKey]
    signers: dict[str, EcdsaSigner]
    verifier: EcdsaVerifier


def make_identities(sites: Iterable[str]) -> Identities:
    keys = {name: ec.generate_private_key(ec.SECP256R1()) for name in sites}
    return Identities(
        keys=keys,
        signers={name: EcdsaSigner(key) for name, key in keys.items()},
        verifier=EcdsaVerifier({name: key.public_key() for name, key in keys.items()}),
    )


def seeded_bytes(seed: int) -> Callable[[int], bytes]:
    """A reproducible stand-in for ``os.urandom`` (tests only: seeded PCG64, not a CSPRNG)."""
    return np.random.default_rng(seed).bytes


@dataclass
class Transcript:
    """Every message of one round, as the aggregator saw them."""

    advertisements: dict[str, KeyAdvertisement] = field(default_factory=dict)
    shares: dict[str, dict[str, bytes]] = field(default_factory=dict)
    routed: dict[str, dict[str, bytes]] = field(default_factory=dict)
    masked: dict[str, NDArray[np.uint64]] = field(default_factory=dict)
    survivors: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    signatures: dict[str, bytes] = field(default_factory=dict)
    responses: dict[str, UnmaskResponse] = field(default_factory=dict)
    result: NDArray[np.float64] | None = None


class Session:
    """One round with ``n`` sites named ``site-00``, ``site-01``, ..., driven by the test stage
    by stage (``advertise``, ``share``, ``mask``, ``check``, ``unmask``; :meth:`unmask` runs the
    consistency check first if the test did not).

    Reproducible: the round id, every site's key material and the rounding coins come from
    ``seed``; inputs are uniform on ``[-clip, clip]`` unless given; the sites' identities are
    fresh unless given (to run a second round between the same sites).
    """

    def __init__(
        self,
        n: int,
        threshold: int,
        vector_length: int = 64,
        *,
        colluders: int = 0,
        seed: int = 0,
        clip: float = 1.0,
        resolution_bits: int = 16,
        inputs: Mapping[str, NDArray[np.float64]] | None = None,
        identities: Identities | None = None,
    ) -> None:
        self.names = [f"site-{i:02d}" for i in range(n)]
        self.fixed_point = FixedPoint(clip, resolution_bits, n)
        self.params = RoundParams.create(
            self.names,
            threshold,
            vector_length,
            self.fixed_point,
            colluders=colluders,
            random_bytes=seeded_bytes(seed),
        )
        self.identities = identities or make_identities(self.names)
        data_rng = np.random.default_rng(seed + 10_000)
        self.inputs = (
            dict(inputs)
            if inputs is not None
            else {name: data_rng.uniform(-clip, clip, vector_length) for name in self.names}
        )
        self.sites = {
            name: SecAggSite(
                name,
                self.params,
                signer=self.identities.signers[name],
                verifier=self.identities.verifier,
                random_bytes=seeded_bytes(seed * 1000 + i + 1),
            )
            for i, name in enumerate(self.names)
        }
        self.aggregator = SecAggAggregator(self.params)
        self.rng = np.random.default_rng(seed + 20_000)
        self.transcript = Transcript()

    def advertise(self, drop: Iterable[str] = ()) -> dict[str, KeyAdvertisement]:
        t = self.transcript
        t.advertisements = {
            n: self.sites[n].advertise_keys() for n in self.names if n not in set(drop)
        }
        return self.aggregator.collect_advertisements(t.advertisements)

    def share(
        self, u1: Mapping[str, KeyAdvertisement], drop: Iterable[str] = ()
    ) -> dict[str, dict[str, bytes]]:
        t = self.transcript
        t.shares = {n: self.sites[n].share_keys(u1) for n in u1 if n not in set(drop)}
        t.routed = self.aggregator.route_shares(t.shares)
        return t.routed

    def mask(
        self, routed: Mapping[str, Mapping[str, bytes]], drop: Iterable[str] = ()
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        t = self.transcript
        t.masked = {
            n: self.sites[n].masked_input(routed[n], self.inputs[n], self.rng)
            for n in routed
            if n not in set(drop)
        }
        t.survivors, t.dropped = self.aggregator.collect_masked(t.masked)
        return t.survivors, t.dropped

    def check(self, drop: Iterable[str] = ()) -> dict[str, bytes]:
        t = self.transcript
        signed = {
            n: self.sites[n].check_consistency(t.survivors)
            for n in t.survivors
            if n not in set(drop)
        }
        t.signatures = self.aggregator.collect_signatures(signed)
        return t.signatures

    def unmask(self, drop: Iterable[str] = ()) -> NDArray[np.float64]:
        t = self.transcript
        if not t.signatures:
            self.check()
        t.responses = {
            n: self.sites[n].unmask(t.survivors, t.dropped, t.signatures)
            for n in t.signatures
            if n not in set(drop)
        }
        t.result = self.aggregator.finish(t.responses)
        return t.result

    def run(self, drop_at: Mapping[str, str] | None = None) -> NDArray[np.float64]:
        drops = dict(drop_at or {})

        def at(stage: str) -> list[str]:
            return [n for n, s in drops.items() if s == stage]

        u1 = self.advertise(at("advertise"))
        routed = self.share(u1, at("share"))
        self.mask(routed, at("mask"))
        self.check(at("check"))
        return self.unmask(at("unmask"))

    def expected_sum(self, included: Iterable[str]) -> NDArray[np.float64]:
        return np.sum([self.inputs[n] for n in included], axis=0)


@pytest.fixture
def session() -> Callable[..., Session]:
    """Factory: ``session(n, threshold, vector_length=64, seed=0, ...)``."""
    return Session


@pytest.fixture
def identities() -> Callable[[Iterable[str]], Identities]:
    """Factory: ``identities(site_ids)``."""
    return make_identities


@pytest.fixture
def byte_source() -> Callable[[int], Callable[[int], bytes]]:
    """Factory: ``byte_source(seed)``, a reproducible ``random_bytes``."""
    return seeded_bytes
