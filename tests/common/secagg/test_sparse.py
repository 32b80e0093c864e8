"""SecAgg+ end to end on the state objects: the sum with dropouts, the per-neighbourhood checks,
and the inconsistent-survivor attack on a 100-site sparse round.

The attack (as ``test_active_aggregator.py`` runs it on the complete graph): after every site
masked, tell some honest neighbours of a victim that it survived and others that it dropped; the
colluders attest both survivor lists (they hold their pairwise keys) and hand over every share they
hold. With thresholds that satisfy Condition A of :mod:`dpmarket.common.secagg.graph` the attacker
never holds ``t_v`` shares of both of the victim's secrets, whatever the split; with thresholds that
violate it (the positive control) the same code recovers the victim's input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pytest
from numpy.typing import NDArray

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.secagg import FixedPoint, RoundParams, SecAggError, run_in_process
from dpmarket.common.secagg.crypto import mac_tag
from dpmarket.common.secagg.graph import NeighbourGraph, nonce_commitment, ring_order
from dpmarket.common.secagg.protocol import (
    KeyAdvertisement,
    RoundStage,
    advertisement_message,
    consistency_message,
)
from dpmarket.common.secagg.shamir import Share
from dpmarket.common.secagg.sparse import (
    SparseSecAggAggregator,
    SparseSecAggSite,
    acknowledgement_message,
    attestation_message,
)
from tests.common.secagg.attack import distinct, recover_input
from tests.common.secagg.conftest import Identities, make_identities, seeded_bytes


class SparseSession:
    """A sparse round of ``n`` sites named ``site-000`` ..., driven stage by stage, reproducible
    from ``seed`` (round id, key material, nonces, rounding coins, inputs)."""

    def __init__(
        self,
        n: int,
        k: int,
        allowance: int,
        *,
        colluders: int = 0,
        vector_length: int = 32,
        seed: int = 0,
        identities: Identities | None = None,
        ring: int = 0,
    ) -> None:
        self.names = [f"site-{i:03d}" for i in range(n)]
        self.seed = seed
        self.fixed_point = FixedPoint(1.0, 16, n)
        self.params = RoundParams.create(
            self.names,
            0,
            vector_length,
            self.fixed_point,
            colluders=colluders,
            neighbours=k,
            allowance=allowance,
            ring=ring,
            random_bytes=seeded_bytes(seed),
        )
        self.identities = identities or make_identities(self.names)
        data = np.random.default_rng(seed + 10_000)
        self.inputs = {name: data.uniform(-1, 1, vector_length) for name in self.names}
        self.sites = {
            name: SparseSecAggSite(
                name,
                self.params,
                signer=self.identities.signers[name],
                verifier=self.identities.verifier,
                random_bytes=seeded_bytes(seed * 1000 + i + 1),
            )
            for i, name in enumerate(self.names)
        }
        self.aggregator = SparseSecAggAggregator(self.params)
        self.rng = np.random.default_rng(seed + 20_000)
        self.u1: dict[str, KeyAdvertisement] = {}
        self.masked: dict[str, NDArray[np.uint64]] = {}
        self.survivors: tuple[str, ...] = ()
        self.dropped: tuple[str, ...] = ()

    @property
    def graph(self) -> NeighbourGraph:
        assert self.aggregator.graph is not None
        return self.aggregator.graph

    def dry_graph(self) -> NeighbourGraph:
        """The graph this round will have: the first two stages of a twin round (same seed,
        hence the same round id and nonces)."""
        twin = SparseSession(
            len(self.names),
            self.params.neighbours,
            self.params.allowance,
            colluders=self.params.colluders,
            vector_length=self.params.vector_length,
            seed=self.seed,
            identities=self.identities,
            ring=self.params.ring,
        )
        u1 = twin.aggregator.collect_advertisements(
            {n: twin.sites[n].advertise_keys() for n in twin.names}
        )
        twin.aggregator.collect_nonces({n: twin.sites[n].reveal_nonce(u1) for n in twin.names})
        return twin.graph

    def setup(self, drop: Iterable[str] = ()) -> dict[str, dict[str, bytes]]:
        """Advertise, reveal and share with every site but ``drop`` (lost at sharing)."""
        self.u1 = self.aggregator.collect_advertisements(
            {n: self.sites[n].advertise_keys() for n in self.names}
        )
        nonces = self.aggregator.collect_nonces(
            {n: self.sites[n].reveal_nonce(self.u1) for n in self.names}
        )
        return self.aggregator.route_shares(
            {n: self.sites[n].share_keys(nonces) for n in self.names if n not in set(drop)}
        )

    def mask(self, routed: Mapping[str, Mapping[str, bytes]], drop: Iterable[str] = ()) -> None:
        self.masked = {
            n: self.sites[n].masked_input(routed[n], self.inputs[n], self.rng)
            for n in routed
            if n not in set(drop)
        }
        self.survivors, self.dropped = self.aggregator.collect_masked(
            self.masked, {n: self.sites[n].acknowledgements for n in self.masked}
        )

    def expected_sum(self, included: Iterable[str]) -> NDArray[np.float64]:
        return np.sum([self.inputs[n] for n in included], axis=0)


# --------------------------------------------------------------------------------- the sum
def test_a_round_of_60_sites_sums_exactly_within_quantization() -> None:
    s = SparseSession(60, 10, 3, colluders=3, seed=1)
    routed = s.setup()
    s.mask(routed)
    forwarded = s.aggregator.collect_attestations(
        {n: s.sites[n].attest(s.survivors) for n in s.survivors}
    )
    responses = {n: s.sites[n].unmask(s.survivors, s.dropped, *forwarded[n]) for n in forwarded}
    result = s.aggregator.finish(responses)
    bound = 60 / s.fixed_point.scale
    assert np.max(np.abs(result - s.expected_sum(s.names))) < bound
    assert all(site.stage is RoundStage.DONE for site in s.sites.values())
    # Each site shared with, masked with and heard from its neighbours only.
    for name in s.names:
        holders = s.graph.closed(name)
        assert set(routed[name]) == holders - {name}
        assert set(s.sites[name].acknowledgements) == holders - {name}
        assert s.sites[name].threshold == len(holders) - 3


def test_a_round_on_a_graph_with_a_ring_sums_exactly_and_keeps_to_its_neighbourhoods() -> None:
    """60 sites, 10 colluders, allowance 2: the graph of least degree is k = 7 with a ring of 12
    (:func:`~dpmarket.common.secagg.graph.best_graph`). One site lost after sharing; the others'
    sum comes out, and every site shared with and masked with exactly its neighbours in the
    union of the k-out graph and the ring (every ring neighbour among them)."""
    s = SparseSession(60, 7, 2, colluders=10, seed=9, ring=12)
    routed = s.setup()
    lost = s.names[5]
    s.mask(routed, drop=[lost])
    forwarded = s.aggregator.collect_attestations(
        {n: s.sites[n].attest(s.survivors) for n in s.survivors}
    )
    responses = {n: s.sites[n].unmask(s.survivors, s.dropped, *forwarded[n]) for n in forwarded}
    result = s.aggregator.finish(responses)
    included = [n for n in s.names if n != lost]
    assert np.max(np.abs(result - s.expected_sum(included))) < 60 / s.fixed_point.scale
    order = ring_order(s.sites[s.names[0]]._seed, 60).tolist()
    for position, index in enumerate(order):
        name = s.names[index]
        around = {s.names[order[(position + d) % 60]] for d in range(-6, 7) if d}
        assert around <= s.graph.neighbours(name)
        assert set(routed[name]) == s.graph.neighbours(name)


def test_dropouts_at_every_stage_within_the_allowance() -> None:
    """Three sites lost (allowance 3): one after sharing (its masks are removed from its
    neighbours' shares of its key), one before attesting and one before unmasking (both still
    in the sum); the sum is that of the survivors."""
    s = SparseSession(60, 10, 3, colluders=3, seed=2)
    drops = {"site-004": "mask", "site-017": "check", "site-033": "unmask"}
    result = run_in_process(
        s.params,
        s.inputs,
        drop_at=drops,  # type: ignore[arg-type]
        signers=s.identities.signers,
        verifier=s.identities.verifier,
        random_bytes=seeded_bytes(5),
        rng=np.random.default_rng(6),
    )
    included = [n for n in s.names if n != "site-004"]
    assert np.max(np.abs(result - s.expected_sum(included))) < 60 / s.fixed_point.scale
    # The same sources give the same sum, bit for bit.
    again = run_in_process(
        s.params,
        s.inputs,
        drop_at=drops,  # type: ignore[arg-type]
        signers=s.identities.signers,
        verifier=s.identities.verifier,
        random_bytes=seeded_bytes(5),
        rng=np.random.default_rng(6),
    )
    np.testing.assert_array_equal(result, again)


def test_a_site_lost_before_revealing_aborts_the_round() -> None:
    """The seed needs every advertised nonce: leaving one out after the reveals would let the
    curator choose among seeds."""
    s = SparseSession(40, 8, 2, seed=3)
    with pytest.raises(SecAggError, match=r"revealed no graph nonce: \['site-007'\]"):
        run_in_process(s.params, s.inputs, drop_at={"site-007": "reveal"})


def test_a_neighbourhood_losing_more_than_the_allowance_aborts_without_a_sum() -> None:
    """Two neighbours of a site lost after sharing, allowance 1: the site refuses to attest the
    survivor list (fewer than t_v of its neighbourhood survive), so nobody can reach its quorum
    for it and its input is never unmasked."""
    s = SparseSession(40, 8, 1, seed=4)
    routed = s.setup()
    victim = s.names[0]
    lost = sorted(s.graph.neighbours(victim))[:2]
    s.mask(routed, drop=lost)
    assert set(lost) <= set(s.dropped)
    with pytest.raises(SecAggError, match="survive, below its threshold"):
        s.sites[victim].attest(s.survivors)
    with pytest.raises(FailedPreconditionError, match="needs stage"):
        s.sites[victim].unmask(s.survivors, s.dropped, {}, {})


# ------------------------------------------------------------------ checks of one site
def test_a_forged_neighbour_advertisement_aborts_sharing() -> None:
    """The curator substitutes the keys of every other site in what it shows one site (signed by
    another identity): forged advertisements of non-neighbours change nothing that site uses,
    and it shares; a forged advertisement of a neighbour makes it abort before sharing."""
    s = SparseSession(40, 8, 2, seed=5)
    graph = s.dry_graph()
    victim = s.names[0]
    impostors = make_identities(s.names)

    def forge(ad: KeyAdvertisement) -> KeyAdvertisement:
        message = advertisement_message(
            s.params.round_id, ad.site, ad.c_public, ad.s_public, ad.commitment
        )
        return dataclasses.replace(ad, signature=impostors.signers[ad.site].sign(message))

    u1 = s.aggregator.collect_advertisements({n: s.sites[n].advertise_keys() for n in s.names})
    outside = {n: forge(ad) if n not in graph.closed(victim) else ad for n, ad in u1.items()}
    nonces = {n: s.sites[n].reveal_nonce(outside if n == victim else u1) for n in s.names}
    nonces = s.aggregator.collect_nonces(nonces)
    assert s.graph.neighbours(victim) == graph.neighbours(victim)
    assert set(s.sites[victim].share_keys(nonces)) == graph.neighbours(victim)

    t = SparseSession(40, 8, 2, seed=5, identities=s.identities)
    u1 = t.aggregator.collect_advertisements({n: t.sites[n].advertise_keys() for n in t.names})
    neighbour = sorted(graph.neighbours(victim))[0]
    shown = {**u1, neighbour: forge(u1[neighbour])}
    nonces = {n: t.sites[n].reveal_nonce(shown if n == victim else u1) for n in t.names}
    with pytest.raises(SecAggError, match=f"advertisement of '{neighbour}' is not signed by"):
        t.sites[victim].share_keys(nonces)
    assert t.sites[victim].stage is RoundStage.ABORTED


def test_a_site_refuses_to_attest_a_neighbour_it_did_not_mask_with() -> None:
    s = SparseSession(40, 8, 2, seed=6)
    routed = s.setup()
    victim = s.names[0]
    withheld = sorted(routed[victim])[0]
    routed[victim] = {k: v for k, v in routed[victim].items() if k != withheld}
    s.sites[victim].masked_input(routed[victim], s.inputs[victim], s.rng)
    with pytest.raises(SecAggError, match=f"did not mask with: \\['{withheld}'\\]"):
        s.sites[victim].attest(s.names)


def test_reflected_missing_or_foreign_tags_are_refused() -> None:
    """A site's own attestation presented as its neighbour's (the pair shares one key: the tags
    are directed), an attestation of another list, and a survivor's missing acknowledgement:
    each aborts the unmasking with nothing revealed."""
    s = SparseSession(40, 8, 2, seed=7)
    s.mask(s.setup())
    attested = {n: s.sites[n].attest(s.survivors) for n in s.survivors}
    forwarded = s.aggregator.collect_attestations(attested)
    victim = s.names[0]
    tags, acks = forwarded[victim]
    peer = sorted(tags)[0]
    reflected = dict(tags)
    reflected[peer] = attested[victim][peer]  # the victim's own tag for peer
    with pytest.raises(SecAggError, match=f"'{peer}' did not attest"):
        s.sites[victim].unmask(s.survivors, s.dropped, reflected, acks)
    assert s.sites[victim].stage is RoundStage.ABORTED

    other = s.names[1]
    tags, acks = forwarded[other]
    peer = sorted(acks)[0]
    with pytest.raises(SecAggError, match=f"no valid acknowledgement that '{peer}'"):
        s.sites[other].unmask(
            s.survivors, s.dropped, tags, {k: v for k, v in acks.items() if k != peer}
        )
    third = s.names[2]
    tags, acks = forwarded[third]
    key = s.sites[third]._mac_keys[sorted(tags)[0]]
    wrong_list = consistency_message(s.params, s.survivors[1:], s.sites[third]._seed)
    bad = {
        **tags,
        sorted(tags)[0]: mac_tag(key, attestation_message(wrong_list, sorted(tags)[0], third)),
    }
    with pytest.raises(SecAggError, match="did not attest this site's survivor list"):
        s.sites[third].unmask(s.survivors, s.dropped, bad, acks)
    with pytest.raises(FailedPreconditionError, match="needs stage"):
        s.sites[third].unmask(s.survivors, s.dropped, tags, acks)
    assert acknowledgement_message(s.params, "a", "b") != acknowledgement_message(
        s.params, "b", "a"
    )


def test_a_site_shown_other_commitments_computes_another_graph_and_aborts() -> None:
    """The curator shows one site a different set of commitments (a colluder's second
    advertisement): that site's seed, hence its graph, differs. If the colluder is its
    neighbour in that graph, the colluder's signed advertisement does not cover the commitment
    shown and the site refuses before sharing anything; otherwise it refuses the ciphertexts of
    sites that are not its neighbours in its own graph. Either way it reveals nothing. Sessions
    are tried seed by seed until the second case has occurred."""
    refused_signature = 0
    for seed in range(8, 28):
        s = SparseSession(40, 8, 2, seed=seed)
        u1 = s.aggregator.collect_advertisements({n: s.sites[n].advertise_keys() for n in s.names})
        victim, liar = s.names[0], s.names[-1]
        fake_nonce = bytes(32)
        shown = dict(u1)
        shown[liar] = KeyAdvertisement(
            liar,
            u1[liar].c_public,
            u1[liar].s_public,
            u1[liar].signature,
            nonce_commitment(s.params.round_id, liar, fake_nonce),
        )
        nonces = {n: s.sites[n].reveal_nonce(shown if n == victim else u1) for n in s.names}
        collected = s.aggregator.collect_nonces(nonces)
        from_site = {n: s.sites[n].share_keys(collected) for n in s.names if n != victim}
        try:
            own = s.sites[victim].share_keys({**collected, liar: fake_nonce})
        except SecAggError as exc:
            assert "is not signed by" in str(exc)
            refused_signature += 1
            continue
        assert set(own) != s.graph.neighbours(victim)  # another graph
        to_victim = {sender: cts[victim] for sender, cts in from_site.items() if victim in cts}
        with pytest.raises(SecAggError, match="not a neighbour in U1"):
            s.sites[victim].masked_input(to_victim, s.inputs[victim], s.rng)
        break
    else:
        pytest.fail(f"the colluder was the victim's neighbour in all {refused_signature} sessions")


# ------------------------------------------------------------ the attack at S = 100
@dataclass
class Loot:
    seed_shares: list[Share] = field(default_factory=list)
    key_shares: list[Share] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    revealed: list[str] = field(default_factory=list)


def _split_attack(
    s: SparseSession,
    count: int,
    told_dropped: Callable[[SparseSession, str], Callable[[str], bool]],
) -> tuple[str, Loot]:
    """Every site masks; the last ``count`` sites collude and the victim is the honest site with
    the most colluding neighbours (the attacker's best target). The honest sites for which
    ``told_dropped(s, victim)`` holds are told ``U3' = U3 \\ {victim}``, the others (the victim
    too) ``U3``; colluders attest both lists to everyone and give up every share they hold; each
    honest site is then asked to unmask with all the attestations of its list the attacker can
    gather, and every acknowledgement addressed to it."""
    s.mask(s.setup())
    colluders = s.names[-count:]
    honest = s.names[:-count]
    victim = max(honest, key=lambda v: (len(s.graph.neighbours(v) & set(colluders)), v))
    dropped_view = told_dropped(s, victim)
    everyone = tuple(s.names)
    without = tuple(n for n in s.names if n != victim)
    view = {n: (without if n != victim and dropped_view(n) else everyone) for n in honest}
    attested = {n: s.sites[n].attest(view[n]) for n in honest}
    seed = s.sites[victim]._seed
    lists = {v: consistency_message(s.params, v, seed) for v in (everyone, without)}
    loot = Loot()
    for c in colluders:  # the colluders' shares of the victim's secrets
        held = s.sites[c]._held.get(victim)
        if held is not None:
            loot.seed_shares.append(held[0])
            loot.key_shares.append(held[1])
    for n in honest:
        mine = view[n]
        tags: dict[str, bytes] = {}
        for peer in s.graph.neighbours(n):
            if peer in colluders:
                key = s.sites[peer]._mac_keys.get(n)
                if key is not None:
                    tags[peer] = mac_tag(key, attestation_message(lists[mine], peer, n))
            elif view[peer] == mine and n in attested[peer]:
                tags[peer] = attested[peer][n]
        acks = {
            sender: s.sites[sender].acknowledgements[n]
            for sender in s.masked
            if n in s.sites[sender].acknowledgements
        }
        dropped = (victim,) if mine == without else ()
        try:
            response = s.sites[n].unmask(mine, dropped, tags, acks)
        except SecAggError:
            loot.refused.append(n)
            continue
        loot.revealed.append(n)
        if victim in response.self_mask_shares:
            loot.seed_shares.append(response.self_mask_shares[victim])
        if victim in response.key_shares:
            loot.key_shares.append(response.key_shares[victim])
    return victim, loot


SPLITS: dict[str, Callable[[SparseSession, str], Callable[[str], bool]]] = {
    # Half of the victim's honest neighbours (by name), and half of everyone else.
    "halves": lambda s, v: lambda n: int(n[-3:]) % 2 == 1,
    # Exactly the victim's neighbours of even index are told it dropped; nobody else.
    "neighbours": lambda s, v: lambda n: n in s.graph.neighbours(v) and int(n[-3:]) % 2 == 0,
    # Everyone but the victim's neighbours is told it dropped (they back the lie in quorums).
    "outsiders": lambda s, v: lambda n: n not in s.graph.neighbours(v),
    # A third of all honest sites.
    "thirds": lambda s, v: lambda n: int(n[-3:]) % 3 == 0,
}


@pytest.mark.slow
@pytest.mark.parametrize("split", sorted(SPLITS))
def test_the_inconsistent_survivor_attack_fails_at_s_100(split: str) -> None:
    """100 sites, 5 colluders, k = 15, allowance 5 (the module's numbers): for every split the
    attacker holds fewer than t_v distinct shares of at least one of the victim's secrets, and
    somebody refused."""
    s = SparseSession(100, 15, 5, colluders=5, seed=40)
    victim, loot = _split_attack(s, 5, SPLITS[split])
    t = s.graph.threshold(victim)
    assert len(distinct(loot.seed_shares)) < t or len(distinct(loot.key_shares)) < t
    assert loot.refused
    for name in loot.refused:  # a site that refused is over
        with pytest.raises(FailedPreconditionError, match="needs stage"):
            s.sites[name].unmask(s.names, [], {}, {})


@pytest.mark.slow
def test_the_inconsistent_survivor_attack_fails_on_a_cape_jobs_graph_with_a_ring() -> None:
    """100 sites, 33 colluders (a CAPE job's default), allowance 2: k = 8 and a ring of 22. The
    victim is the honest site with the most colluding neighbours; its even-index neighbours are
    told it dropped: the attacker still holds fewer than t_v shares of one of its secrets."""
    s = SparseSession(100, 8, 2, colluders=33, seed=42, ring=22)
    victim, loot = _split_attack(s, 33, SPLITS["neighbours"])
    t = s.graph.threshold(victim)
    assert len(distinct(loot.seed_shares)) < t or len(distinct(loot.key_shares)) < t
    assert loot.refused


@pytest.mark.slow
def test_the_attack_recovers_the_input_when_thresholds_ignore_the_colluders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The positive control: 100 sites of which 30 collude, the allowance at its maximum
    (k - 1 = 14) and the security check switched off, so that t_v = K_v - 14 is about half the
    neighbourhood (Condition A fails): the honest sites split by parity each gather enough
    attestations, the victim's neighbours give t_v shares of both secrets, and the attack code
    reads the victim's input to the quantization step."""
    monkeypatch.setattr("dpmarket.common.secagg.graph.failure_bound", lambda *args: 0.0)
    s = SparseSession(100, 15, 14, colluders=30, seed=41)
    victim, loot = _split_attack(s, 30, SPLITS["halves"])
    t = s.graph.threshold(victim)
    assert len(distinct(loot.seed_shares)) >= t and len(distinct(loot.key_shares)) >= t
    recovered = recover_input(
        s.params,
        victim,
        sorted({*s.sites[victim].acknowledgements, victim}),
        {m: ad.s_public for m, ad in s.u1.items()},
        s.masked[victim],
        loot.seed_shares,
        loot.key_shares,
        threshold=t,
    )
    assert recovered is not None
    assert np.max(np.abs(recovered - s.inputs[victim])) <= 1.0 / s.fixed_point.scale
