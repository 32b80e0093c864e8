"""What a round of secure aggregation does the same on the complete graph and on SecAgg+'s sparse
graph: the stages, a site's key pairs, secret sharing and masking, and the aggregator's unmasking.

:class:`SiteBase` and :class:`AggregatorBase` hold that shared work once;
:class:`dpmarket.common.secagg.protocol.SecAggSite` / ``SecAggAggregator`` (Bonawitz et al., CCS
2017, every site shares with and masks with every other) and
:class:`dpmarket.common.secagg.sparse.SparseSecAggSite` / ``SparseSecAggAggregator`` (Bell et al.,
CCS 2020, neighbours in a random graph) are small subclasses that say who the holders and peers
are, what their thresholds are and how the survivor list is checked. The helpers below (per-pair
context strings, stage checks, the rounding coins' checks, a phase timer) serve both.

**Keys.** A site's per-round secrets are its pairwise-mask key ``s_u`` and self-mask seed ``b_u``,
both drawn afresh each round (``s_u`` is rebuilt from shares if the site is lost, so it must never
outlive its round). What each pair of sites needs to talk through the curator — encrypting the
shares, and authenticating to each other the mask key and graph-nonce commitment each advertised
— comes from the long-lived pair keys of :mod:`dpmarket.common.secagg.pairkeys`, derived per round
with the round id: an advertisement carries the site's static key and the signature binding it
to the site's identity (verified once per peer and cached), and each share message a site sends a
holder is ``adv_tag || AEAD ciphertext``, where ``adv_tag`` is the HMAC under the pair's ``adv``
key of the round of the sender's own advertisement (:func:`advertisement_message`, directed to
the holder) and the ciphertext is AES-256-GCM under the pair's ``enc`` key of the round. A holder
checks the tag against the advertisement the curator showed it before it masks with the sender;
a mismatch (a substituted or replayed mask key or commitment) aborts the round at that holder
before anything depends on its input. The argument (what each key protects, replay, compromise,
rotation) is in :mod:`dpmarket.common.secagg.pairkeys`.
"""

from __future__ import annotations

import enum
import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.secagg import shamir
from dpmarket.common.secagg.crypto import (
    KEY_BYTES,
    EcdsaSigner,
    EcdsaVerifier,
    MaskAccumulator,
    RandomBytes,
    SecAggError,
    Signer,
    Verifier,
    check_tag,
    decrypt,
    encode_fields,
    encrypt,
    generate_private_key,
    mac_tag,
    private_key_bytes,
    private_key_from_bytes,
    public_key_bytes,
    shared_key,
)
from dpmarket.common.secagg.fixedpoint import dequantize_sum, quantize
from dpmarket.common.secagg.pairkeys import PairKeyring, RoundPairKeys, StaticKey
from dpmarket.common.secagg.shamir import Share

if TYPE_CHECKING:
    from dpmarket.common.secagg.params import RoundParams

__all__ = [
    "ADV_TAG_BYTES",
    "MASK_KEY_LABEL",
    "SHARE_PAIR_BYTES",
    "AggregatorBase",
    "PhaseTimer",
    "RoundStage",
    "SiteBase",
    "advertisement_message",
    "advertisement_tag_message",
    "check_stage",
    "check_vector",
    "encoded_prefix",
    "pair_info",
    "prepare_run",
    "randbelow_from",
    "share_associated_data",
]

#: HKDF label of a pairwise mask key (Bonawitz et al.'s ``s_uv``).
MASK_KEY_LABEL = b"dpmarket/secagg/v1/pairwise-mask"
#: Associated-data label of a share ciphertext.
_SHARE_AD_LABEL = b"dpmarket/secagg/v1/share"
#: Plaintext of one share ciphertext: the recipient's share of the sender's self-mask seed,
#: then its share of the sender's pairwise-mask private key.
SHARE_PAIR_BYTES = 2 * shamir.SHARE_BYTES
#: Bytes of the advertisement tag that leads every share message (HMAC-SHA256).
ADV_TAG_BYTES = 32
#: Domain-separation labels of the advertisement and of its per-pair tag.
_ADVERTISE_LABEL = b"dpmarket/secagg/v1/advertise"
_ADV_TAG_LABEL = b"dpmarket/secagg/v2/advertisement-tag"


