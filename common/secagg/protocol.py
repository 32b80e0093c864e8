"""Secure aggregation (Bonawitz et al., CCS 2017) as explicit, in-process protocol state objects.

The aggregator (dpmarket's curator) learns the sum of the sites' (owners') real vectors and
nothing else about any one of them, and the sum is still obtained when sites drop out at any
stage, as long as ``t`` remain. This is the ``SecureAgg`` of CAPE's Algorithm 1 (step 3), with
which the sites compute the sum of their noise draws.

A round has five stages; each is one method of :class:`SecAggSite` (per site) answered by one
method of :class:`SecAggAggregator` (the sets ``U1 ⊇ U2 ⊇ U3 ⊇ U4`` are Bonawitz's):

0. advertise: ``SecAggSite.advertise_keys`` -> ``SecAggAggregator.collect_advertisements`` (U1);
1. share: ``SecAggSite.share_keys`` -> ``SecAggAggregator.route_shares`` (U2);
2. mask: ``SecAggSite.masked_input`` -> ``SecAggAggregator.collect_masked`` (U3);
3. consistency check: ``SecAggSite.check_consistency`` (each survivor signs ``U3``) ->
   ``SecAggAggregator.collect_signatures`` (U4, the signers);
4. unmask: ``SecAggSite.unmask`` (given the signatures) -> ``SecAggAggregator.finish`` (the sum).

Messages are plain dataclasses and bytes; a service layer moves them over the network unchanged.
:func:`run_in_process` runs a whole round in one process, with dropouts, for tests and benchmarks.

This is the malicious-server variant of Bonawitz et al.'s Figure 4: key advertisements are
authenticated to each site (each carries the site's static key with the signature binding it to
the site's identity key, verified once per peer and cached, and each pair's messages carry an HMAC
of the sender's advertisement under a key of that pair and round:
:mod:`dpmarket.common.secagg.pairkeys`), and before it reveals any unmasking share a site checks
that at least
``t`` distinct survivors signed the very ``U3`` it signed itself (the ConsistencyCheck round), with
``t > (n + S_C) / 2`` for ``S_C`` colluding sites (:class:`RoundParams`), so an aggregator that
tells different sites different survivor lists gets no share at all from the sites it lied to, and
never both secrets of one site. Differences from Figure 4: the inputs are reals, quantized by
:mod:`dpmarket.common.secagg.fixedpoint`; masks are expanded by AES-256 counter mode from the full
32-byte keys (:func:`dpmarket.common.secagg.crypto.prg_words`); the signed ``U3`` is bound to a
digest of every round parameter, not only to the round id; the shares are encrypted under keys
derived from long-lived pair keys and the round id, not from per-round ``c`` key pairs.

This module is the complete graph (every site shares with and masks with every other). For many
sites, :mod:`dpmarket.common.secagg.sparse` runs SecAgg+ with the same defences per neighbourhood on
the graph of :mod:`dpmarket.common.secagg.graph` (``RoundParams.neighbours > 0``), which also says
what the sparse graph changes in the argument of :class:`RoundParams`. The work both share (key
pairs, secret sharing, masking, unmasking, the stages) is in :mod:`dpmarket.common.secagg.base`;
:class:`SecAggSite` and :class:`SecAggAggregator` add the complete graph's checks: every site's
signed advertisement, one threshold ``t`` for all, and the signed survivor list.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.secagg import shamir

# Kept under their former names for code that imported them from here (the tests' attack helper).
from dpmarket.common.secagg.base import MASK_KEY_LABEL as _MASK_KEY_LABEL  # noqa: F401
from dpmarket.common.secagg.base import (
    AggregatorBase,
    PhaseTimer,
    RoundStage,
    SiteBase,
    advertisement_message,
    check_stage,
    prepare_run,
)
from dpmarket.common.secagg.base import pair_info as _pair_info  # noqa: F401
from dpmarket.common.secagg.crypto import (
    KEY_BYTES,
    RandomBytes,
    SecAggError,
    Signer,
    Verifier,
    encode_fields,
)
from dpmarket.common.secagg.pairkeys import PairKeyring
from dpmarket.common.secagg.params import (
    ROUND_ID_BYTES,
    DropStage,
    RoundParams,
    min_threshold,
)
from dpmarket.common.secagg.shamir import Share

__all__ = [
    "ROUND_ID_BYTES",
    "DropStage",
    "KeyAdvertisement",
    "RoundParams",
    "RoundStage",
    "SecAggAggregator",
    "SecAggSite",
    "UnmaskResponse",
    "advertisement_message",
    "consistency_message",
    "min_threshold",
    "run_in_process",
]


# Domain-separation labels: a signature, a key or a ciphertext made for one purpose is never
# valid for another.
_CONSISTENCY_LABEL = b"dpmarket/secagg/v1/consistency-check"

_DROP_STAGES: tuple[str, ...] = ("advertise", "share", "mask", "check", "unmask")


@dataclass(frozen=True)
class KeyAdvertisement:
    """Round 0 message of one site: its static key (bound to its identity) and its mask key.

    Attributes
    ----------
    site : str
    c_public : bytes
        The site's static X25519 public key (32 bytes), the same in every round until the site
        rotates it: with each peer's, it gives the pair key from which the round's share
        encryption and authentication keys are derived (:mod:`dpmarket.common.secagg.pairkeys`).
    s_public : bytes
        32-byte X25519 public key for the pairwise masks, fresh every round.
    signature : bytes
        The site's :class:`~dpmarket.common.secagg.crypto.Signer` signature of
        :func:`dpmarket.common.secagg.pairkeys.binding_message` ``(deployment, site, c_public)``:
        the static key's binding to the site's identity. The round's keys (``s_public``,
        ``commitment``) are authenticated to each holder by the tag leading the sender's share
        message (:func:`dpmarket.common.secagg.base.advertisement_tag_message`).
    commitment : bytes, default b""
        Sparse rounds: the 32-byte commitment to the site's graph nonce
        (:func:`dpmarket.common.secagg.graph.nonce_commitment`); empty in complete-graph rounds.
    """

    site: str
    c_public: bytes
    s_public: bytes
    signature: bytes
    commitment: bytes = b""


@dataclass(frozen=True)
class UnmaskResponse:
    """Round 4 (unmasking) message of one surviving site.

    Attributes
    ----------
    self_mask_shares : dict of str to Share
        For every survivor ``v`` (this site included), this site's share of ``v``'s self-mask seed.
    key_shares : dict of str to Share
        For every dropped site ``v``, this site's share of ``v``'s pairwise-mask private key.

    The two key sets are disjoint: no response holds both kinds of share for one site.
    """

    self_mask_shares: dict[str, Share]
    key_shares: dict[str, Share]


def consistency_message(
    params: RoundParams, survivors: Iterable[str], graph_seed: bytes = b""
) -> bytes:
    """The bytes a survivor signs in the ConsistencyCheck round (Bonawitz et al. 2017, Figure 4,
    Round 3).

    ``encode_fields(label, round_id, params.digest, *sorted(survivors) (UTF-8))``, and the graph
    seed last in sparse rounds: the label keeps the signature from being valid for any other
    purpose (a key advertisement), the round id and the digest of every parameter from being
    valid in another round or under other parameters, the seed from being valid for another
    graph, and the sorted list makes the message a function of the set ``U3`` alone.
    """
    names = sorted(survivors)
    fields = [_CONSISTENCY_LABEL, params.round_id, params.digest, *(n.encode() for n in names)]
    if graph_seed:
        fields.append(graph_seed)
    return encode_fields(*fields)


class SecAggSite(SiteBase):
    """One site's side of a secure-aggregation round (Bonawitz et al. 2017, Figure 4, "User").

    Call :meth:`advertise_keys`, :meth:`share_keys`, :meth:`masked_input`,
    :meth:`check_consistency` and :meth:`unmask` once each, in that order; a call out of order
    (or a second call of any) raises :class:`~dpmarket.common.errors.FailedPreconditionError`. A
    :class:`SecAggError` aborts the round for this site (later calls fail) and its secrets are
    dropped.

    Parameters
    ----------
    site : str
        This site's id; one of ``params.sites``.
    params : RoundParams
    signer : Signer
        Signs this site's key advertisement and its survivor list with its identity key.
    verifier : Verifier
        Checks every other site's static-key binding (once per peer and key: the keyring
        remembers) and survivor-list signature against that site's identity.
    random_bytes : callable, optional
        Source of all key material (the X25519 mask key, the self-mask seed, the Shamir
        coefficients, the AEAD nonces): ``os.urandom`` by default. Tests inject a deterministic
        source to reproduce a round bit for bit.
    keyring : PairKeyring, optional
        The site's long-lived pair keys (:class:`~dpmarket.common.secagg.base.SiteBase`).

    Raises
    ------
    ValueError
        If ``site`` is not in ``params.sites``.

    Notes
    -----
    State kept between stages (what a service would have to persist to survive a restart, all of
    it secret): the mask private key, the self-mask seed ``b_u`` until the masked input is sent,
    the set ``U1`` with the advertised keys, the round's pair keys, and the shares
    received from the other sites; then the sets ``U2`` and ``U3`` this site fixed and the
    signature it gave. A site that loses it simply counts as dropped.

    **What a site reveals, across the whole round.** It signs at most one ``U3`` (a subset of its
    own ``U2`` holding itself, of at least ``t`` sites) and answers the unmasking request at most
    once, only for that ``U3`` and its own ``U2 \\ U3``, and only after ``t`` valid signatures of
    that ``U3``; the state object remembers, so a second or a contradicting request finds the
    round over. It therefore never reveals a self-mask share of a site it treats as dropped nor a
    key share of a site it treats as alive.
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
        if site in params.sites and params.sparse:
            raise ValueError(
                "a sparse round runs on dpmarket.common.secagg.sparse.SparseSecAggSite"
            )
        super().__init__(
            site,
            params,
            signer=signer,
            verifier=verifier,
            random_bytes=random_bytes,
            keyring=keyring,
        )
        self._u1: tuple[str, ...] = ()
        self._u3: tuple[str, ...] = ()
        self._signature = b""
        self._ads: dict[str, KeyAdvertisement] = {}

    def advertise_keys(self) -> KeyAdvertisement:
        """Round 0: draw the round's X25519 mask key pair; advertise its public half with the
        site's static key and that key's identity binding.

        Returns
        -------
        KeyAdvertisement
            ``c_public`` (the static key), ``s_public`` (for the pairwise masks), 32 bytes each,
            and the static key's binding signature (the same every round; nothing is signed per
            round: each holder gets this advertisement's tag with the site's shares).

        Raises
        ------
        FailedPreconditionError
            If called twice.

        References
        ----------
        Bonawitz et al. (CCS 2017), Figure 4, Round 0 (AdvertiseKeys).
        """
        check_stage(self._stage, RoundStage.NEW, "advertise_keys")
        c_public, s_public = self._new_key_pairs()
        self._own_ad = (c_public, s_public, b"")
        self._stage = RoundStage.ADVERTISED
        return KeyAdvertisement(self.site, c_public, s_public, self._static.signature)

    def _check_advertisements(
        self, advertisements: Mapping[str, KeyAdvertisement]
    ) -> tuple[str, ...]:
        own_keys = self._own_ad[:2]  # (static, mask) public keys this site advertised
        seen_keys: set[bytes] = set()
        for name, ad in advertisements.items():
            if name not in self.params.sites:
                raise SecAggError(f"advertisement from {name!r}, which is not in the round")
            if ad.site != name:
                raise SecAggError(f"advertisement filed under {name!r} names site {ad.site!r}")
            if len(ad.c_public) != KEY_BYTES or len(ad.s_public) != KEY_BYTES:
                raise SecAggError(f"advertisement of {name!r} has a key that is not 32 bytes")
            if name == self.site and (ad.c_public, ad.s_public) != own_keys:
                raise SecAggError(f"the advertisement of this site ({name!r}) was replaced")
            for key in (ad.c_public, ad.s_public):
                if key in seen_keys:
                    raise SecAggError(f"advertisement of {name!r} repeats a public key")
                seen_keys.add(key)
        if self.site not in advertisements:
            raise SecAggError(f"the advertisements do not include this site ({self.site!r})")
        if len(advertisements) < self.params.threshold:
            raise SecAggError(
                f"{len(advertisements)} sites advertised keys, below the threshold "
                f"t={self.params.threshold}"
            )
        for name in sorted(advertisements):
            if name != self.site:
                ad = advertisements[name]
                self._derive_pair(name, ad.c_public, ad.signature)
        return tuple(sorted(advertisements))

    def share_keys(self, advertisements: Mapping[str, KeyAdvertisement]) -> dict[str, bytes]:
        """Round 1: Shamir-share this site's secrets among the advertised sites, encrypted.

        Checks every advertisement (the site's own keys unchanged, no public key repeated, each
        static key's binding to its site's identity: verified once per peer and key, then
        remembered by the keyring), derives the round's keys of every pair, draws the self-mask
        seed ``b_u`` (32 bytes), splits ``b_u`` and the pairwise-mask private key ``s_sk`` (32
        bytes) into ``t``-of-``|U1|`` shares with ``x`` = the holder's 1-based position in sorted
        ``U1``, and sends each other site its pair of shares encrypted with AES-256-GCM under the
        pair's ``enc`` key of the round, associated data ``(round_id, sender, recipient)``, led
        by the HMAC of this site's advertisement under the pair's ``adv`` key of the round.

        Parameters
        ----------
        advertisements : mapping of str to KeyAdvertisement
            The set ``U1`` broadcast by the aggregator, this site's own advertisement included.

        Returns
        -------
        dict of str to bytes
            Recipient id -> message of ``32 + 2 * 70 + 28 = 200`` bytes (advertisement tag and
            ciphertext), for every site of ``U1`` but this one (this site keeps its own shares).

        Raises
        ------
        SecAggError
            If fewer than ``t`` sites advertised, this site's advertisement is missing or was
            replaced, a static key's binding does not verify (a substituted key), an
            advertisement is malformed, or two advertisements share a public key.
        FailedPreconditionError
            If :meth:`advertise_keys` has not been called, or this was called before.

        References
        ----------
        Bonawitz et al. (CCS 2017), Figure 4, Round 1 (ShareKeys).
        """
        check_stage(self._stage, RoundStage.ADVERTISED, "share_keys")
        assert self._s_private is not None
        try:
            u1 = self._check_advertisements(advertisements)
        except SecAggError as exc:
            raise self._abort(exc) from None
        out = self._share_secrets(u1, range(1, len(u1) + 1), self.params.threshold)
        self._u1 = u1
        self._ads = {name: advertisements[name] for name in u1}
        self._stage = RoundStage.SHARED
        return out

    def _own_x(self) -> int:
        return self._u1.index(self.site) + 1

    def _advertisement(self, peer: str) -> tuple[bytes, bytes, bytes]:
        ad = self._ads[peer]
        return ad.c_public, ad.s_public, ad.commitment

    def _check_u2(self, u2: frozenset[str]) -> None:
        if len(u2) < self.params.threshold:
            raise SecAggError(
                f"{len(u2)} sites completed key sharing, below the threshold "
                f"t={self.params.threshold}"
            )

    def check_consistency(self, survivors: Sequence[str]) -> bytes:
        """Round 3 (ConsistencyCheck): sign the survivor list ``U3`` the aggregator announces.

        A site signs at most one ``U3`` per round, and only one it could be asked to unmask:
        a subset of its own ``U2`` that holds this site and at least ``t`` sites.

        Parameters
        ----------
        survivors : sequence of str
            ``U3``: the sites whose masked input the aggregator received (this one included).

        Returns
        -------
        bytes
            This site's signature of :func:`consistency_message` ``(params, U3)``.

        Raises
        ------
        SecAggError
            If the list repeats a site, names a site outside this site's ``U2``, leaves this
            site out, or holds fewer than ``t`` sites. The round is then aborted for this site.
        FailedPreconditionError
            If :meth:`masked_input` has not been called, or this was called before (whatever
            list the second call names: one signature per round).

        References
        ----------
        Bonawitz et al. (CCS 2017), Figure 4, Round 3 (ConsistencyCheck), user side.
        """
        check_stage(self._stage, RoundStage.MASKED, "check_consistency")
        try:
            survivor_set = set(survivors)
            if len(survivor_set) != len(survivors):
                raise SecAggError("the survivor list repeats a site")
            outside = survivor_set - set(self._u2)
            if outside:
                raise SecAggError(f"survivors that did not complete key sharing: {sorted(outside)}")
            if self.site not in survivor_set:
                raise SecAggError(f"this site ({self.site!r}) is not listed as a survivor")
            if len(survivor_set) < self.params.threshold:
                raise SecAggError(
                    f"{len(survivor_set)} survivors, below the threshold t={self.params.threshold}"
                )
        except SecAggError as exc:
            raise self._abort(exc) from None
        u3 = tuple(sorted(survivor_set))
        signature = self._signer.sign(consistency_message(self.params, u3))
        self._u3, self._signature = u3, signature
        self._stage = RoundStage.CHECKED
        return signature

    def _check_signatures(self, signatures: Mapping[str, bytes]) -> None:
        """Count valid signatures of this site's ``U3`` from distinct members of ``U3``; raise
        :class:`SecAggError` at the first bad one or if fewer than ``t`` are valid.

        This site's own signature counts without a verification when it is the one it gave;
        the others are verified in sorted order until ``t`` are counted: ``t`` valid signatures
        are what the argument of :class:`RoundParams` needs, and further ones are neither
        checked nor used."""
        t = self.params.threshold
        strangers = sorted(set(signatures) - set(self._u3))
        if strangers:
            raise SecAggError(f"signatures of sites that are not survivors: {strangers}")
        if len(signatures) < t:
            raise SecAggError(
                f"{len(signatures)} signatures of the survivor list, below the threshold t={t}"
            )
        valid = 0
        own = signatures.get(self.site)
        if own is not None:
            if bytes(own) != self._signature:
                raise SecAggError(f"the signature of this site ({self.site!r}) was replaced")
            valid = 1
        message = consistency_message(self.params, self._u3)
        others = [signer for signer in sorted(signatures) if signer != self.site]
        for signer in others[: t - valid]:  # len(others) >= t - valid: checked above
            try:
                self._verifier.verify(signer, message, bytes(signatures[signer]))
            except Exception as exc:
                raise SecAggError(
                    f"{signer!r} did not sign this site's survivor list: {exc}"
                ) from None

    def unmask(
        self,
        survivors: Sequence[str],
        dropped: Sequence[str],
        signatures: Mapping[str, bytes],
    ) -> UnmaskResponse:
        """Round 4: reveal the shares the aggregator needs, and only those.

        Parameters
        ----------
        survivors : sequence of str
            ``U3``: must be the list this site signed in :meth:`check_consistency`.
        dropped : sequence of str
            ``U2 \\ U3``: must be exactly the sites of this site's own ``U2`` outside ``U3``.
        signatures : mapping of str to bytes
            Signer -> its signature of :func:`consistency_message` ``(params, U3)``: the set
            ``U4`` the aggregator collected. At least ``t`` valid ones from distinct members of
            ``U3`` are required (:meth:`_check_signatures`).

        Returns
        -------
        UnmaskResponse
            Shares of the self-mask seed of every survivor and of the pairwise-mask key of every
            dropped site; never both for one site.

        Raises
        ------
        SecAggError
            If a list repeats a site, ``survivors`` is not the signed ``U3``, ``dropped`` is not
            this site's ``U2 \\ U3``, a signature does not verify (or is by a site outside
            ``U3``), or fewer than ``t`` signatures are valid. The round is then aborted for this
            site, and nothing is revealed.
        FailedPreconditionError
            If :meth:`check_consistency` has not been called, or this was called before: a site
            answers once, so it can never be asked for the other secret of a site later.

        Notes
        -----
        Why the checks suffice against an aggregator that lies actively and ``S_C`` colluding
        sites: see :class:`RoundParams` (every honest site that gets here agrees on one ``U3``).

        References
        ----------
        Bonawitz et al. (CCS 2017), Figure 4, Round 4 (Unmasking), user side.
        """
        check_stage(self._stage, RoundStage.CHECKED, "unmask")
        try:
            survivor_set, dropped_set = set(survivors), set(dropped)
            if len(survivor_set) != len(survivors) or len(dropped_set) != len(dropped):
                raise SecAggError("the survivor or dropped list repeats a site")
            if survivor_set != set(self._u3):
                raise SecAggError(
                    f"the survivors {sorted(survivor_set)} are not the list this site signed "
                    f"{list(self._u3)}"
                )
            expected_dropped = set(self._u2) - survivor_set
            if dropped_set != expected_dropped:
                raise SecAggError(
                    f"the dropped sites {sorted(dropped_set)} are not this site's U2 \\ U3 "
                    f"{sorted(expected_dropped)}"
                )
            self._check_signatures(signatures)
        except SecAggError as exc:
            raise self._abort(exc) from None
        response = UnmaskResponse(
            self_mask_shares={v: self._held[v][0] for v in self._u3},
            key_shares={v: self._held[v][1] for v in sorted(dropped_set)},
        )
        self._held.clear()
        self._stage = RoundStage.DONE
        return response


