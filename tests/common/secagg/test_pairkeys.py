"""Long-lived pair keys against an active curator: a substituted advertisement, the replay of a
previous round's messages, a colluder's forged tag. Each attack is refused before the victim masks
anything; each has a control in which the holders' tag check is switched off (``check_tag``
accepting every tag) and the same attack reads the victim's input, so the tests can fail.

Also: bindings are verified and pair keys derived once per keyring, not per round; rotation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import NDArray

from dpmarket.common.secagg import FixedPoint, RoundParams, SecAggError, shamir
from dpmarket.common.secagg import base as secagg_base
from dpmarket.common.secagg.base import ADV_TAG_BYTES, MASK_KEY_LABEL, RoundStage, pair_info
from dpmarket.common.secagg.crypto import (
    KEY_BYTES,
    EcdsaVerifier,
    MaskAccumulator,
    generate_private_key,
    private_key_from_bytes,
    public_key_bytes,
    shared_key,
)
from dpmarket.common.secagg.fixedpoint import dequantize_sum
from dpmarket.common.secagg.pairkeys import PairKeyring
from dpmarket.common.secagg.protocol import (
    KeyAdvertisement,
    SecAggAggregator,
    SecAggSite,
    run_in_process,
)
from tests.common.secagg.conftest import make_identities, seeded_bytes
from tests.common.secagg.test_sparse import SparseSession


class CountingVerifier:
    """An :class:`EcdsaVerifier` that counts the static-key bindings it verifies."""

    def __init__(self, inner: EcdsaVerifier) -> None:
        self.inner = inner
        self.bindings = 0

    def verify(self, site: str, message: bytes, signature: bytes) -> None:
        if b"static-key-binding" in message:
            self.bindings += 1
        self.inner.verify(site, message, signature)


class Sites:
    """Sites that take part in several rounds, each with its long-lived keyring (as an owner
    process holds one)."""

    def __init__(self, names: Sequence[str], seed: int = 0) -> None:
        self.ids = make_identities(names)
        self.verifier = CountingVerifier(self.ids.verifier)
        self.keyrings = {
            n: PairKeyring(n, self.ids.signers[n], random_bytes=seeded_bytes(seed + i))
            for i, n in enumerate(names)
        }
        self.data = np.random.default_rng(seed)

    def round(self, names: Sequence[str], threshold: int, colluders: int = 0) -> Round:
        params = RoundParams.create(
            names, threshold, 32, FixedPoint(1.0, 16, len(names)), colluders=colluders
        )
        sites = {
            n: SecAggSite(
                n,
                params,
                signer=self.ids.signers[n],
                verifier=self.verifier,
                keyring=self.keyrings[n],
            )
            for n in params.sites
        }
        inputs = {n: self.data.uniform(-1, 1, 32) for n in params.sites}
        return Round(params, sites, SecAggAggregator(params), inputs)


@dataclass
class Round:
    params: RoundParams
    sites: dict[str, SecAggSite]
    aggregator: SecAggAggregator
    inputs: dict[str, NDArray[np.float64]]

    def advertise(self) -> dict[str, KeyAdvertisement]:
        ads = {n: s.advertise_keys() for n, s in self.sites.items()}
        return self.aggregator.collect_advertisements(ads)

    def share(
        self,
        u1: Mapping[str, KeyAdvertisement],
        shown: Mapping[str, Mapping[str, KeyAdvertisement]],
    ) -> dict[str, dict[str, bytes]]:
        """Every site shares, site ``n`` given ``shown.get(n, u1)``; returns the routed shares."""
        out = {n: s.share_keys(shown.get(n, u1)) for n, s in self.sites.items()}
        return self.aggregator.route_shares(out)

    def mask(self, routed: Mapping[str, Mapping[str, bytes]]) -> dict[str, NDArray[np.uint64]]:
        rng = np.random.default_rng(0)
        masked = {n: s.masked_input(routed[n], self.inputs[n], rng) for n, s in self.sites.items()}
        self.aggregator.collect_masked(masked)
        return masked

    def unmask_all_survived(self) -> dict[str, list[shamir.Share]]:
        """The consistency check and the unmasking with every site a survivor: survivor ->
        the shares of its self-mask seed the curator receives."""
        survivors = tuple(self.params.sites)
        signed = self.aggregator.collect_signatures(
            {n: s.check_consistency(survivors) for n, s in self.sites.items()}
        )
        responses = {n: s.unmask(survivors, (), signed) for n, s in self.sites.items()}
        return {v: [r.self_mask_shares[v] for r in responses.values()] for v in survivors}


def read_input(
    params: RoundParams,
    victim: str,
    masked: NDArray[np.uint64],
    seed_shares: Sequence[shamir.Share],
    pair_masks: Mapping[str, bytes],
) -> NDArray[np.float64]:
    """The victim's input, from its masked vector, ``t`` shares of its self-mask seed and the
    key of every pairwise mask it applied (peer -> key): what the curator computes if it holds
    them all."""
    assert set(pair_masks) == set(params.sites) - {victim}
    seed = shamir.combine_shares(list(seed_shares)[: params.threshold], KEY_BYTES)
    y = np.array(masked, dtype=np.uint64)
    masks = MaskAccumulator(params.vector_length)
    masks.subtract(y, seed)
    for peer, key in pair_masks.items():
        # The victim added PRG(s) for peers before it and subtracted it for those after.
        (masks.subtract if peer < victim else masks.add)(y, key)
    y &= np.uint64(params.fixed_point.modulus - 1)
    return dequantize_sum(y, params.fixed_point, 1)


def mask_key(
    private: X25519PrivateKey, public: bytes, params: RoundParams, a: str, b: str
) -> bytes:
    return shared_key(private, public, info=pair_info(MASK_KEY_LABEL, params.round_id, a, b))


def switch_off_tag_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: every holder accepts every advertisement tag."""
    monkeypatch.setattr(secagg_base, "check_tag", lambda key, message, tag: True)