class RoundStage(enum.Enum):
    """Where a site or an aggregator is in the round."""

    NEW = "new"
    ADVERTISED = "advertised"
    SHARED = "shared"
    REVEALED = "revealed"
    MASKED = "masked"
    CHECKED = "checked"
    DONE = "done"
    ABORTED = "aborted"


@functools.lru_cache(maxsize=64)
def encoded_prefix(*fields: bytes) -> bytes:
    """``encode_fields(*fields)``, kept: the leading fields a round's per-pair messages share (a
    label, the round id, ...). ``encode_fields(*a) + encode_fields(*b) == encode_fields(*a, *b)``,
    so a message is its prefix and the encoding of its own fields. Holds public bytes only."""
    return encode_fields(*fields)


def pair_info(label: bytes, round_id: bytes, a: str, b: str) -> bytes:
    """HKDF info for the key of the unordered pair {a, b} in this round."""
    low, high = (a, b) if a <= b else (b, a)
    return encoded_prefix(label, round_id) + encode_fields(low.encode(), high.encode())


def advertisement_message(
    round_id: bytes, site: str, c_public: bytes, s_public: bytes, commitment: bytes = b""
) -> bytes:
    """The bytes that stand for a site's advertisement of one round (Bonawitz et al. 2017,
    Figure 4, Round 0).

    ``encode_fields(label, round_id, site (UTF-8), c_public, s_public)``, and the graph-nonce
    commitment last in sparse rounds. Authenticated to each holder by
    :func:`advertisement_tag_message` (binding the round id stops the replay of an advertisement
    from another round; the site id stops one site's keys being presented as another's; the
    commitment fixes the site's contribution to the graph seed).
    """
    prefix = encoded_prefix(_ADVERTISE_LABEL, round_id)
    if commitment:
        return prefix + encode_fields(site.encode(), c_public, s_public, commitment)
    return prefix + encode_fields(site.encode(), c_public, s_public)


def advertisement_tag_message(
    round_id: bytes,
    sender: str,
    recipient: str,
    c_public: bytes,
    s_public: bytes,
    commitment: bytes = b"",
) -> bytes:
    """What ``sender`` tags for ``recipient`` under their ``adv`` key of the round: its own
    :func:`advertisement_message`, addressed (so that a tag is valid for one direction of one
    pair, and never reflected to its maker)."""
    return _addressed(
        recipient, advertisement_message(round_id, sender, c_public, s_public, commitment)
    )


def _addressed(recipient: str, advertisement: bytes) -> bytes:
    """:func:`advertisement_tag_message` from the sender's :func:`advertisement_message`."""
    return encoded_prefix(_ADV_TAG_LABEL) + encode_fields(recipient.encode()) + advertisement


def share_associated_data(round_id: bytes, sender: str, recipient: str) -> bytes:
    """Associated data of the share ciphertext ``sender`` addresses to ``recipient``."""
    prefix = encoded_prefix(_SHARE_AD_LABEL, round_id)
    return prefix + encode_fields(sender.encode(), recipient.encode())


#: Bytes :func:`randbelow_from` asks its source for at a time (one call serves a sharing's
#: coefficients: 66 bytes each for the field of :mod:`dpmarket.common.secagg.shamir`).
_RANDOM_CHUNK_BYTES = 4096


def randbelow_from(random_bytes: RandomBytes) -> Callable[[int], int]:
    """Uniform integers in ``[0, bound)`` by rejection sampling from ``random_bytes``.

    The bytes are drawn :data:`_RANDOM_CHUNK_BYTES` at a time and used in order, each once (a
    call of ``os.urandom`` per coefficient cost as much as the polynomial's evaluation); what is
    left when the function is dropped is never used.
    """
    pool = b""
    used = 0

    def take(n_bytes: int) -> bytes:
        nonlocal pool, used
        if used + n_bytes > len(pool):
            fresh = random_bytes(max(n_bytes, _RANDOM_CHUNK_BYTES))
            if len(fresh) < n_bytes:
                raise ValueError(f"random_bytes returned {len(fresh)} bytes, below {n_bytes}")
            pool, used = pool[used:] + fresh, 0
        used += n_bytes
        return pool[used - n_bytes : used]

    def randbelow(bound: int) -> int:
        bits = bound.bit_length()
        n_bytes = (bits + 7) // 8
        while True:
            value = int.from_bytes(take(n_bytes), "big") >> (8 * n_bytes - bits)
            if value < bound:
                return value

    return randbelow


