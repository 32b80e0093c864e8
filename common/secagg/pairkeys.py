"""Long-lived pairwise keys of secure aggregation: each site's static X25519 key, bound once to
its identity, and the pair keys ``K_uv`` it gives, from which every round derives its own keys.

A round of :mod:`dpmarket.common.secagg.protocol` or :mod:`dpmarket.common.secagg.sparse` needs,
for every pair of sites ``{u, v}`` that exchange shares, (i) a key to encrypt the Shamir shares
``u`` sends ``v`` (Bonawitz et al.'s ``c`` keys) and (ii) a way for ``v`` to know that the
pairwise-mask public key (and, on a sparse graph, the graph-nonce commitment) that the curator
shows it as ``u``'s is really ``u``'s (Bonawitz et al.'s signed advertisements). Both used to cost
public-key operations every round: an X25519 agreement on fresh ``c`` keys per directed pair and
an ECDSA P-256 verification per advertisement a site checks (at S = 100 on the SecAgg+ graph of a
CAPE job: 3,380 of each, 0.56 s of a 1.43 s round). Here both come from one long-lived secret per
pair, computed once for a site's life:

* every site holds a **static X25519 key** (:class:`StaticKey`, drawn in memory when the site
  starts, never written to disk), **bound to its identity once**: the site signs
  :func:`binding_message` ``(deployment, site, static_public)`` with its identity key (the
  owner's certificate key, which every peer pins in its roster). The binding travels in the key
  advertisement of every round (``KeyAdvertisement.c_public`` and ``.signature``, unchanged from
  one round to the next); a peer verifies it the first time it sees it and remembers the result
  (:class:`PairKeyring`), so the ECDSA verification happens once per pair and static key, not
  once per round;
* the **pair key** ``K_uv = HKDF-SHA256(X25519(static_u, static_v), info = (label, deployment,
  both site names, both static keys))``, computed once per pair and static key and cached;
* every round derives from it, by HKDF-Expand with the round id (:meth:`PairKeyring.round_keys`),
  three keys of that pair and round: ``adv`` (an HMAC-SHA256 key: ``u`` tags its advertisement,
  as it made it, for ``v``: :func:`dpmarket.common.secagg.base.advertisement_tag_message`),
  ``enc`` (AES-256-GCM of the shares ``u`` and ``v`` send each other) and ``tag`` (SecAgg+'s
  acknowledgements and survivor-list attestations).

The pairwise-mask key ``s_u`` stays **ephemeral**: drawn afresh every round, because when ``u`` is
lost after sharing its mask key is rebuilt from shares and handed to the curator. A long-lived
mask key would then unmask ``u``'s inputs of every later round.

Security argument
-----------------
*What each key protects.* The binding signature ties the static public key to the site's pinned
identity key, so no party without that identity key (the curator included, even one that can
issue certificates: the roster pins keys, not names) can make a peer accept a static key as
``u``'s. ``K_uv`` is an X25519 secret of two such keys: only ``u`` and ``v`` can compute it; the
curator, which routes every message, never holds a pair key. ``adv`` authenticates, per round and
per direction, the one thing the curator could otherwise substitute: the per-round mask public key
and graph-nonce commitment it shows ``v`` as ``u``'s (a substituted mask key would give the
curator ``u``'s pairwise mask with ``v``). ``enc`` keeps the shares secret and authentic between
``u`` and ``v`` exactly as the ``c``-key agreement did, and ``tag`` gives SecAgg+'s pairwise
attestations the same keys-only-two-sites-hold property it had.

*Why nothing replays across rounds.* The three keys of a round are HKDF-Expand outputs of ``K_uv``
under an ``info`` that holds the round id (fresh random bytes per round, at least 16); keys of
different rounds are independent pseudorandom values. A tag or ciphertext recorded in one round
therefore verifies under no key of another round, whatever the curator replays: an old
advertisement (e.g. of a round in which ``u`` was lost and its old mask key rebuilt, which the
curator now knows), old shares, old acknowledgements or attestations. Each tagged message also
names its sender and recipient (so a tag is not reflected back to its maker) and is bound to its
purpose by a label. Within a round, each key is used by exactly one pair: ``adv`` tags two
messages (one per direction, different names), ``enc`` encrypts two (random 96-bit nonces,
different associated data).

*What a compromised static key exposes.* Whoever learns ``u``'s static private key can compute
``K_uv`` for every peer ``v``: with the curator's transcript it reads the shares ``u`` received and
sent in every round under that key (past rounds included: there is no forward secrecy within one
static key's life) and can forge ``u``'s advertisements and tags toward any peer. That is exactly
what a colluding site ``u`` gives the curator (its shares, and its own behaviour), so a
compromised static key counts as one of the round's ``S_C`` colluders: rounds with at most
``S_C`` colluders and compromised keys together keep their guarantee (each secret needs ``t`` (or
``t_v``) shares, more than ``S_C``); it never yields another site's pair key, since ``K_vw`` needs
``v``'s or ``w``'s static private key.

*Rotation.* :meth:`PairKeyring.rotate` draws a new static key, signs its binding and erases the
old private key and every pair key derived from it (a round already running keeps the generation
it advertised); a site restart rotates too (the key lives in memory only). Peers verify the new
binding on first sight and derive new pair keys; what a later leak of the new key exposes starts
at the rotation. A rotated-out key that leaked *before* it was erased can still be presented as
``u``'s (its binding signature stays valid): recovering from it is recovering from a compromised
identity key (a new certificate key and new roster pins), which invalidates every binding of the
old identity key.

References
----------
Bonawitz et al. (CCS 2017), Section 3 (``KA``, ``AE``, ``SIG``) and Figure 4; Bell et al. (CCS
2020), Section 3 (SecAgg+ with pre-shared pairwise keys from a PKI); RFC 7748 (X25519), RFC 5869
(HKDF), RFC 2104 (HMAC).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand

from dpmarket.common.secagg.crypto import (
    KEY_BYTES,
    RandomBytes,
    SecAggError,
    Signer,
    Verifier,
    encode_fields,
    generate_private_key,
    public_key_bytes,
)

__all__ = [
    "PairKeyring",
    "RoundPairKeys",
    "StaticKey",
    "binding_message",
]

_BINDING_LABEL = b"dpmarket/secagg/v2/static-key-binding"
_PAIR_KEY_LABEL = b"dpmarket/secagg/v2/pair-key"
_ROUND_KEYS_LABEL = b"dpmarket/secagg/v2/round-pair-keys"

_SHA256 = hashes.SHA256()


def binding_message(deployment: bytes, site: str, static_public: bytes) -> bytes:
    """What a site signs, once per static key, to bind it to its identity.

    ``encode_fields(label, deployment, site (UTF-8), static_public)``: the label keeps the
    signature from being valid for any other message (a survivor list), the site name from being
    presented as another site's, the deployment from being carried to another deployment.
    """
    return encode_fields(_BINDING_LABEL, deployment, site.encode(), static_public)


@dataclass(frozen=True)
class RoundPairKeys:
    """The keys of one pair of sites in one round (32 bytes each), from
    :meth:`PairKeyring.round_keys`.

    Attributes
    ----------
    adv : bytes
        HMAC-SHA256 key of the advertisement tags
        (:func:`dpmarket.common.secagg.base.advertisement_tag_message`).
    enc : bytes
        AES-256-GCM key of the shares the two sites send each other.
    tag : bytes
        HMAC-SHA256 key of SecAgg+'s acknowledgements and survivor-list attestations.
    """

    adv: bytes
    enc: bytes
    tag: bytes


class StaticKey:
    """One generation of a site's static X25519 key: the private key, its public key, the
    signature binding it to the site's identity, and the pair keys derived from it.

    Made by :class:`PairKeyring`; a round holds the generation it advertised.

    Parameters
    ----------
    site : str
        The site's id.
    deployment : bytes
        As :class:`PairKeyring`'s.
    signer : Signer
        Signs :func:`binding_message` once, now, with the site's identity key.
    random_bytes : callable
        Source of the 32 bytes of the private key.
    """

    def __init__(self, site: str, deployment: bytes, signer: Signer, random_bytes: RandomBytes):
        self.site = site
        self.deployment = deployment
        self._private: X25519PrivateKey | None = generate_private_key(random_bytes)
        self.public = public_key_bytes(self._private)
        self.signature = signer.sign(binding_message(deployment, site, self.public))
        self._pairs: dict[tuple[str, bytes], bytes] = {}
        self._lock = threading.Lock()

    def erase(self) -> None:
        """Forget the private key and every pair key (rotation); later derivations fail."""
        with self._lock:
            self._private = None
            self._pairs.clear()

    def pair_key(self, peer: str, peer_public: bytes) -> bytes:
        """``K_uv`` with ``peer``'s static key ``peer_public`` (whose binding the caller has
        verified), computed once and cached.

        Raises
        ------
        SecAggError
            If ``peer_public`` is not 32 bytes, is this site's own key or a low-order point, or
            this generation was erased.
        """
        with self._lock:
            found = self._pairs.get((peer, peer_public))
            private = self._private
        if found is not None:
            return found
        if private is None:
            raise SecAggError(f"the static key of {self.site!r} was rotated; start a new round")
        if len(peer_public) != KEY_BYTES:
            raise SecAggError(f"an X25519 public key is {KEY_BYTES} bytes, got {len(peer_public)}")
        if peer == self.site or peer_public == self.public:
            raise SecAggError(f"a pair key of {self.site!r} with itself was asked for")
        try:
            secret = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
        except ValueError as exc:
            raise SecAggError(f"key agreement with {peer!r} failed: {exc}") from None
        (low, low_key), (high, high_key) = sorted([(self.site, self.public), (peer, peer_public)])
        info = encode_fields(
            _PAIR_KEY_LABEL, self.deployment, low.encode(), high.encode(), low_key, high_key
        )
        key = HKDF(algorithm=_SHA256, length=KEY_BYTES, salt=None, info=info).derive(secret)
        with self._lock:
            if self._private is not None:
                self._pairs[peer, peer_public] = key
        return key


class PairKeyring:
    """A site's long-lived pairwise keys: its static key (rotatable), the peers' static keys whose
    binding it has verified, and the per-round keys of each pair.

    One per site for the life of its process (the owner's :class:`dpmarket.owner.secagg.
    SiteIdentity` holds it); every round of every job uses it. Thread-safe.

    Parameters
    ----------
    site : str
        This site's id.
    signer : Signer
        Signs the binding of each static key with the site's identity key.
    deployment : bytes, default b""
        Names the deployment in bindings and pair keys (the service: the SHA-256 of its CA
        certificate), so neither carries over to another deployment.
    random_bytes : callable, optional
        Source of the static keys (``os.urandom`` by default; tests inject a seeded source).

    Notes
    -----
    The module docstring has the security argument: what each key protects, why the round id
    stops replays, what a compromised static key exposes, and how rotation works.
    """

    def __init__(
        self,
        site: str,
        signer: Signer,
        *,
        deployment: bytes = b"",
        random_bytes: RandomBytes = os.urandom,
    ) -> None:
        self.site = site
        self.deployment = deployment
        self._signer = signer
        self._random_bytes = random_bytes
        self._verified: set[tuple[str, bytes, bytes]] = set()
        self._lock = threading.Lock()
        self._current = StaticKey(site, deployment, signer, random_bytes)
        self._rounds: set[bytes] = set()

    @property
    def current(self) -> StaticKey:
        """The static key new rounds advertise."""
        return self._current

    def rotate(self) -> StaticKey:
        """Draw and bind a new static key; erase the previous one and its pair keys.

        A round that advertised the previous key cannot derive pair keys any more and aborts;
        rotate between rounds. Returns the new key.
        """
        fresh = StaticKey(self.site, self.deployment, self._signer, self._random_bytes)
        with self._lock:
            old, self._current = self._current, fresh
            self._rounds = set()
        old.erase()
        return fresh

    def claim_round(self, round_id: bytes) -> None:
        """Record that this site takes part in round ``round_id`` under its current static key;
        refuse an id it has taken part in already (in any job).

        A round's pair keys are a function of the pair key and the round id alone
        (:meth:`round_keys`), so under a repeated id every message of the earlier round --
        a peer's advertisement with its tag, its share ciphertexts -- would verify again, and
        a curator that rebuilt a dropped peer's mask key in that round would learn this site's
        mask with it. The curator chooses round ids: each is therefore used at most once per
        static key (the set is emptied by :meth:`rotate`, whose new key makes new pair keys).

        Raises
        ------
        SecAggError
            If ``round_id`` was claimed before under the current static key.
        """
        with self._lock:
            if round_id in self._rounds:
                raise SecAggError(
                    f"round {round_id.hex()[:8]}… was run before under this site's static key: "
                    "a round id is used once"
                )
            self._rounds.add(bytes(round_id))

    def check_binding(
        self, peer: str, peer_public: bytes, signature: bytes, verifier: Verifier
    ) -> None:
        """Return if ``signature`` binds ``peer_public`` to ``peer``'s identity; raise otherwise.

        Verified with ``verifier`` the first time this (peer, key, signature) is seen, then
        remembered for the keyring's life: one ECDSA verification per peer and static key.

        Raises
        ------
        SecAggError
            If the signature does not verify under ``peer``'s identity key.
        """
        entry = (peer, bytes(peer_public), bytes(signature))
        with self._lock:
            if entry in self._verified:
                return
        try:
            verifier.verify(peer, binding_message(self.deployment, peer, peer_public), signature)
        except Exception as exc:
            raise SecAggError(
                f"the key advertisement of {peer!r} is not signed by {peer!r}: its static key's "
                f"binding does not verify ({exc})"
            ) from None
        with self._lock:
            self._verified.add(entry)

    def pair_key(
        self, peer: str, peer_public: bytes, signature: bytes, verifier: Verifier
    ) -> bytes:
        """``K_uv`` of this site's current static key with ``peer``'s ``peer_public``, once its
        binding (``signature``) is checked: :meth:`check_binding`, then
        :meth:`StaticKey.pair_key`. Both are remembered, so a site pays one ECDSA verification
        and one X25519 agreement per peer for its static key's life.

        Raises
        ------
        SecAggError
            As :meth:`check_binding` and :meth:`StaticKey.pair_key`.
        """
        self.check_binding(peer, peer_public, signature, verifier)
        return self._current.pair_key(peer, peer_public)

    @staticmethod
    def round_keys(pair_key: bytes, round_id: bytes, a: str, b: str) -> RoundPairKeys:
        """The keys of the pair ``{a, b}`` in round ``round_id``:
        ``HKDF-Expand(K_ab, info = (label, round_id, both names in order), 96 bytes)`` cut into
        ``adv``, ``enc`` and ``tag`` (independent pseudorandom keys; RFC 5869)."""
        low, high = (a, b) if a <= b else (b, a)
        info = encode_fields(_ROUND_KEYS_LABEL, round_id, low.encode(), high.encode())
        material = HKDFExpand(algorithm=_SHA256, length=3 * KEY_BYTES, info=info).derive(pair_key)
        return RoundPairKeys(
            material[:KEY_BYTES], material[KEY_BYTES : 2 * KEY_BYTES], material[2 * KEY_BYTES :]
        )