# ---------------------------------------------------- a substituted key, a colluder's forged tag
def substitution(
    colluder: bool,
) -> tuple[Round, dict[str, dict[str, bytes]], X25519PrivateKey, dict[str, KeyAdvertisement]]:
    """Victim ``a``, honest ``b`` and (``colluder``) the colluder ``c``, t = all of them. The
    curator shows ``a`` a mask key of its own as ``b``'s (keeping ``b``'s static key and its
    binding, so ``a`` shares); the colluder, if any, replaces ``b``'s tag for ``a`` by one it
    makes for the substituted advertisement under its own pair key with ``a``."""
    names = ["a", "b", "c"] if colluder else ["a", "b"]
    r = Sites(names, seed=11).round(names, len(names), colluders=1 if colluder else 0)
    u1 = r.advertise()
    curator_s = generate_private_key()
    shown = {**u1, "b": KeyAdvertisement(
        "b", u1["b"].c_public, public_key_bytes(curator_s), u1["b"].signature
    )}  # fmt: skip
    routed = r.share(u1, {"a": shown})
    if colluder:
        forged = secagg_base.mac_tag(
            r.sites["c"]._round_keys["a"].adv,  # the colluder's own key with a
            secagg_base.advertisement_tag_message(
                r.params.round_id, "b", "a", shown["b"].c_public, shown["b"].s_public
            ),
        )
        routed["a"]["b"] = forged + routed["a"]["b"][ADV_TAG_BYTES:]
    return r, routed, curator_s, u1


@pytest.mark.parametrize("colluder", [False, True], ids=["substituted", "colluder-forged-tag"])
def test_a_substituted_mask_key_is_refused_before_the_victim_masks(colluder: bool) -> None:
    r, routed, _, _ = substitution(colluder)
    victim = r.sites["a"]
    with pytest.raises(SecAggError, match="'b' this site was shown is not the one 'b' made"):
        victim.masked_input(routed["a"], r.inputs["a"], np.random.default_rng(0))
    assert victim.stage is RoundStage.ABORTED


@pytest.mark.parametrize("colluder", [False, True], ids=["substituted", "colluder-forged-tag"])
def test_control_without_the_tag_check_the_substitution_reads_the_victims_input(
    monkeypatch: pytest.MonkeyPatch, colluder: bool
) -> None:
    """The same attack, tag check off: ``a`` masks with the curator's key, and with ``a``'s
    self-mask seed (revealed at unmasking: it survived) and the colluder's pair mask the curator
    reads ``a``'s input alone, which it never may."""
    switch_off_tag_checks(monkeypatch)
    r, routed, curator_s, u1 = substitution(colluder)
    colluder_s = r.sites["c"]._s_private if colluder else None  # a colluder hands it over
    masked = r.mask(routed)
    seed_shares = r.unmask_all_survived()["a"]
    pair_masks = {"b": mask_key(curator_s, u1["a"].s_public, r.params, "a", "b")}
    if colluder_s is not None:
        pair_masks["c"] = mask_key(colluder_s, u1["a"].s_public, r.params, "a", "c")
    read = read_input(r.params, "a", masked["a"], seed_shares, pair_masks)
    assert np.max(np.abs(read - r.inputs["a"])) <= 1 / r.params.fixed_point.scale