def check_stage(actual: RoundStage, expected: RoundStage, what: str) -> None:
    """Raise :class:`FailedPreconditionError` unless a party is at ``expected`` for ``what``."""
    if actual is not expected:
        raise FailedPreconditionError(
            f"{what} needs stage {expected.value!r}, but the round is at {actual.value!r}"
        )


def check_vector(vector: ArrayLike, length: int) -> NDArray[np.float64]:
    """A site's input as float64; :class:`ValueError` unless its shape is ``(length,)``."""
    values = np.asarray(vector, dtype=np.float64)
    if values.shape != (length,):
        raise ValueError(f"input vector must have shape ({length},), got {values.shape}")
    return values


class SiteBase:
    """One site's side of a round: the work the complete and the sparse graph share.

    A subclass sets :attr:`_STRANGER` (how its error messages name a legitimate sender of
    shares) and implements :meth:`_own_x`, :meth:`_advertisement` and :meth:`_check_u2`; it may
    extend :meth:`_abort`, :meth:`_keep_pair_keys` and :meth:`_masked_with`.

    Parameters
    ----------
    site : str
        This site's id; one of ``params.sites``.
    params : RoundParams
    signer : Signer
        Signs this site's messages with its identity key.
    verifier : Verifier
        Checks other sites' signatures (their static keys' bindings included) against their
        identities.
    random_bytes : callable, optional
        Source of all key material, the Shamir coefficients and the AEAD nonces (``os.urandom``
        by default; tests inject a deterministic source to reproduce a round bit for bit).
    keyring : PairKeyring, optional
        The site's long-lived pair keys (:mod:`dpmarket.common.secagg.pairkeys`), shared by all
        its rounds; the round uses its current static key. By default a keyring of its own, with
        a static key drawn from ``random_bytes`` and bound with ``signer`` (one round's life: a
        service passes the owner's).

    Raises
    ------
    ValueError
        If ``site`` is not in ``params.sites``.
    """

    _STRANGER = "another site of U1"

    def __init__(
        self,
        site: str,
        params: RoundParams,
        *,
        signer: Signer,
        verifier: Verifier,
        random_bytes: RandomBytes = os.urandom,
        keyring: PairKeyring | None = None,
    ) -> None:
        if site not in params.sites:
            raise ValueError(f"site {site!r} is not one of the round's sites {params.sites}")
        if keyring is None:
            keyring = PairKeyring(site, signer, random_bytes=random_bytes)
        elif keyring.site != site:
            raise ValueError(f"the keyring is {keyring.site!r}'s, not this site's ({site!r})")
        self.site = site
        self.params = params
        self._signer = signer
        self._verifier = verifier
        self._random_bytes = random_bytes
        self._keyring = keyring
        self._static: StaticKey = keyring.current
        self._stage = RoundStage.NEW
        self._s_private: X25519PrivateKey | None = None
        self._self_mask_seed: bytes | None = None
        # This site's advertisement as it made it: (static key, mask key, commitment).
        self._own_ad: tuple[bytes, bytes, bytes] = (b"", b"", b"")
        # holder -> the keys of this round between it and this site.
        self._round_keys: dict[str, RoundPairKeys] = {}
        # sender -> (share of its self-mask seed, share of its pairwise-mask key), own included.
        self._held: dict[str, tuple[Share, Share]] = {}
        # This site and the holders whose shares reached it (fixed by masked_input).
        self._u2: frozenset[str] = frozenset()

    @property
    def stage(self) -> RoundStage:
        return self._stage

    def abort(self, reason: str) -> SecAggError:
        """End the round for this site: drop its secrets; every later call fails.

        For checks made outside this object (a peer's certificate refused by the service).
        Returns the :class:`SecAggError` to raise.
        """
        return self._abort(SecAggError(reason))

    def _abort(self, exc: SecAggError) -> SecAggError:
        self._stage = RoundStage.ABORTED
        self._s_private = None
        self._self_mask_seed = None
        self._round_keys.clear()
        self._held.clear()
        return exc

    def _new_key_pairs(self) -> tuple[bytes, bytes]:
        """Draw the round's X25519 pairwise-mask key pair ``s``; keep its private half; return
        (this site's static public key, ``s``'s public key), 32 bytes each: the keys of its
        advertisement."""
        s_private = generate_private_key(self._random_bytes)
        self._s_private = s_private
        return self._static.public, public_key_bytes(s_private)

    def _derive_pair(self, peer: str, static_public: bytes, signature: bytes) -> None:
        """Check that ``static_public`` is bound to ``peer`` (``signature``, verified once per
        peer and key by the keyring) and derive this round's keys of the pair.

        Raises
        ------
        SecAggError
            If the binding does not verify, or the key agreement fails.
        """
        self._keyring.check_binding(peer, static_public, signature, self._verifier)
        pair_key = self._static.pair_key(peer, static_public)
        keys = PairKeyring.round_keys(pair_key, self.params.round_id, self.site, peer)
        self._round_keys[peer] = keys
        self._keep_pair_keys(peer, keys)

    def _share_secrets(self, holders: Sequence[str], xs: Sequence[int], t: int) -> dict[str, bytes]:
        """Draw the self-mask seed ``b``; split ``b`` and the mask key ``s_sk`` ``t``-of-
        ``len(holders)`` at ``xs``; authenticate this site's advertisement to each other holder
        and encrypt its pair of shares.

        Each message is ``adv_tag || ciphertext``: ``adv_tag`` the HMAC-SHA256 of
        :func:`advertisement_tag_message` (this site's advertisement, addressed to the holder)
        under the pair's ``adv`` key of the round, the ciphertext AES-256-GCM under its ``enc``
        key, associated data ``(round_id, site, holder)``. Every other holder's round keys must
        have been derived (:meth:`_derive_pair`); this site keeps its own pair of shares.

        Returns
        -------
        dict of str to bytes
            Holder (other than this site) -> message of ``32 + 2 * 70 + 28 = 200`` bytes.
        """
        assert self._s_private is not None
        randbelow = randbelow_from(self._random_bytes)
        seed = self._random_bytes(KEY_BYTES)
        if len(seed) != KEY_BYTES:
            raise ValueError(f"random_bytes({KEY_BYTES}) returned {len(seed)} bytes")
        seed_shares = shamir.split_secret_at(seed, xs, t, randbelow=randbelow)
        key_shares = shamir.split_secret_at(
            private_key_bytes(self._s_private), xs, t, randbelow=randbelow
        )
        round_id = self.params.round_id
        own = advertisement_message(round_id, self.site, *self._own_ad)
        out: dict[str, bytes] = {}
        for holder, pair in zip(holders, zip(seed_shares, key_shares, strict=True), strict=True):
            if holder == self.site:
                self._held[holder] = pair
                continue
            keys = self._round_keys[holder]
            tag = mac_tag(keys.adv, _addressed(holder, own))
            out[holder] = tag + encrypt(
                keys.enc,
                pair[0].to_bytes() + pair[1].to_bytes(),
                share_associated_data(round_id, self.site, holder),
                random_bytes=self._random_bytes,
            )
        self._self_mask_seed = seed
        return out

    def _keep_pair_keys(self, holder: str, keys: RoundPairKeys) -> None:
        """Keep what else a pair's round keys serve (nothing by default)."""

    def _own_x(self) -> int:
        """This site's Shamir x coordinate."""
        raise NotImplementedError

    def _advertisement(self, peer: str) -> tuple[bytes, bytes, bytes]:
        """(static key, mask key, commitment) the curator showed this site as ``peer``'s."""
        raise NotImplementedError

    def _s_public(self, peer: str) -> bytes:
        """``peer``'s advertised pairwise-mask public key."""
        return self._advertisement(peer)[1]

    def _check_u2(self, u2: frozenset[str]) -> None:
        """Raise :class:`SecAggError` unless enough holders completed key sharing."""
        raise NotImplementedError

    def _masked_with(self, peer: str) -> None:
        """Record that this site's masked input holds its pairwise mask with ``peer``."""

    def _receive_shares(self, ciphertexts: Mapping[str, bytes]) -> None:
        """Decrypt every sender's shares and check its advertisement tag; keep the shares.

        Raises
        ------
        SecAggError
            If a sender is not a holder this site shared with, a tag does not verify (the
            advertisement this site was shown is not the one the sender made in this round:
            substituted, or replayed from another round), or a ciphertext fails.
        """
        own_x = self._own_x()
        round_id = self.params.round_id
        for sender in ciphertexts:
            if sender == self.site or sender not in self._round_keys:
                raise SecAggError(f"shares from {sender!r}, which is not {self._STRANGER}")
        for sender, message in ciphertexts.items():
            keys = self._round_keys[sender]
            tag, ciphertext = bytes(message[:ADV_TAG_BYTES]), bytes(message[ADV_TAG_BYTES:])
            plaintext = decrypt(
                keys.enc, ciphertext, share_associated_data(round_id, sender, self.site)
            )
            static_public, s_public, commitment = self._advertisement(sender)
            shown = advertisement_tag_message(
                round_id, sender, self.site, static_public, s_public, commitment
            )
            if not check_tag(keys.adv, shown, tag):
                raise SecAggError(
                    f"the advertisement of {sender!r} this site was shown is not the one "
                    f"{sender!r} made in this round (its tag does not verify): a substituted or "
                    "replayed key"
                )
            if len(plaintext) != SHARE_PAIR_BYTES:
                raise SecAggError(f"shares from {sender!r} are {len(plaintext)} bytes")
            try:
                seed_share = Share.from_bytes(plaintext[: shamir.SHARE_BYTES])
                key_share = Share.from_bytes(plaintext[shamir.SHARE_BYTES :])
            except ValueError as exc:
                raise SecAggError(f"shares from {sender!r} are malformed: {exc}") from None
            if seed_share.x != own_x or key_share.x != own_x:
                raise SecAggError(f"shares from {sender!r} are not addressed to x={own_x}")
            self._held[sender] = (seed_share, key_share)

    def masked_input(
        self,
        ciphertexts: Mapping[str, bytes],
        vector: ArrayLike,
        rng: np.random.Generator,
    ) -> NDArray[np.uint64]:
        """Return this site's input, quantized and masked with its peers in ``U2``.

        ``y_u = Q(x_u) + PRG(b_u) + sum_{v in U2_u, v < u} PRG(s_uv) - sum_{v in U2_u, v > u}
        PRG(s_uv) (mod 2^k)``, with ``U2_u`` this site and the holders whose shares reached it
        (every other site of ``U2`` on the complete graph, the neighbours among them on a sparse
        one), ``Q`` the stochastic rounding of
        :func:`~dpmarket.common.secagg.fixedpoint.quantize`, ``s_uv = HKDF(X25519(s_sk_u,
        s_pk_v))`` bound to the round and the pair, and ``PRG`` =
        :func:`~dpmarket.common.secagg.crypto.prg_words`.

        Parameters
        ----------
        ciphertexts : mapping of str to bytes
            Sender -> the message (advertisement tag and ciphertext) it addressed to this site
            when sharing, as routed by the aggregator. Every tag is checked against the sender's
            advertisement this site was shown, and every ciphertext decrypted and checked, now,
            before anything depends on this site's input.
        vector : array-like of shape (vector_length,), float
            This site's input ``x_u``, entries in ``[-clip, clip]``.
        rng : numpy.random.Generator
            Coins of the stochastic rounding (CSPRNG-seeded in production; seeded in tests).

        Returns
        -------
        ndarray of shape (vector_length,), uint64
            Entries in ``[0, 2^k)``: uniformly distributed to anyone who lacks ``b_u`` (and, for
            the sum over ``U2``, the pairwise keys), whatever ``x_u`` is.

        Raises
        ------
        ValueError
            If ``vector`` has the wrong shape, holds NaN/inf or an entry outside ``[-clip, clip]``
            (the round stays at this stage: the call may be repeated with a valid vector).
        SecAggError
            If too few holders completed key sharing (below ``t``, or ``t_v`` on a sparse
            graph), a sender is not a holder, a sender's advertisement tag does not verify (the
            mask key or commitment this site was shown as the sender's is not the one it made in
            this round), or a ciphertext fails authentication (altered, or relabelled as another
            sender's) or holds malformed shares. The round is then aborted for this site.
        FailedPreconditionError
            If the shares were not sent yet, or this was called before.

        Notes
        -----
        **Why the masks cancel.** For a pair ``u < v`` both in ``U2``, ``v`` adds ``PRG(s_uv)``
        and ``u`` subtracts it (``s_uv = s_vu``: X25519 is symmetric and the HKDF info orders the
        pair), so they cancel in the sum over ``U2``; the aggregator removes the self masks
        ``PRG(b_u)`` of the survivors and, for sites of ``U2`` that sent no masked input, their
        pairwise masks with the survivors, from the secrets reconstructed at unmasking. Masks use
        only ``U2``: a site lost before or while sharing never enters any mask. All masks are
        added in one pass (:class:`~dpmarket.common.secagg.crypto.MaskAccumulator`), into the
        quantized vector itself.

        References
        ----------
        Bonawitz et al. (CCS 2017), Figure 4, Round 2 (MaskedInputCollection); Bell et al. (CCS
        2020), the masks of SecAgg+; CAPE paper, Section 3.2 (the ``map`` to ``Z_lambda``).
        """
        check_stage(self._stage, RoundStage.SHARED, "masked_input")
        values = check_vector(vector, self.params.vector_length)
        quantized = quantize(values, self.params.fixed_point, rng)
        try:
            self._receive_shares(ciphertexts)
            u2 = frozenset({*ciphertexts, self.site})
            self._check_u2(u2)
        except SecAggError as exc:
            raise self._abort(exc) from None
        assert self._s_private is not None and self._self_mask_seed is not None
        params = self.params
        masked = quantized
        adds, subtracts = [self._self_mask_seed], list[bytes]()
        for peer in sorted(u2 - {self.site}):
            key = shared_key(
                self._s_private,
                self._s_public(peer),
                info=pair_info(MASK_KEY_LABEL, params.round_id, self.site, peer),
            )
            (adds if peer < self.site else subtracts).append(key)
            self._masked_with(peer)
        MaskAccumulator(params.vector_length).apply(masked, add=adds, subtract=subtracts)
        masked &= np.uint64(params.fixed_point.modulus - 1)
        self._u2 = u2
        # b_u and s_sk are no longer needed here; only their shares leave this site from now on.
        self._self_mask_seed = None
        self._s_private = None
        self._round_keys.clear()
        self._stage = RoundStage.MASKED
        return masked


