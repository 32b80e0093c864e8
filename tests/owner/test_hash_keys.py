"""The hashes mode: the owners' secret map, agreed through a curator that never learns it."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError
from dpmarket.common.secagg.crypto import EcdsaSigner, EcdsaVerifier
from dpmarket.common.summarization.hashes import (
    HashAdvert,
    hash_key_id,
    hash_parameters,
    hash_points,
    leader_of,
)
from dpmarket.owner.hash_keys import HashKeyParty

NAMES = ("owner-b", "owner-a", "owner-c")


def _parties() -> dict[str, HashKeyParty]:
    keys = {n: ec.generate_private_key(ec.SECP256R1()) for n in NAMES}
    verifier = EcdsaVerifier({n: k.public_key() for n, k in keys.items()})
    return {n: HashKeyParty(n, EcdsaSigner(keys[n]), verifier) for n in NAMES}


def _agree(parties: dict[str, HashKeyParty], session: str = "s1") -> list[bytes]:
    """Run the agreement as the curator relays it; return every message it relayed."""
    adverts = {n: p.advertise(session) for n, p in parties.items()}
    leader = leader_of(adverts)
    envelopes = parties[leader].distribute(session, adverts)
    for name, party in parties.items():
        if name != leader:
            party.receive(session, adverts, envelopes[name])
    relayed = [a.public_key + a.signature for a in adverts.values()]
    relayed += [c + s for c, s in envelopes.values()]
    return relayed


def test_every_owner_derives_the_same_map_and_the_relay_never_sees_the_secret() -> None:
    parties = _parties()
    relayed = _agree(parties)
    ids = {p.key_id("s1") for p in parties.values()}
    assert len(ids) == 1
    secret = parties["owner-a"]._secrets["s1"]  # the leader's draw
    assert all(secret not in message for message in relayed)
    key_id = ids.pop()
    maps = [p.params(key_id, 3, 64, 0.5) for p in parties.values()]
    for other in maps[1:]:
        np.testing.assert_array_equal(other.omega, maps[0].omega)
        np.testing.assert_array_equal(other.phase, maps[0].phase)


def test_a_substituted_key_or_envelope_is_refused() -> None:
    parties = _parties()
    adverts = {n: p.advertise("s1") for n, p in parties.items()}
    # The relay swaps in its own X25519 key for owner-c: the signature no longer verifies.
    forged = dict(adverts)
    forged["owner-c"] = HashAdvert("owner-c", os.urandom(32), adverts["owner-c"].signature)
    with pytest.raises(InvalidArgumentError, match="owner-c"):
        parties["owner-a"].distribute("s1", forged)
    envelopes = parties["owner-a"].distribute("s1", adverts)
    ciphertext, signature = envelopes["owner-b"]
    tampered = (bytes([ciphertext[0] ^ 1]) + ciphertext[1:], signature)
    with pytest.raises(InvalidArgumentError):
        parties["owner-b"].receive("s1", adverts, tampered)
    # An envelope for owner-b replayed to owner-c, or into another session, does not open.
    with pytest.raises(InvalidArgumentError):
        parties["owner-c"].receive("s1", adverts, envelopes["owner-b"])
    with pytest.raises(InvalidArgumentError):
        parties["owner-b"].receive("s2", adverts, envelopes["owner-b"])
    with pytest.raises(FailedPreconditionError, match="no hash key"):
        parties["owner-b"].params("0" * 32, 3, 8, 0.5)
    # Only the leader draws.
    with pytest.raises(InvalidArgumentError, match="owner-a draws"):
        parties["owner-b"].distribute("s1", adverts)


def test_the_map_is_deterministic_and_has_the_laws_of_h1() -> None:
    secret = bytes(range(32))
    a = hash_parameters(secret, 4, 5000, 0.2)
    b = hash_parameters(secret, 4, 5000, 0.2)
    np.testing.assert_array_equal(a.omega, b.omega)
    assert not np.array_equal(a.omega, hash_parameters(bytes(32), 4, 5000, 0.2).omega)
    # omega ~ N(0, 2 gamma): mean and variance within 4 standard errors (n = 20,000).
    w = a.omega.ravel()
    assert abs(w.mean()) < 4 * np.sqrt(0.4 / w.size)
    assert abs(w.var() - 0.4) < 4 * 0.4 * np.sqrt(2 / w.size)
    assert a.phase.min() >= 0 and a.phase.max() < 2 * np.pi
    # h1(x) . h1(y) estimates the RBF kernel (d = 5000: error sd about 0.01; bound 0.05).
    x = np.random.default_rng(0).normal(size=(6, 4))
    h = hash_points(x, a)
    exact = np.exp(-0.2 * ((x[:, None] - x[None]) ** 2).sum(-1))
    assert np.abs(h @ h.T - exact).max() < 0.05
    assert hash_key_id(secret) != hash_key_id(bytes(32))
    with pytest.raises(ValueError, match="32 bytes"):
        hash_parameters(b"short", 4, 10, 0.2)