# ---------------------------------------------------------- replay of a previous round's messages
def replay() -> tuple[
    Round, dict[str, dict[str, bytes]], X25519PrivateKey, dict[str, KeyAdvertisement], Round
]:
    """Round 1 (a, b, c; t = 2): b is lost after sharing, so the curator legitimately rebuilds
    b's mask key from shares. Round 2 (a, b; the same sites and keyrings): the curator shows a
    b's advertisement of round 1, whose mask key it now holds."""
    sites = Sites(["a", "b", "c"], seed=21)
    first = sites.round(["a", "b", "c"], 2)
    u1_old = first.advertise()
    routed = first.share(u1_old, {})
    rng = np.random.default_rng(1)
    masked = {n: first.sites[n].masked_input(routed[n], first.inputs[n], rng) for n in ("a", "c")}
    survivors, dropped = first.aggregator.collect_masked(masked)
    assert dropped == ("b",)
    signed = first.aggregator.collect_signatures(
        {n: first.sites[n].check_consistency(survivors) for n in survivors}
    )
    responses = {n: first.sites[n].unmask(survivors, dropped, signed) for n in survivors}
    first.aggregator.finish(responses)  # the round's sum: b's mask key rebuilt, as designed
    old_key = private_key_from_bytes(
        shamir.combine_shares([r.key_shares["b"] for r in responses.values()], KEY_BYTES)
    )
    assert public_key_bytes(old_key) == u1_old["b"].s_public

    second = sites.round(["a", "b"], 2)
    u1 = second.advertise()
    routed = second.share(u1, {"a": {**u1, "b": u1_old["b"]}})
    return second, routed, old_key, u1, first


def test_an_advertisement_replayed_from_a_previous_round_is_refused() -> None:
    """b's round-1 advertisement carries b's genuine static key and binding, so a shares in
    round 2 (to b alone, under their pair key); the tag b made in round 2 covers its round-2
    mask key only, and a refuses before masking."""
    r, routed, _, _, _ = replay()
    victim = r.sites["a"]
    with pytest.raises(SecAggError, match="'b' this site was shown is not the one 'b' made"):
        victim.masked_input(routed["a"], r.inputs["a"], np.random.default_rng(0))
    assert victim.stage is RoundStage.ABORTED


def test_control_without_the_tag_check_the_replay_reads_the_victims_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    switch_off_tag_checks(monkeypatch)
    r, routed, old_key, u1, _ = replay()
    masked = r.mask(routed)
    seed_shares = r.unmask_all_survived()["a"]
    pair_masks = {"b": mask_key(old_key, u1["a"].s_public, r.params, "a", "b")}
    read = read_input(r.params, "a", masked["a"], seed_shares, pair_masks)
    assert np.max(np.abs(read - r.inputs["a"])) <= 1 / r.params.fixed_point.scale


def test_share_ciphertexts_and_tags_replayed_from_a_previous_round_are_refused() -> None:
    """The same pair's message of round 1 (tag and ciphertext, genuine then) in round 2: the
    round's keys differ, so it fails authentication. Control: it is genuine under round 1's
    keys (the first round's holder decrypts it)."""
    sites = Sites(["a", "b"], seed=31)
    first = sites.round(["a", "b"], 2)
    old_routed = first.share(first.advertise(), {})
    second = sites.round(["a", "b"], 2)
    routed = second.share(second.advertise(), {})
    with pytest.raises(SecAggError, match="failed authentication"):
        second.sites["a"].masked_input(
            {"b": old_routed["a"]["b"]}, second.inputs["a"], np.random.default_rng(0)
        )
    assert second.sites["a"].stage is RoundStage.ABORTED
    first.sites["a"].masked_input(old_routed["a"], first.inputs["a"], np.random.default_rng(0))
    assert routed["a"]["b"] != old_routed["a"]["b"]