class AggregatorBase:
    """The aggregator's side of a round: the work the complete and the sparse graph share.

    A subclass implements :meth:`_s_public` and may narrow :meth:`_masked_together`. It holds
    no secret; any :class:`SecAggError` aborts the round and nothing is released.

    Parameters
    ----------
    params : RoundParams
    """

    def __init__(self, params: RoundParams) -> None:
        self.params = params
        self._stage = RoundStage.NEW
        self._u3: tuple[str, ...] = ()
        self._dropped: tuple[str, ...] = ()
        self._total: NDArray[np.uint64] | None = None

    @property
    def stage(self) -> RoundStage:
        return self._stage

    def _fail(self, message: str) -> SecAggError:
        self._stage = RoundStage.ABORTED
        return SecAggError(message)

    def _checked_input(self, name: str, vector: ArrayLike) -> NDArray[np.uint64]:
        """``vector`` as a masked input of ``name`` (in ``U2``, checked by the caller): uint64
        of shape ``(vector_length,)`` with every entry below ``2^k``; abort otherwise."""
        length = self.params.vector_length
        values = np.asarray(vector)
        if values.dtype != np.uint64 or values.shape != (length,):
            raise self._fail(
                f"masked input of {name!r} must be uint64 of shape ({length},), got "
                f"{values.dtype} of shape {values.shape}"
            )
        if values.size and values.max() > np.uint64(self.params.fixed_point.modulus - 1):
            raise self._fail(f"masked input of {name!r} has an entry >= 2^k")
        return values

    def _s_public(self, site: str) -> bytes:
        """``site``'s advertised pairwise-mask public key."""
        raise NotImplementedError

    def _masked_together(self, dropped: str, survivor: str) -> bool:
        """Whether ``survivor``'s masked input holds a pairwise mask with ``dropped``."""
        return True

    def _unmasked_sum(
        self, seeds: Iterable[bytes], dropped_key: Callable[[str], bytes]
    ) -> NDArray[np.float64]:
        """Remove every mask from the sum of the masked inputs and decode it.

        Subtracts ``PRG(b_u)`` for every reconstructed self-mask seed, and, for every dropped
        site ``w`` (whose rebuilt mask key ``dropped_key(w)`` must match its advertised public
        key), undoes its pairwise mask with every survivor that masked with it.

        Raises
        ------
        SecAggError
            If a rebuilt key does not match its advertisement, or the unmasked sum is not a sum
            of ``|U3|`` quantized vectors.
        """
        assert self._total is not None
        params = self.params
        total = self._total.copy()
        adds: list[bytes] = []
        subtracts = list(seeds)
        for owner in self._dropped:
            s_private = private_key_from_bytes(dropped_key(owner))
            if public_key_bytes(s_private) != self._s_public(owner):
                raise self._fail(f"the reconstructed key of {owner!r} does not match its advert")
            for survivor in self._u3:
                if not self._masked_together(owner, survivor):
                    continue
                key = shared_key(
                    s_private,
                    self._s_public(survivor),
                    info=pair_info(MASK_KEY_LABEL, params.round_id, owner, survivor),
                )
                # The survivor added PRG(s) if owner < survivor and subtracted it otherwise.
                (subtracts if owner < survivor else adds).append(key)
        MaskAccumulator(params.vector_length).apply(total, add=adds, subtract=subtracts)
        total &= np.uint64(params.fixed_point.modulus - 1)
        try:
            result = dequantize_sum(total, params.fixed_point, len(self._u3))
        except ValueError as exc:
            raise self._fail(f"unmasking did not give a valid sum: {exc}") from None
        self._total = None
        self._stage = RoundStage.DONE
        return result


