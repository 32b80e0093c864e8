"""SecAgg+ (Bell et al., CCS 2020): secure aggregation on a sparse random graph, against an
aggregator that lies actively.

The protocol of :mod:`dpmarket.common.secagg.protocol` (Bonawitz et al.'s Figure 4 with the
ConsistencyCheck), with each site sharing its secrets among, masking with and checking quorums of
its neighbours in the graph of :mod:`dpmarket.common.secagg.graph` (a k-out graph and a ring)
instead of all sites. A
round has six stages; each is one method of :class:`SparseSecAggSite` answered by one method of
:class:`SparseSecAggAggregator`:

0. advertise: ``advertise_keys`` (unlike SecAgg's, the keys also commit to a graph nonce) ->
   ``collect_advertisements`` (U1);
1. reveal: ``reveal_nonce`` (given every commitment of U1) -> ``collect_nonces`` (the graph seed:
   every site of U1 must reveal);
2. share: ``share_keys`` (given the nonces: the site fixes the graph, checks its neighbours'
   static-key bindings and shares ``t_v``-of-``K_v`` among them, each message led by the tag of
   its own advertisement for that neighbour) -> ``route_shares`` (U2);
3. mask: ``masked_input``, with one acknowledgement per neighbour it masked with
   (``acknowledgements``) -> ``collect_masked`` (U3, the survivors);
4. consistency check: ``attest`` (a pairwise tag on ``U3`` for each surviving neighbour) ->
   ``collect_attestations`` (U4);
5. unmask: ``unmask`` (given the tags and acknowledgements addressed to it) -> ``finish``.

Why every check is there, and what the sparse graph changes in the argument against an actively
lying curator (thresholds and quorums per neighbourhood, ``t_v = K_v - Delta``; the graph's
parameters meet a ``2^-40`` failure bound), is in :mod:`dpmarket.common.secagg.graph`. What stays:
key advertisements authenticated to every neighbour (the static key's binding to the site's
identity, verified once per peer and key, and the per-round tag under the pair's key of the
round, checked before the site masks with that neighbour: :mod:`dpmarket.common.secagg.pairkeys`),
the
consistency round before any unmasking share leaves a site, a site answering each stage once,
``S_C`` bound into the parameters (each owner refuses one below its floor, as in complete-graph
rounds), and ``2 t_v > K_v + c_v`` in every honest neighbourhood (the complete graph's ``2 t > n +
S_C``), which the graph delivers except with probability ``2^-40``.

What differs from the complete-graph round besides the graph: the survivor list is attested with
HMAC-SHA256 tags under pairwise keys (the pair's ``tag`` key of the round, beside its share
encryption key) instead of ECDSA signatures, since each attestation convinces only its addressee,
which is all the quorum argument needs, and costs microseconds instead of ~64 µs per check; the
acknowledgements (also tags) bind a survivor's self-mask share to neighbours it really masked with;
reconstruction uses the first ``t_v`` shares of each secret (a mask key is checked against its
advertised public key; a wrong self-mask seed makes the sum fail its range check) rather than
checking every extra share."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.secagg import shamir
from dpmarket.common.secagg.base import (
    AggregatorBase,
    PhaseTimer,
    RoundStage,
    SiteBase,
    check_stage,
    encoded_prefix,
    prepare_run,
)
from dpmarket.common.secagg.crypto import (
    KEY_BYTES,
    RandomBytes,
    SecAggError,
    Signer,
    Verifier,
    check_tag,
    encode_fields,
    mac_tag,
)
from dpmarket.common.secagg.graph import NeighbourGraph, graph_seed, nonce_commitment
from dpmarket.common.secagg.pairkeys import PairKeyring, RoundPairKeys
from dpmarket.common.secagg.protocol import (
    KeyAdvertisement,
    RoundParams,
    SecAggAggregator,
    SecAggSite,
    UnmaskResponse,
    consistency_message,
)
from dpmarket.common.secagg.shamir import Share

__all__ = [
    "SPARSE_DROP_STAGES",
    "SparseSecAggAggregator",
    "SparseSecAggSite",
    "acknowledgement_message",
    "attestation_message",
    "make_aggregator",
    "make_site",
    "run_sparse_in_process",
]

_ACK_LABEL = b"dpmarket/secagg/v1/sparse-mask-acknowledgement"
_ATTEST_LABEL = b"dpmarket/secagg/v1/sparse-survivor-attestation"

#: The stages of a sparse round, in order, as named by ``drop_at``.
SPARSE_DROP_STAGES: tuple[str, ...] = ("advertise", "reveal", "share", "mask", "check", "unmask")


def acknowledgement_message(params: RoundParams, sender: str, recipient: str) -> bytes:
    """What ``sender`` tags for ``recipient`` with its masked input: "my masked input holds our
    pairwise mask". Directed (sender first) so that a tag cannot be reflected to its maker."""
    prefix = encoded_prefix(_ACK_LABEL, params.round_id, params.digest)
    return prefix + encode_fields(sender.encode(), recipient.encode())