def test_a_substituted_neighbour_key_is_refused_in_a_sparse_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SecAgg+: the curator shows a site another mask key as one of its neighbours'. The site
    refuses at its masked input; with the tag check off (control) it masks with the curator's
    key."""
    for control in (False, True):
        if control:
            switch_off_tag_checks(monkeypatch)
        s = SparseSession(40, 8, 2, seed=41)
        graph = s.dry_graph()
        victim = s.names[0]
        neighbour = sorted(graph.neighbours(victim))[0]
        u1 = s.aggregator.collect_advertisements({n: s.sites[n].advertise_keys() for n in s.names})
        curator_s = generate_private_key()
        ad = u1[neighbour]
        shown = {**u1, neighbour: KeyAdvertisement(
            neighbour, ad.c_public, public_key_bytes(curator_s), ad.signature, ad.commitment
        )}  # fmt: skip
        nonces = s.aggregator.collect_nonces(
            {n: s.sites[n].reveal_nonce(shown if n == victim else u1) for n in s.names}
        )
        routed = s.aggregator.route_shares({n: s.sites[n].share_keys(nonces) for n in s.names})
        site = s.sites[victim]
        if not control:
            with pytest.raises(SecAggError, match=f"'{neighbour}' this site was shown"):
                site.masked_input(routed[victim], s.inputs[victim], s.rng)
            assert site.stage is RoundStage.ABORTED
        else:
            site.masked_input(routed[victim], s.inputs[victim], s.rng)
            assert site._s_public(neighbour) == public_key_bytes(curator_s)
            assert site.stage is RoundStage.MASKED


# ------------------------------------------------------------------------ once per keyring
def test_bindings_are_verified_once_per_peer_and_key_and_rotation_binds_a_new_key() -> None:
    """Three rounds between the same five sites: the first verifies every binding (each site
    its four peers'), the second none, and after one site rotates its static key the third
    verifies that key's binding once per peer. Every sum is right; the rotated-out key is
    erased and a round still holding it cannot derive pair keys."""
    names = [f"s{i}" for i in range(5)]
    sites = Sites(names, seed=51)
    data = np.random.default_rng(3)

    def one_round() -> None:
        params = RoundParams.create(names, 4, 16, FixedPoint(1.0, 16, 5), colluders=1)
        inputs = {n: data.uniform(-1, 1, 16) for n in names}
        result = run_in_process(
            params,
            inputs,
            signers=sites.ids.signers,
            verifier=sites.verifier,
            keyrings=sites.keyrings,
            rng=np.random.default_rng(0),
        )
        assert np.max(np.abs(result - sum(inputs.values()))) <= 5 / params.fixed_point.scale

    one_round()
    assert sites.verifier.bindings == 5 * 4
    one_round()
    assert sites.verifier.bindings == 5 * 4
    old = sites.keyrings["s0"].current
    sites.keyrings["s0"].rotate()
    one_round()
    assert sites.verifier.bindings == 5 * 4 + 4
    with pytest.raises(SecAggError, match="was rotated"):
        old.pair_key("s1", sites.keyrings["s1"].current.public)


def test_a_binding_names_its_site_and_a_pairs_round_keys_are_its_own() -> None:
    """A binding verifies for its own site only (a site's static key presented as another's is
    refused); two sites derive the same pair key, another pair a different one; a round's keys
    are the same whichever site derives them (the names in either order) and independent from
    round to round."""
    sites = Sites(["a", "b", "c"], seed=61)
    a, b = sites.keyrings["a"], sites.keyrings["b"]
    b.check_binding("a", a.current.public, a.current.signature, sites.verifier)
    with pytest.raises(SecAggError, match="not signed by 'c'"):
        b.check_binding("c", a.current.public, a.current.signature, sites.verifier)
    assert a.current.pair_key("b", b.current.public) == b.current.pair_key("a", a.current.public)
    assert a.current.pair_key("b", b.current.public) != a.current.pair_key(
        "c", sites.keyrings["c"].current.public
    )
    pair = a.current.pair_key("b", b.current.public)
    keys = PairKeyring.round_keys(pair, bytes(16), "a", "b")
    assert PairKeyring.round_keys(pair, bytes(16), "b", "a") == keys
    other = PairKeyring.round_keys(pair, bytes(17), "a", "b")
    assert len({keys.adv, keys.enc, keys.tag, other.adv, other.enc, other.tag}) == 6