class SecAggAggregator(AggregatorBase):
    """The aggregator's side of a round (Bonawitz et al. 2017, Figure 4, "Server").

    Call :meth:`collect_advertisements`, :meth:`route_shares`, :meth:`collect_masked`,
    :meth:`collect_signatures` and :meth:`finish` once each, in that order. Each takes what
    arrived from the sites still in the round; a site whose message did not arrive counts as
    dropped at that stage. Any :class:`SecAggError` aborts the round: nothing is released.

    Parameters
    ----------
    params : RoundParams

    Notes
    -----
    The aggregator holds no secret: its state is the advertised public keys, the sets
    ``U1 ⊇ U2 ⊇ U3 ⊇ U4``, the survivors' signatures of ``U3`` and the running sum of the masked
    inputs (which reveals nothing without the unmasking shares).
    """

    def __init__(self, params: RoundParams) -> None:
        if params.sparse:
            raise ValueError(
                "a sparse round runs on dpmarket.common.secagg.sparse.SparseSecAggAggregator"
            )
        super().__init__(params)
        self._advertisements: dict[str, KeyAdvertisement] = {}
        self._u1: tuple[str, ...] = ()
        self._u2: tuple[str, ...] = ()
        self._signatures: dict[str, bytes] = {}

    def _need(self, count: int, what: str) -> None:
        if count < self.params.threshold:
            self._stage = RoundStage.ABORTED
            raise SecAggError(f"{count} {what}, below the threshold t={self.params.threshold}")

    def _s_public(self, site: str) -> bytes:
        return self._advertisements[site].s_public

    def collect_advertisements(
        self, advertisements: Mapping[str, KeyAdvertisement]
    ) -> dict[str, KeyAdvertisement]:
        """Round 0: fix ``U1``, the sites that advertised keys, and return what to broadcast.

        Parameters
        ----------
        advertisements : mapping of str to KeyAdvertisement
            Site id (from its authenticated channel) -> its advertisement.

        Returns
        -------
        dict of str to KeyAdvertisement
            ``U1``, sorted by site id: the message every site of ``U1`` receives.

        Raises
        ------
        SecAggError
            If fewer than ``t`` sites advertised, a site is not in the round, an advertisement
            is filed under another site's id, or a public key appears twice.
        """
        check_stage(self._stage, RoundStage.NEW, "collect_advertisements")
        seen: set[bytes] = set()
        for name, ad in advertisements.items():
            if name not in self.params.sites:
                raise self._fail(f"advertisement from {name!r}, which is not in the round")
            if ad.site != name:
                raise self._fail(f"advertisement filed under {name!r} names site {ad.site!r}")
            for key in (ad.c_public, ad.s_public):
                if len(key) != KEY_BYTES or key in seen:
                    raise self._fail(f"advertisement of {name!r} has a bad or repeated key")
                seen.add(key)
        self._need(len(advertisements), "sites advertised keys")
        self._u1 = tuple(sorted(advertisements))
        self._advertisements = {name: advertisements[name] for name in self._u1}
        self._stage = RoundStage.ADVERTISED
        return dict(self._advertisements)

    def route_shares(
        self, from_site: Mapping[str, Mapping[str, bytes]]
    ) -> dict[str, dict[str, bytes]]:
        """Round 1: fix ``U2``, the sites that sent their encrypted shares, and route them.

        Parameters
        ----------
        from_site : mapping of str to (mapping of str to bytes)
            Sender -> (recipient -> ciphertext), the output of :meth:`SecAggSite.share_keys` of
            every site whose message arrived whole.

        Returns
        -------
        dict of str to (dict of str to bytes)
            Recipient -> (sender -> ciphertext) for every recipient in ``U2``, with the
            ciphertexts of every other sender in ``U2``: the input of
            :meth:`SecAggSite.masked_input`. Sites of ``U1`` outside ``U2`` get nothing.

        Raises
        ------
        SecAggError
            If fewer than ``t`` sites sent shares, a sender is not in ``U1``, or a sender did not
            address exactly the other sites of ``U1``.
        """
        check_stage(self._stage, RoundStage.ADVERTISED, "route_shares")
        for sender, addressed in from_site.items():
            if sender not in self._u1:
                raise self._fail(f"shares from {sender!r}, which did not advertise keys")
            expected = set(self._u1) - {sender}
            if set(addressed) != expected:
                raise self._fail(
                    f"{sender!r} addressed shares to {sorted(addressed)}, "
                    f"expected the other sites of U1 {sorted(expected)}"
                )
        self._need(len(from_site), "sites completed key sharing")
        self._u2 = tuple(sorted(from_site))
        routed = {
            recipient: {
                sender: bytes(from_site[sender][recipient])
                for sender in self._u2
                if sender != recipient
            }
            for recipient in self._u2
        }
        self._stage = RoundStage.SHARED
        return routed

    def collect_masked(
        self, inputs: Mapping[str, ArrayLike]
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Round 2: fix ``U3``, the sites whose masked input arrived, and add the inputs up.

        Parameters
        ----------
        inputs : mapping of str to ndarray of shape (vector_length,), uint64
            Site -> the output of its :meth:`SecAggSite.masked_input`.

        Returns
        -------
        survivors : tuple of str
            ``U3``, sorted.
        dropped : tuple of str
            ``U2 \\ U3``, sorted: the sites whose pairwise masks must be removed.

        Raises
        ------
        SecAggError
            If fewer than ``t`` inputs arrived, a site is not in ``U2``, or an input has the
            wrong shape or dtype or an entry ``>= 2^k``.
        """
        check_stage(self._stage, RoundStage.SHARED, "collect_masked")
        total = np.zeros(self.params.vector_length, dtype=np.uint64)
        for name, vector in inputs.items():
            if name not in self._u2:
                raise self._fail(f"masked input from {name!r}, which is not in U2")
            total += self._checked_input(name, vector)
        self._need(len(inputs), "masked inputs arrived")
        self._u3 = tuple(sorted(inputs))
        self._dropped = tuple(sorted(set(self._u2) - set(self._u3)))
        self._total = total
        self._stage = RoundStage.MASKED
        return self._u3, self._dropped

    def collect_signatures(self, signatures: Mapping[str, bytes]) -> dict[str, bytes]:
        """Round 3 (ConsistencyCheck): fix ``U4``, the survivors that signed ``U3``.

        Parameters
        ----------
        signatures : mapping of str to bytes
            Survivor -> its :meth:`SecAggSite.check_consistency` signature, for every survivor
            whose answer arrived.

        Returns
        -------
        dict of str to bytes
            ``U4`` with the signatures, sorted by site: what every site of ``U4`` receives with
            its unmasking request (:meth:`SecAggSite.unmask`). The aggregator checks no
            signature; every site checks ``t`` of them before it reveals anything.

        Raises
        ------
        SecAggError
            If fewer than ``t`` signatures arrived, a signer is not a survivor, or a signature
            is empty.

        References
        ----------
        Bonawitz et al. (CCS 2017), Figure 4, Round 3 (ConsistencyCheck), server side.
        """
        check_stage(self._stage, RoundStage.MASKED, "collect_signatures")
        for name, signature in signatures.items():
            if name not in self._u3:
                raise self._fail(f"a signature of U3 from {name!r}, which is not a survivor")
            if not signature:
                raise self._fail(f"the signature of U3 from {name!r} is empty")
        self._need(len(signatures), "survivors signed U3")
        self._signatures = {name: bytes(signatures[name]) for name in sorted(signatures)}
        self._stage = RoundStage.CHECKED
        return dict(self._signatures)

    def _reconstruct(
        self, owner: str, shares: list[Share], responders: Sequence[str], what: str
    ) -> bytes:
        t = self.params.threshold
        for responder, share in zip(responders, shares, strict=True):
            if share.x != self._u1.index(responder) + 1:
                raise self._fail(
                    f"{responder!r} sent a share of {owner!r}'s {what} for x={share.x}"
                )
        base = shares[:t]
        for extra in shares[t:]:
            if shamir.interpolate(base, extra.x) != extra.y:
                raise self._fail(f"the shares of {owner!r}'s {what} are inconsistent")
        try:
            return shamir.combine_shares(base, KEY_BYTES)
        except ValueError as exc:
            raise self._fail(f"cannot reconstruct {owner!r}'s {what}: {exc}") from None

    def finish(self, responses: Mapping[str, UnmaskResponse]) -> NDArray[np.float64]:
        """Round 4: reconstruct the needed secrets, remove every mask and return the sum.

        From ``t`` or more responses, reconstructs the self-mask seed ``b_u`` of every survivor
        and the pairwise-mask private key ``s_sk_v`` of every dropped site (checked against the
        advertised ``s_pk_v``; with more than ``t`` responses, every share is also checked to lie
        on the polynomial of the first ``t``), subtracts ``PRG(b_u)`` for each survivor, undoes
        each survivor's pairwise mask with each dropped site, and decodes the sum.

        Parameters
        ----------
        responses : mapping of str to UnmaskResponse
            Signer of ``U3`` (a site of ``U4``) -> its :meth:`SecAggSite.unmask` response.

        Returns
        -------
        ndarray of shape (vector_length,), float64
            The sum of the survivors' (``U3``) input vectors, within ``|U3| / scale`` per entry
            (:func:`~dpmarket.common.secagg.fixedpoint.dequantize_sum`).

        Raises
        ------
        SecAggError
            If fewer than ``t`` responses arrived, a responder did not sign ``U3``, a response
            does not hold exactly the expected shares, shares are inconsistent, a reconstructed key
            does not match its advertisement, or the unmasked sum is not a sum of ``|U3|``
            quantized vectors. Nothing is returned.

        References
        ----------
        Bonawitz et al. (CCS 2017), Figure 4, Round 4 (Unmasking), server side.
        """
        check_stage(self._stage, RoundStage.CHECKED, "finish")
        assert self._total is not None
        survivors, dropped = set(self._u3), set(self._dropped)
        for name, response in responses.items():
            if name not in self._signatures:
                raise self._fail(f"unmasking response from {name!r}, which did not sign U3")
            if set(response.self_mask_shares) != survivors or set(response.key_shares) != dropped:
                raise self._fail(f"the unmasking response of {name!r} holds the wrong shares")
        self._need(len(responses), "unmasking responses arrived")
        responders = tuple(sorted(responses))
        seeds = [
            self._reconstruct(
                owner,
                [responses[r].self_mask_shares[owner] for r in responders],
                responders,
                "self-mask seed",
            )
            for owner in self._u3
        ]
        return self._unmasked_sum(
            seeds,
            lambda owner: self._reconstruct(
                owner,
                [responses[r].key_shares[owner] for r in responders],
                responders,
                "pairwise-mask key",
            ),
        )


def run_in_process(
    params: RoundParams,
    sites: Mapping[str, ArrayLike],
    *,
    drop_at: Mapping[str, DropStage] | None = None,
    signers: Mapping[str, Signer] | None = None,
    verifier: Verifier | None = None,
    random_bytes: RandomBytes = os.urandom,
    rng: np.random.Generator | None = None,
    phase_seconds: dict[str, float] | None = None,
    keyrings: Mapping[str, PairKeyring] | None = None,
) -> NDArray[np.float64]:
    """Run one round with every site and the aggregator in this process, one after another.

    Complete-graph rounds only: :func:`dpmarket.common.secagg.run_in_process` runs either kind.

    Parameters
    ----------
    params : RoundParams
    sites : mapping of str to ndarray of shape (vector_length,), float
        Every site of ``params.sites`` -> its input vector.
    drop_at : mapping of str to {"advertise", "share", "mask", "check", "unmask"}, optional
        Sites that drop out, and the stage whose message they never send: ``"advertise"`` (not
        in ``U1``), ``"share"`` (in ``U1``, not ``U2``), ``"mask"`` (in ``U2``, not ``U3``: its
        pairwise masks are removed from shares), ``"check"`` (in ``U3``, its input counts, but
        it signs nothing and sends no unmasking response), ``"unmask"`` (in ``U4``: it signed
        ``U3`` but sends no unmasking response).
    signers : mapping of str to Signer, optional
        Each site's identity signer; with ``verifier``. By default fresh ECDSA P-256 keys are
        made for this run (:class:`~dpmarket.common.secagg.crypto.EcdsaSigner` /
        :class:`~dpmarket.common.secagg.crypto.EcdsaVerifier`).
    verifier : Verifier, optional
    random_bytes : callable, optional
        Source of every site's key material (``os.urandom`` by default).
    rng : numpy.random.Generator, optional
        Coins of the stochastic rounding, used by the sites in sorted order. By default
        :func:`dpmarket.common.privacy.rng.production_rng`.
    phase_seconds : dict, optional
        If given, filled with the wall-clock seconds of each phase, summed over the sites and the
        aggregator: ``advertise_keys``, ``share_keys``, ``masked_input``, ``consistency_check``,
        ``unmask`` (sites' work and the aggregator's collection in each) and ``finish`` (the
        aggregator's reconstruction and unmasking).
    keyrings : mapping of str to PairKeyring, optional
        Each site's long-lived pair keys, to run several rounds between the same sites as a
        service does (the bindings verified and the pair keys derived once, in the first
        round). By default each site makes a keyring for this round alone.

    Returns
    -------
    ndarray of shape (vector_length,), float64
        The sum of the inputs of the sites in ``U3`` (not dropped before ``"check"``).

    Raises
    ------
    SecAggError
        If fewer than ``t`` sites remain at some stage (nothing is returned), or any check fails.
    ValueError
        If ``sites`` does not hold exactly ``params.sites``, a stage name is unknown, an input is
        out of range, only one of ``signers`` and ``verifier`` is given, or the round is sparse.
    """
    if params.sparse:
        raise ValueError(
            "a sparse round runs in dpmarket.common.secagg.sparse.run_sparse_in_process"
        )
    run = prepare_run(params, sites, _DROP_STAGES, drop_at, signers, verifier, rng, keyrings)
    timer = PhaseTimer()

    def alive(stage: str) -> list[str]:
        """Sites that send their message of ``stage`` (those not dropped at or before it)."""
        return run.alive(stage, params.sites)

    aggregator = SecAggAggregator(params)
    parties = {
        name: SecAggSite(name, params, **run.site_args(name, random_bytes)) for name in params.sites
    }

    start = time.perf_counter()
    ads = {name: parties[name].advertise_keys() for name in alive("advertise")}
    u1 = aggregator.collect_advertisements(ads)
    timer.add("advertise_keys", time.perf_counter() - start)

    start = time.perf_counter()
    shares = {name: parties[name].share_keys(u1) for name in alive("share")}
    routed = aggregator.route_shares(shares)
    timer.add("share_keys", time.perf_counter() - start)

    start = time.perf_counter()
    masked = {
        name: parties[name].masked_input(routed[name], sites[name], run.rng)
        for name in alive("mask")
    }
    survivors, dropped = aggregator.collect_masked(masked)
    timer.add("masked_input", time.perf_counter() - start)

    start = time.perf_counter()
    signatures = {
        name: parties[name].check_consistency(survivors)
        for name in alive("check")
        if name in survivors
    }
    signed = aggregator.collect_signatures(signatures)
    timer.add("consistency_check", time.perf_counter() - start)

    start = time.perf_counter()
    responses = {
        name: parties[name].unmask(survivors, dropped, signed)
        for name in alive("unmask")
        if name in signed
    }
    timer.add("unmask", time.perf_counter() - start)

    start = time.perf_counter()
    result = aggregator.finish(responses)
    timer.add("finish", time.perf_counter() - start)
    if phase_seconds is not None:
        phase_seconds.update(timer.phases)
    return result