def attestation_message(survivor_list: bytes, sender: str, recipient: str) -> bytes:
    """What ``sender`` tags for ``recipient`` in the consistency check: the survivor list it
    attests (``survivor_list``: :func:`~dpmarket.common.secagg.protocol.consistency_message` of the
    round,
    the list and the graph seed), directed so that a tag cannot be reflected to its maker."""
    prefix = encoded_prefix(_ATTEST_LABEL, survivor_list)
    return prefix + encode_fields(sender.encode(), recipient.encode())


def _require_sparse(params: RoundParams) -> None:
    if not params.sparse:
        raise ValueError("a complete-graph round runs on dpmarket.common.secagg.protocol")


class SparseSecAggSite(SiteBase):
    """One site's side of a SecAgg+ round (the six stages of the module docstring).

    Call :meth:`advertise_keys`, :meth:`reveal_nonce`, :meth:`share_keys`, :meth:`masked_input`,
    :meth:`attest` and :meth:`unmask` once each, in that order; a call out of order (or a second
    call) raises :class:`~dpmarket.common.errors.FailedPreconditionError`. A :class:`SecAggError`
    aborts the round for this site and drops its secrets.

    Parameters
    ----------
    site : str
        This site's id; one of ``params.sites``.
    params : RoundParams
        A sparse round (``params.neighbours > 0``).
    signer : Signer
        Signs the binding of this site's static key with its identity key.
    verifier : Verifier
        Checks its neighbours' static-key bindings against their identities (only
        neighbours', once per peer and key: the keyring remembers).
    random_bytes : callable, optional
        Source of all key material and of the graph nonce (``os.urandom`` by default).
    keyring : PairKeyring, optional
        The site's long-lived pair keys (:class:`~dpmarket.common.secagg.base.SiteBase`).

    Raises
    ------
    ValueError
        If ``site`` is not in ``params.sites`` or the round is not sparse.

    Notes
    -----
    **What a site reveals, across the round.** It attests at most one ``U3`` (holding itself, at
    least ``t_v`` of ``N[v]``, every surviving neighbour one it masked with), answers the
    unmasking request once, only for that ``U3``, after ``t_v`` members of ``N[v]`` (itself
    included) attested it to it, and reveals a survivor's self-mask share only with that
    survivor's acknowledgement that it masked with this site. It never reveals both shares it
    holds of one site. Why this suffices: :mod:`dpmarket.common.secagg.graph`.
    """

    _STRANGER = "a neighbour in U1"

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
        _require_sparse(params)
        super().__init__(
            site,
            params,
            signer=signer,
            verifier=verifier,
            random_bytes=random_bytes,
            keyring=keyring,
        )
        self._nonce = b""
        self._u1: dict[str, KeyAdvertisement] = {}
        self._seed = b""
        self._graph: NeighbourGraph | None = None
        self._holders: tuple[str, ...] = ()
        self._threshold = 0
        self._mac_keys: dict[str, bytes] = {}
        self._acks: dict[str, bytes] = {}
        self._u3: tuple[str, ...] = ()
        self._survivor_list = b""

    @property
    def graph(self) -> NeighbourGraph | None:
        """The round's graph, once :meth:`share_keys` fixed it."""
        return self._graph

    @property
    def threshold(self) -> int:
        """``t_v`` of this site, once the graph is fixed (0 before)."""
        return self._threshold

    @property
    def acknowledgements(self) -> dict[str, bytes]:
        """After :meth:`masked_input`: neighbour -> this site's tag of
        :func:`acknowledgement_message` ``(params, site, neighbour)``, for every neighbour it
        masked with. The aggregator forwards each to its neighbour."""
        return dict(self._acks)

    def _abort(self, exc: SecAggError) -> SecAggError:
        self._mac_keys.clear()
        return super()._abort(exc)

    def advertise_keys(self) -> KeyAdvertisement:
        """Stage 0: a fresh X25519 mask key pair and a commitment to a fresh graph nonce, with the
        site's static key and its identity binding.

        Returns
        -------
        KeyAdvertisement
            ``c_public`` (the static key), ``s_public`` (32 bytes each), ``commitment``
            (:func:`dpmarket.common.secagg.graph.nonce_commitment` of 32 random bytes) and the
            static key's binding signature. Each neighbour gets the tag of
            :func:`~dpmarket.common.secagg.base.advertisement_tag_message` over all of them
            with this site's shares.

        Raises
        ------
        FailedPreconditionError
            If called twice.
        """
        check_stage(self._stage, RoundStage.NEW, "advertise_keys")
        c_public, s_public = self._new_key_pairs()
        nonce = self._random_bytes(KEY_BYTES)
        if len(nonce) != KEY_BYTES:
            self._s_private = None
            raise ValueError(f"random_bytes({KEY_BYTES}) returned {len(nonce)} bytes")
        commitment = nonce_commitment(self.params.round_id, self.site, nonce)
        self._nonce = nonce
        self._own_ad = (c_public, s_public, commitment)
        self._stage = RoundStage.ADVERTISED
        return KeyAdvertisement(self.site, c_public, s_public, self._static.signature, commitment)

    def reveal_nonce(self, advertisements: Mapping[str, KeyAdvertisement]) -> bytes:
        """Stage 1: record ``U1`` (every site's keys and commitment); reveal the graph nonce.

        The nonce leaves only now, when every contribution to this site's seed is fixed
        (:mod:`dpmarket.common.secagg.graph`). Static-key bindings are checked at
        :meth:`share_keys` and the round's advertisement tags at :meth:`masked_input`, for the
        neighbours only; a forged advertisement of a site that is not a neighbour changes
        nothing this site uses.

        Parameters
        ----------
        advertisements : mapping of str to KeyAdvertisement
            ``U1`` as the aggregator broadcasts it, this site's own included.

        Returns
        -------
        bytes
            The 32-byte nonce committed to in :meth:`advertise_keys`.

        Raises
        ------
        SecAggError
            If a site is not in the round, an advertisement is filed under another site, has a
            key or commitment that is not 32 bytes, this site's own is missing or replaced.
        FailedPreconditionError
            Out of order.
        """
        check_stage(self._stage, RoundStage.ADVERTISED, "reveal_nonce")
        assert self._s_private is not None
        try:
            own = advertisements.get(self.site)
            if own is None:
                raise SecAggError(f"the advertisements do not include this site ({self.site!r})")
            if (own.c_public, own.s_public, own.commitment) != self._own_ad:
                raise SecAggError(f"the advertisement of this site ({self.site!r}) was replaced")
            for name, ad in advertisements.items():
                if name not in self.params.sites:
                    raise SecAggError(f"advertisement from {name!r}, which is not in the round")
                if ad.site != name:
                    raise SecAggError(f"advertisement filed under {name!r} names site {ad.site!r}")
                sizes = (len(ad.c_public), len(ad.s_public), len(ad.commitment))
                if sizes != (KEY_BYTES, KEY_BYTES, KEY_BYTES):
                    raise SecAggError(f"advertisement of {name!r} has a field that is not 32 bytes")
        except SecAggError as exc:
            raise self._abort(exc) from None
        self._u1 = dict(advertisements)
        self._stage = RoundStage.REVEALED
        return self._nonce

    def share_keys(self, nonces: Mapping[str, bytes]) -> dict[str, bytes]:
        """Stage 2: fix the graph; share this site's secrets among its neighbours, encrypted.

        Derives the seed from every nonce of ``U1`` (each checked against its commitment), builds
        the graph, checks the static-key binding of every neighbour in ``U1`` (once per peer and
        key: the keyring remembers) and that no two holders share a key, derives the round's keys
        of each pair, splits the self-mask seed ``b_v`` and the mask key ``s_sk``
        ``t_v``-of-``|N[v] ∩ U1|`` at the holders' x coordinates (their positions among all sites,
        plus one), and sends each neighbour its pair of shares encrypted with AES-256-GCM under
        the pair's ``enc`` key of the round, led by the tag of this site's advertisement under
        its ``adv`` key (the ``tag`` key authenticates this pair's acknowledgements and
        attestations).

        Parameters
        ----------
        nonces : mapping of str to bytes
            Site -> its revealed nonce, for every site of ``U1``.

        Returns
        -------
        dict of str to bytes
            Neighbour (in ``U1``) -> message of 200 bytes (advertisement tag and ciphertext).

        Raises
        ------
        SecAggError
            If a nonce is missing or does not open its commitment, fewer than ``t_v`` holders
            advertised, a neighbour's static-key binding does not verify, or two holders share a
            key.
        FailedPreconditionError
            Out of order.
        """
        check_stage(self._stage, RoundStage.REVEALED, "share_keys")
        assert self._s_private is not None
        params = self.params
        try:
            commitments = {name: ad.commitment for name, ad in self._u1.items()}
            if nonces.get(self.site) != self._nonce:
                raise SecAggError(f"the nonce of this site ({self.site!r}) was replaced")
            seed = graph_seed(params.digest, nonces, commitments, params.round_id)
            graph = NeighbourGraph.build(
                params.sites, seed, params.neighbours, params.allowance, params.ring
            )
            holders = tuple(sorted(graph.closed(self.site) & set(self._u1)))
            t = graph.threshold(self.site)
            if len(holders) < t:
                raise SecAggError(
                    f"{len(holders)} of this site's {len(graph.closed(self.site))} holders "
                    f"advertised keys, below its threshold t={t}"
                )
            seen: set[bytes] = set()
            for name in holders:
                ad = self._u1[name]
                for key in (ad.c_public, ad.s_public):
                    if key in seen:
                        raise SecAggError(f"advertisement of {name!r} repeats a public key")
                    seen.add(key)
            for name in holders:
                if name != self.site:
                    ad = self._u1[name]
                    self._derive_pair(name, ad.c_public, ad.signature)
        except SecAggError as exc:
            raise self._abort(exc) from None
        xs = [graph.index(name) + 1 for name in holders]
        out = self._share_secrets(holders, xs, t)
        self._seed, self._graph, self._holders, self._threshold = seed, graph, holders, t
        self._stage = RoundStage.SHARED
        return out

    def _keep_pair_keys(self, holder: str, keys: RoundPairKeys) -> None:
        self._mac_keys[holder] = keys.tag

    def _own_x(self) -> int:
        assert self._graph is not None
        return self._graph.index(self.site) + 1

    def _advertisement(self, peer: str) -> tuple[bytes, bytes, bytes]:
        ad = self._u1[peer]
        return ad.c_public, ad.s_public, ad.commitment

    def _check_u2(self, u2: frozenset[str]) -> None:
        if len(u2) < self._threshold:
            raise SecAggError(
                f"{len(u2)} of this site's holders completed key sharing, below its "
                f"threshold t={self._threshold}"
            )

    def _masked_with(self, peer: str) -> None:
        self._acks[peer] = mac_tag(
            self._mac_keys[peer], acknowledgement_message(self.params, self.site, peer)
        )

    def attest(self, survivors: Sequence[str]) -> dict[str, bytes]:
        """Stage 4 (ConsistencyCheck): attest the survivor list ``U3`` to every surviving
        neighbour.

        A site attests at most one ``U3`` per round, and only one it could be asked to unmask:
        one holding itself and at least ``t_v`` of ``N[v]``, in which every neighbour is one it
        masked with.

        Parameters
        ----------
        survivors : sequence of str
            ``U3``: every site whose masked input the aggregator received.

        Returns
        -------
        dict of str to bytes
            Surviving neighbour -> tag of :func:`attestation_message` ``(params, U3, seed, site,
            neighbour)`` under the pair's key.

        Raises
        ------
        SecAggError
            If the list repeats a site, names a site outside the round, leaves this site out,
            names a neighbour it did not mask with, or holds fewer than ``t_v`` of ``N[v]``.
        FailedPreconditionError
            Out of order, or a second call.
        """
        check_stage(self._stage, RoundStage.MASKED, "attest")
        assert self._graph is not None
        try:
            survivor_set = set(survivors)
            if len(survivor_set) != len(survivors):
                raise SecAggError("the survivor list repeats a site")
            strangers = survivor_set - set(self.params.sites)
            if strangers:
                raise SecAggError(f"survivors outside the round: {sorted(strangers)}")
            if self.site not in survivor_set:
                raise SecAggError(f"this site ({self.site!r}) is not listed as a survivor")
            closed = self._graph.closed(self.site)
            unmasked = (survivor_set & closed) - self._u2
            if unmasked:
                raise SecAggError(
                    f"surviving neighbours this site did not mask with: {sorted(unmasked)}"
                )
            if len(survivor_set & closed) < self._threshold:
                raise SecAggError(
                    f"{len(survivor_set & closed)} of this site's neighbourhood survive, below "
                    f"its threshold t={self._threshold}"
                )
        except SecAggError as exc:
            raise self._abort(exc) from None
        u3 = tuple(sorted(survivor_set))
        survivor_list = consistency_message(self.params, u3, self._seed)
        tags = {
            peer: mac_tag(self._mac_keys[peer], attestation_message(survivor_list, self.site, peer))
            for peer in sorted((survivor_set & self._u2) - {self.site})
        }
        self._u3, self._survivor_list = u3, survivor_list
        self._stage = RoundStage.CHECKED
        return tags

    def unmask(
        self,
        survivors: Sequence[str],
        dropped: Sequence[str],
        attestations: Mapping[str, bytes],
        acknowledgements: Mapping[str, bytes],
    ) -> UnmaskResponse:
        """Stage 5: reveal the shares the aggregator needs, and only those.

        Parameters
        ----------
        survivors : sequence of str
            ``U3``: must be the list this site attested.
        dropped : sequence of str
            ``U2 \\ U3`` as the aggregator has it; its members among this site's neighbours must
            be exactly the neighbours of ``U2_v`` outside ``U3``.
        attestations : mapping of str to bytes
            Neighbour -> its tag of ``U3`` addressed to this site. At least ``t_v - 1`` must be
            valid (this site's own attestation counts as the ``t_v``-th).
        acknowledgements : mapping of str to bytes
            Neighbour -> its acknowledgement addressed to this site; one is required of every
            surviving neighbour whose self-mask share this site reveals.

        Returns
        -------
        UnmaskResponse
            Self-mask shares of the survivors among ``U2_v`` (this site included) and mask-key
            shares of the others; never both for one site.

        Raises
        ------
        SecAggError
            If ``survivors`` is not the attested list, ``dropped`` disagrees with ``U2_v``, a
            tag is invalid or from a site that is not a surviving neighbour, fewer than ``t_v``
            attestations hold, or a surviving neighbour's acknowledgement is missing or invalid.
            Nothing is revealed; the round is over for this site.
        FailedPreconditionError
            Out of order, or a second call.
        """
        check_stage(self._stage, RoundStage.CHECKED, "unmask")
        assert self._graph is not None
        params = self.params
        try:
            survivor_set, dropped_set = set(survivors), set(dropped)
            if len(survivor_set) != len(survivors) or len(dropped_set) != len(dropped):
                raise SecAggError("the survivor or dropped list repeats a site")
            if survivor_set != set(self._u3):
                raise SecAggError(
                    f"the survivors {sorted(survivor_set)} are not the list this site attested "
                    f"{list(self._u3)}"
                )
            neighbours = self._graph.neighbours(self.site)
            expected_dropped = self._u2 - survivor_set
            if dropped_set & neighbours != expected_dropped:
                raise SecAggError(
                    f"the dropped neighbours {sorted(dropped_set & neighbours)} are not this "
                    f"site's U2 \\ U3 {sorted(expected_dropped)}"
                )
            voters = survivor_set & neighbours
            strangers = sorted(set(attestations) - voters)
            if strangers:
                raise SecAggError(
                    f"attestations from sites that are not surviving neighbours: {strangers}"
                )
            valid = 1
            survivor_list = self._survivor_list  # what this site attested
            for sender in sorted(attestations):
                message = attestation_message(survivor_list, sender, self.site)
                if not check_tag(self._mac_keys[sender], message, bytes(attestations[sender])):
                    raise SecAggError(f"{sender!r} did not attest this site's survivor list")
                valid += 1
            if valid < self._threshold:
                raise SecAggError(
                    f"{valid} attestations of the survivor list in this site's neighbourhood, "
                    f"below its threshold t={self._threshold}"
                )
            for peer in sorted((self._u2 & survivor_set) - {self.site}):
                tag = acknowledgements.get(peer)
                message = acknowledgement_message(params, peer, self.site)
                if tag is None or not check_tag(self._mac_keys[peer], message, bytes(tag)):
                    raise SecAggError(
                        f"no valid acknowledgement that {peer!r} masked its input with this site"
                    )
        except SecAggError as exc:
            raise self._abort(exc) from None
        response = UnmaskResponse(
            self_mask_shares={v: self._held[v][0] for v in sorted(self._u2 & survivor_set)},
            key_shares={v: self._held[v][1] for v in sorted(self._u2 - survivor_set)},
        )
        self._held.clear()
        self._mac_keys.clear()
        self._stage = RoundStage.DONE
        return response


