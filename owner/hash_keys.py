"""The owners' shared secret of the hashes mode, agreed among owners through the curator.

The less-trusted curator's session (:mod:`dpmarket.common.summarization.hashes`) needs a hash map
``(W, b)`` that every owner knows and the curator does not. The owners talk only through the
curator, so they agree on it like secure aggregation's sites agree on pairwise keys (Bonawitz et
al. 2017, Section 3), with the same primitives (:mod:`dpmarket.common.secagg.crypto`):

1. **Advertise.** Each owner draws an X25519 key pair for the session and signs
   ``(label, session, owner, public key)`` with its identity key (ECDSA P-256, the key of its
   certificate in a deployment). The curator collects the advertisements and sends them all to
   every owner.
2. **Distribute.** The owner with the smallest name among the advertisements it verified (every
   owner computes the same leader from the same signed list) draws the 32-byte secret from
   ``os.urandom`` and, for every other owner, encrypts it with AES-256-GCM under the key
   ``HKDF(X25519(leader, owner))`` bound to the session and both names, and signs the
   ciphertext. The curator forwards each envelope to its recipient.
3. **Receive.** Each owner verifies the leader's advertisement and envelope signatures, derives
   the pairwise key and decrypts. Every owner then holds the secret; the curator has seen public
   keys, signatures and ciphertexts only.

Security argument (honest-but-curious curator): the secret is encrypted under Diffie-Hellman
keys between owners, so the relay learns nothing of it (the DH assumption and AES-GCM's
confidentiality). An active curator cannot substitute its own X25519 key for an owner's: every
public key and envelope is signed by an identity key it does not hold, and a signature over the
session id and the names stops replays into another session or to another owner. It can drop
owners (those get no secret and cannot propose hashes), never learn the secret, unless an owner
colludes with it, which defeats the mode (stated in :mod:`dpmarket.common.summarization.hashes`).

The secret is kept per session after the session closes, so that the owner can later hash the
consumer's new points under the same map (:meth:`HashKeyParty.params`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError
from dpmarket.common.secagg.crypto import (
    SecAggError,
    Signer,
    Verifier,
    decrypt,
    encode_fields,
    encrypt,
    generate_private_key,
    public_key_bytes,
    shared_key,
)
from dpmarket.common.summarization.hashes import (
    SECRET_BYTES,
    HashAdvert,
    hash_key_id,
    hash_parameters,
    leader_of,
)
from dpmarket.common.summarization.rff import RFFParams

__all__ = ["HashKeyParty"]

_ADVERT = b"dpmarket hash advert v1"
_ENVELOPE = b"dpmarket hash envelope v1"
_KEY_INFO = b"dpmarket hash key v1"


class HashKeyParty:
    """One owner's side of the agreement, and the secrets it holds per session.

    Parameters
    ----------
    name : str
        The owner's name (its certificate's).
    signer : Signer
        Signs with the owner's identity key.
    verifier : Verifier
        Verifies the other owners' identity signatures (their certificates' keys).
    random_bytes : callable
        Key material (``os.urandom``; tests inject a seeded source).
    """

    def __init__(
        self,
        name: str,
        signer: Signer,
        verifier: Verifier,
        *,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.name = name
        self.signer = signer
        self.verifier = verifier
        self.random_bytes = random_bytes
        self._keys: dict[str, X25519PrivateKey] = {}
        self._secrets: dict[str, bytes] = {}

    def advertise(self, session: str) -> HashAdvert:
        """Step 1: a fresh X25519 key for ``session``, signed."""
        key = generate_private_key(self.random_bytes)
        self._keys[session] = key
        public = public_key_bytes(key)
        message = encode_fields(_ADVERT, session.encode(), self.name.encode(), public)
        return HashAdvert(self.name, public, self.signer.sign(message))

    def _verified(self, session: str, adverts: Mapping[str, HashAdvert]) -> dict[str, bytes]:
        out = {}
        for owner, advert in adverts.items():
            if advert.owner != owner:
                raise InvalidArgumentError(f"advert of {advert.owner!r} listed as {owner!r}")
            message = encode_fields(_ADVERT, session.encode(), owner.encode(), advert.public_key)
            self.verifier.verify(owner, message, advert.signature)
            out[owner] = advert.public_key
        if self.name not in out:
            raise InvalidArgumentError(f"the adverts do not list this owner ({self.name})")
        return out

    def _pair_key(self, session: str, peer_public: bytes, leader: str, recipient: str) -> bytes:
        """The leader-recipient key, bound to the session and both names (same at both ends)."""
        key = self._keys.get(session)
        if key is None:
            raise FailedPreconditionError("this owner has not advertised a key for the session")
        info = encode_fields(_KEY_INFO, session.encode(), leader.encode(), recipient.encode())
        return shared_key(key, peer_public, info=info)

    def distribute(
        self, session: str, adverts: Mapping[str, HashAdvert]
    ) -> dict[str, tuple[bytes, bytes]]:
        """Step 2 (the leader): draw the secret; return ``{owner: (ciphertext, signature)}``.

        Raises
        ------
        InvalidArgumentError
            If an advertisement does not verify or this owner is not the leader.
        """
        try:
            publics = self._verified(session, adverts)
        except SecAggError as exc:
            raise InvalidArgumentError(str(exc)) from None
        leader = leader_of(adverts)
        if leader != self.name:
            raise InvalidArgumentError(f"{leader} draws the secret, not {self.name}")
        secret = self.random_bytes(SECRET_BYTES)
        self._secrets[session] = secret
        envelopes = {}
        for owner, public in sorted(publics.items()):
            if owner == self.name:
                continue
            key = self._pair_key(session, public, leader, owner)
            ad = encode_fields(_ENVELOPE, session.encode(), leader.encode(), owner.encode())
            ciphertext = encrypt(key, secret, ad, random_bytes=self.random_bytes)
            envelopes[owner] = (ciphertext, self.signer.sign(encode_fields(ad, ciphertext)))
        return envelopes

    def receive(
        self, session: str, adverts: Mapping[str, HashAdvert], envelope: tuple[bytes, bytes]
    ) -> str:
        """Step 3: verify and decrypt the leader's envelope; return the secret's public id.

        Raises
        ------
        InvalidArgumentError
            If a signature does not verify or the ciphertext does not decrypt.
        """
        try:
            publics = self._verified(session, adverts)
            leader = leader_of(adverts)
            ciphertext, signature = envelope
            ad = encode_fields(_ENVELOPE, session.encode(), leader.encode(), self.name.encode())
            self.verifier.verify(leader, encode_fields(ad, ciphertext), signature)
            key = self._pair_key(session, publics[leader], leader, self.name)
            secret = decrypt(key, ciphertext, ad)
        except SecAggError as exc:
            raise InvalidArgumentError(str(exc)) from None
        if len(secret) != SECRET_BYTES:
            raise InvalidArgumentError(f"the secret must be {SECRET_BYTES} bytes")
        self._secrets[session] = secret
        return hash_key_id(secret)

    def key_id(self, session: str) -> str:
        """The public id of the session's secret (:func:`hash_key_id`)."""
        return hash_key_id(self._secret(session))

    def params(self, key_id: str, n_features: int, d: int, gamma: float) -> RFFParams:
        """The hash map of the session whose secret has public id ``key_id``.

        Raises
        ------
        FailedPreconditionError
            If this owner holds no secret with that id.
        """
        for secret in self._secrets.values():
            if hash_key_id(secret) == key_id:
                return hash_parameters(secret, n_features, d, gamma)
        raise FailedPreconditionError(f"this owner holds no hash key {key_id!r}")

    def _secret(self, session: str) -> bytes:
        secret = self._secrets.get(session)
        if secret is None:
            raise FailedPreconditionError("the session's hash key has not been agreed")
        return secret