@dataclass
class PhaseTimer:
    """Wall-clock seconds per phase of an in-process round, summed over its parties."""

    phases: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds


class SiteArgs(TypedDict):
    """Keyword arguments of a site's state object in an in-process round."""

    signer: Signer
    verifier: Verifier
    random_bytes: RandomBytes
    keyring: PairKeyring | None


@dataclass(frozen=True)
class InProcessRun:
    """What :func:`prepare_run` checked and filled in for an in-process round."""

    drops: dict[str, str]
    signers: Mapping[str, Signer]
    verifier: Verifier
    rng: np.random.Generator
    stages: tuple[str, ...]
    keyrings: Mapping[str, PairKeyring] | None = None

    def site_args(self, site: str, random_bytes: RandomBytes) -> SiteArgs:
        """The keyword arguments of ``site``'s state object: its signer, the verifier, its
        byte source and its keyring (``None``: a keyring of the round's own)."""
        keyring = None if self.keyrings is None else self.keyrings[site]
        return {
            "signer": self.signers[site],
            "verifier": self.verifier,
            "random_bytes": random_bytes,
            "keyring": keyring,
        }

    def alive(self, stage: str, sites: Iterable[str]) -> list[str]:
        """The sites that send their message of ``stage`` (not dropped at or before it)."""
        cut = self.stages.index(stage)
        return [n for n in sites if n not in self.drops or self.stages.index(self.drops[n]) > cut]