class SparseSecAggAggregator(AggregatorBase):
    """The aggregator's side of a SecAgg+ round (the six stages of the module docstring).

    Call :meth:`collect_advertisements`, :meth:`collect_nonces`, :meth:`route_shares`,
    :meth:`collect_masked`, :meth:`collect_attestations` and :meth:`finish` once each, in that
    order. It holds no secret; any :class:`SecAggError` aborts the round and nothing is released.

    Parameters
    ----------
    params : RoundParams
        A sparse round.

    Raises
    ------
    ValueError
        If the round is not sparse.
    """

    def __init__(self, params: RoundParams) -> None:
        _require_sparse(params)
        super().__init__(params)
        self._u1: dict[str, KeyAdvertisement] = {}
        self._graph: NeighbourGraph | None = None
        self._seed = b""
        self._masked_with: dict[str, frozenset[str]] = {}
        self._acks: dict[str, dict[str, bytes]] = {}
        self._attesters: tuple[str, ...] = ()

    @property
    def graph(self) -> NeighbourGraph | None:
        """The round's graph, once :meth:`collect_nonces` fixed it."""
        return self._graph

    def _s_public(self, site: str) -> bytes:
        return self._u1[site].s_public

    def _masked_together(self, dropped: str, survivor: str) -> bool:
        return dropped in self._masked_with[survivor]

    def collect_advertisements(
        self, advertisements: Mapping[str, KeyAdvertisement]
    ) -> dict[str, KeyAdvertisement]:
        """Stage 0: fix ``U1``; return it, sorted, to broadcast with the reveal requests.

        Raises
        ------
        SecAggError
            If fewer than 2 sites advertised, a site is not in the round, an advertisement is
            filed under another site, a key or commitment is not 32 bytes, or a key repeats.
        """
        check_stage(self._stage, RoundStage.NEW, "collect_advertisements")
        seen: set[bytes] = set()
        for name, ad in advertisements.items():
            if name not in self.params.sites:
                raise self._fail(f"advertisement from {name!r}, which is not in the round")
            if ad.site != name:
                raise self._fail(f"advertisement filed under {name!r} names site {ad.site!r}")
            if len(ad.commitment) != KEY_BYTES:
                raise self._fail(f"advertisement of {name!r} has no graph-nonce commitment")
            for key in (ad.c_public, ad.s_public):
                if len(key) != KEY_BYTES or key in seen:
                    raise self._fail(f"advertisement of {name!r} has a bad or repeated key")
                seen.add(key)
        if len(advertisements) < 2:
            raise self._fail(f"{len(advertisements)} sites advertised keys, below 2")
        self._u1 = {name: advertisements[name] for name in sorted(advertisements)}
        self._stage = RoundStage.ADVERTISED
        return dict(self._u1)

    def collect_nonces(self, nonces: Mapping[str, bytes]) -> dict[str, bytes]:
        """Stage 1: fix the graph from every site's nonce; return the nonces to broadcast.

        Raises
        ------
        SecAggError
            If a site of ``U1`` revealed nothing (the seed cannot leave it out: see
            :mod:`dpmarket.common.secagg.graph`) or a nonce does not open its commitment.
        """
        check_stage(self._stage, RoundStage.ADVERTISED, "collect_nonces")
        commitments = {name: ad.commitment for name, ad in self._u1.items()}
        try:
            seed = graph_seed(self.params.digest, nonces, commitments, self.params.round_id)
        except SecAggError as exc:
            raise self._fail(str(exc)) from None
        params = self.params
        self._seed = seed
        self._graph = NeighbourGraph.build(
            params.sites, seed, params.neighbours, params.allowance, params.ring
        )
        self._stage = RoundStage.REVEALED
        return {name: bytes(nonces[name]) for name in sorted(nonces)}

    def route_shares(
        self, from_site: Mapping[str, Mapping[str, bytes]]
    ) -> dict[str, dict[str, bytes]]:
        """Stage 2: fix ``U2`` (the sites that sent their shares) and route each ciphertext.

        Parameters
        ----------
        from_site : mapping of str to (mapping of str to bytes)
            Sender -> (neighbour -> ciphertext).

        Returns
        -------
        dict of str to (dict of str to bytes)
            Recipient in ``U2`` -> (sender in ``U2`` -> ciphertext addressed to it).

        Raises
        ------
        SecAggError
            If fewer than 2 sites sent shares, a sender is not in ``U1``, or a sender did not
            address exactly its neighbours in ``U1``.
        """
        check_stage(self._stage, RoundStage.REVEALED, "route_shares")
        assert self._graph is not None
        for sender, addressed in from_site.items():
            if sender not in self._u1:
                raise self._fail(f"shares from {sender!r}, which did not advertise keys")
            expected = self._graph.neighbours(sender) & set(self._u1)
            if set(addressed) != expected:
                raise self._fail(
                    f"{sender!r} addressed shares to {sorted(addressed)}, expected its "
                    f"neighbours in U1 {sorted(expected)}"
                )
        if len(from_site) < 2:
            raise self._fail(f"{len(from_site)} sites completed key sharing, below 2")
        u2 = sorted(from_site)
        routed = {
            recipient: {
                sender: bytes(from_site[sender][recipient])
                for sender in u2
                if recipient in from_site[sender]
            }
            for recipient in u2
        }
        self._masked_with = {r: frozenset(senders) for r, senders in routed.items()}
        self._stage = RoundStage.SHARED
        return routed

    def collect_masked(
        self,
        inputs: Mapping[str, ArrayLike],
        acknowledgements: Mapping[str, Mapping[str, bytes]],
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Stage 3: fix ``U3`` (the survivors), add their masked inputs up, keep their
        acknowledgements.

        Parameters
        ----------
        inputs : mapping of str to ndarray of shape (vector_length,), uint64
        acknowledgements : mapping of str to (mapping of str to bytes)
            Survivor -> its :attr:`SparseSecAggSite.acknowledgements`, which must name exactly the
            neighbours it was routed shares from.

        Returns
        -------
        survivors : tuple of str
            ``U3``, sorted.
        dropped : tuple of str
            ``U2 \\ U3``, sorted.

        Raises
        ------
        SecAggError
            If fewer than 2 inputs arrived, a site is not in ``U2``, an input is malformed, or a
            survivor's acknowledgements do not match its routed shares.
        """
        check_stage(self._stage, RoundStage.SHARED, "collect_masked")
        total = np.zeros(self.params.vector_length, dtype=np.uint64)
        for name, vector in inputs.items():
            if name not in self._masked_with:
                raise self._fail(f"masked input from {name!r}, which is not in U2")
            values = self._checked_input(name, vector)
            if set(acknowledgements.get(name, {})) != self._masked_with[name]:
                raise self._fail(f"the acknowledgements of {name!r} do not match its shares")
            total += values
        if len(inputs) < 2:
            raise self._fail(f"{len(inputs)} masked inputs arrived, below 2")
        self._u3 = tuple(sorted(inputs))
        self._dropped = tuple(sorted(set(self._masked_with) - set(self._u3)))
        self._acks = {name: dict(acknowledgements[name]) for name in self._u3}
        self._total = total
        self._stage = RoundStage.MASKED
        return self._u3, self._dropped

    def collect_attestations(
        self, attestations: Mapping[str, Mapping[str, bytes]]
    ) -> dict[str, tuple[dict[str, bytes], dict[str, bytes]]]:
        """Stage 4: fix ``U4`` (the survivors that attested); route every tag to its addressee.

        Parameters
        ----------
        attestations : mapping of str to (mapping of str to bytes)
            Survivor -> its :meth:`SparseSecAggSite.attest` tags (neighbour -> tag).

        Returns
        -------
        dict of str to (dict, dict)
            For every site of ``U4``: (sender -> attestation tag addressed to it, sender ->
            acknowledgement addressed to it), the last two arguments of its
            :meth:`SparseSecAggSite.unmask`. The aggregator checks no tag.

        Raises
        ------
        SecAggError
            If an attester is not a survivor, or fewer than 2 attested.
        """
        check_stage(self._stage, RoundStage.MASKED, "collect_attestations")
        for name in attestations:
            if name not in self._u3:
                raise self._fail(f"an attestation of U3 from {name!r}, which is not a survivor")
        if len(attestations) < 2:
            raise self._fail(f"{len(attestations)} survivors attested U3, below 2")
        attesters = tuple(sorted(attestations))
        out: dict[str, tuple[dict[str, bytes], dict[str, bytes]]] = {}
        for recipient in attesters:
            tags = {
                sender: bytes(attestations[sender][recipient])
                for sender in attesters
                if recipient in attestations[sender]
            }
            acks = {
                sender: self._acks[sender][recipient]
                for sender in self._u3
                if recipient in self._acks[sender]
            }
            out[recipient] = (tags, acks)
        self._attesters = attesters
        self._stage = RoundStage.CHECKED
        return out

    def _reconstruct(self, owner: str, shares: list[tuple[str, Share]], what: str) -> bytes:
        assert self._graph is not None
        t = self._graph.threshold(owner)
        if len(shares) < t:
            raise self._fail(
                f"{len(shares)} shares of {owner!r}'s {what}, below its threshold t={t}"
            )
        base = shares[:t]
        for responder, share in base:
            if share.x != self._graph.index(responder) + 1:
                raise self._fail(
                    f"{responder!r} sent a share of {owner!r}'s {what} for x={share.x}"
                )
        try:
            return shamir.combine_shares([share for _, share in base], KEY_BYTES)
        except ValueError as exc:
            raise self._fail(f"cannot reconstruct {owner!r}'s {what}: {exc}") from None

    def finish(self, responses: Mapping[str, UnmaskResponse]) -> NDArray[np.float64]:
        """Stage 5: rebuild the needed secrets from ``t_v`` shares each, remove every mask and
        return the sum of the survivors' inputs.

        Parameters
        ----------
        responses : mapping of str to UnmaskResponse
            Site of ``U4`` -> its :meth:`SparseSecAggSite.unmask` response.

        Returns
        -------
        ndarray of shape (vector_length,), float64
            The sum of the inputs of ``U3``, within ``|U3| / scale`` per entry.

        Raises
        ------
        SecAggError
            If a responder did not attest, a response does not hold exactly the shares its site
            holds, a secret has fewer than ``t_v`` shares, a rebuilt mask key does not match its
            advertisement, or the result is not a sum of ``|U3|`` quantized vectors.
        """
        check_stage(self._stage, RoundStage.CHECKED, "finish")
        assert self._total is not None and self._graph is not None
        survivors = set(self._u3)
        seed_shares: dict[str, list[tuple[str, Share]]] = {v: [] for v in self._u3}
        key_shares: dict[str, list[tuple[str, Share]]] = {w: [] for w in self._dropped}
        for name in sorted(responses):
            response = responses[name]
            if name not in self._attesters:
                raise self._fail(f"unmasking response from {name!r}, which did not attest U3")
            held = self._masked_with[name] | {name}
            if (
                set(response.self_mask_shares) != held & survivors
                or set(response.key_shares) != held - survivors
            ):
                raise self._fail(f"the unmasking response of {name!r} holds the wrong shares")
            for owner, share in response.self_mask_shares.items():
                seed_shares[owner].append((name, share))
            for owner, share in response.key_shares.items():
                key_shares[owner].append((name, share))
        seeds = [
            self._reconstruct(owner, seed_shares[owner], "self-mask seed") for owner in self._u3
        ]
        return self._unmasked_sum(
            seeds,
            lambda owner: self._reconstruct(owner, key_shares[owner], "pairwise-mask key"),
        )


def make_site(
    site: str,
    params: RoundParams,
    *,
    signer: Signer,
    verifier: Verifier,
    random_bytes: RandomBytes = os.urandom,
    keyring: PairKeyring | None = None,
) -> SecAggSite | SparseSecAggSite:
    """The site state object for ``params``: sparse or complete graph."""
    cls = SparseSecAggSite if params.sparse else SecAggSite
    return cls(
        site,
        params,
        signer=signer,
        verifier=verifier,
        random_bytes=random_bytes,
        keyring=keyring,
    )


def make_aggregator(params: RoundParams) -> SecAggAggregator | SparseSecAggAggregator:
    """The aggregator state object for ``params``: sparse or complete graph."""
    return SparseSecAggAggregator(params) if params.sparse else SecAggAggregator(params)


def run_sparse_in_process(
    params: RoundParams,
    sites: Mapping[str, ArrayLike],
    *,
    drop_at: Mapping[str, str] | None = None,
    signers: Mapping[str, Signer] | None = None,
    verifier: Verifier | None = None,
    random_bytes: RandomBytes = os.urandom,
    rng: np.random.Generator | None = None,
    phase_seconds: dict[str, float] | None = None,
    keyrings: Mapping[str, PairKeyring] | None = None,
) -> NDArray[np.float64]:
    """Run one SecAgg+ round with every site and the aggregator in this process.

    As :func:`dpmarket.common.secagg.protocol.run_in_process`
    (:func:`dpmarket.common.secagg.run_in_process` runs either), with the stage ``"reveal"`` added
    to ``drop_at`` (a site lost there aborts the round: the graph seed needs every advertised nonce)
    and the phase ``reveal_nonces`` to ``phase_seconds``.

    Raises
    ------
    SecAggError
        If a neighbourhood lost more sites than its threshold allows, a site was lost at
        ``"reveal"``, or any check fails. Nothing is returned.
    ValueError
        If ``sites`` does not hold exactly ``params.sites``, a stage is unknown, an input is out
        of range, or only one of ``signers`` and ``verifier`` is given.
    """
    _require_sparse(params)
    run = prepare_run(params, sites, SPARSE_DROP_STAGES, drop_at, signers, verifier, rng, keyrings)
    timer = PhaseTimer()

    def alive(stage: str) -> list[str]:
        return run.alive(stage, params.sites)

    aggregator = SparseSecAggAggregator(params)
    parties = {
        name: SparseSecAggSite(name, params, **run.site_args(name, random_bytes))
        for name in params.sites
    }

    start = time.perf_counter()
    u1 = aggregator.collect_advertisements(
        {name: parties[name].advertise_keys() for name in alive("advertise")}
    )
    timer.add("advertise_keys", time.perf_counter() - start)

    start = time.perf_counter()
    nonces = aggregator.collect_nonces(
        {name: parties[name].reveal_nonce(u1) for name in alive("reveal") if name in u1}
    )
    timer.add("reveal_nonces", time.perf_counter() - start)

    start = time.perf_counter()
    routed = aggregator.route_shares(
        {name: parties[name].share_keys(nonces) for name in alive("share") if name in u1}
    )
    timer.add("share_keys", time.perf_counter() - start)

    start = time.perf_counter()
    masked = {
        name: parties[name].masked_input(routed[name], sites[name], run.rng)
        for name in alive("mask")
        if name in routed
    }
    survivors, dropped = aggregator.collect_masked(
        masked, {name: parties[name].acknowledgements for name in masked}
    )
    timer.add("masked_input", time.perf_counter() - start)

    start = time.perf_counter()
    forwarded = aggregator.collect_attestations(
        {name: parties[name].attest(survivors) for name in alive("check") if name in survivors}
    )
    timer.add("consistency_check", time.perf_counter() - start)

    start = time.perf_counter()
    responses = {
        name: parties[name].unmask(survivors, dropped, *forwarded[name])
        for name in alive("unmask")
        if name in forwarded
    }
    timer.add("unmask", time.perf_counter() - start)

    start = time.perf_counter()
    result = aggregator.finish(responses)
    timer.add("finish", time.perf_counter() - start)
    if phase_seconds is not None:
        phase_seconds.update(timer.phases)
    return result