def prepare_run(
    params: RoundParams,
    sites: Mapping[str, ArrayLike],
    stages: tuple[str, ...],
    drop_at: Mapping[str, str] | None,
    signers: Mapping[str, Signer] | None,
    verifier: Verifier | None,
    rng: np.random.Generator | None,
    keyrings: Mapping[str, PairKeyring] | None = None,
) -> InProcessRun:
    """Check the arguments of an in-process round and fill in the defaults.

    Fresh ECDSA P-256 identities when neither ``signers`` nor ``verifier`` is given; the rounding
    coins from :func:`dpmarket.common.privacy.rng.production_rng` when ``rng`` is not.

    Raises
    ------
    ValueError
        If ``sites`` does not hold exactly ``params.sites``, a drop names an unknown site or a
        stage outside ``stages``, or only one of ``signers`` and ``verifier`` is given.
    """
    drops = dict(drop_at or {})
    if set(sites) != set(params.sites):
        raise ValueError(f"inputs are for {sorted(sites)}, the round's sites are {params.sites}")
    for name, stage in drops.items():
        if name not in params.sites or stage not in stages:
            raise ValueError(f"bad drop {name!r} at {stage!r}; stages are {stages}")
    if (signers is None) != (verifier is None):
        raise ValueError("give both signers and verifier, or neither")
    if signers is None or verifier is None:
        keys = {name: ec.generate_private_key(ec.SECP256R1()) for name in params.sites}
        signers = {name: EcdsaSigner(key) for name, key in keys.items()}
        verifier = EcdsaVerifier({name: key.public_key() for name, key in keys.items()})
    if rng is None:
        from dpmarket.common.privacy.rng import production_rng

        rng = production_rng()
    if keyrings is not None and set(keyrings) != set(params.sites):
        raise ValueError(f"keyrings are for {sorted(keyrings)}, the sites are {params.sites}")
    return InProcessRun(drops, signers, verifier, rng, stages, keyrings)
