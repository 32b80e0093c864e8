"""An aggregator that lies about the survivors, with colluding sites (Bonawitz et al.'s
malicious-server model), on the in-process state objects.

The attack: after every site masked its input, tell a group A of honest sites (and the victim)
that the victim survived, and a group B that it dropped; the colluders sign both survivor lists
and hand over every share they hold. A's answers give the victim's self-mask seed, B's its
pairwise-mask key, and with both the victim's masked vector gives its input. With a threshold
that ignores the colluders (``t = floor(n / 2) + 1``, a round declaring ``S_C = 0``) the attack
recovers the victim's input to the quantization step, which shows the attack code works; with
``2 t > n + S_C`` it fails for every split of the honest sites: the sites of the smaller view
refuse (too few signatures of their list) and reveal nothing, and the attacker never holds ``t``
shares of both secrets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from numpy.typing import NDArray

from dpmarket.common.secagg import FixedPoint, RoundParams, SecAggError
from dpmarket.common.secagg.protocol import consistency_message, min_threshold
from dpmarket.common.secagg.shamir import Share
from tests.common.secagg.attack import distinct, recover_input
from tests.common.secagg.conftest import Session

D = 32


@dataclass
class Outcome:
    """What the attacker got from one run of the split attack."""

    seed_shares: list[Share] = field(default_factory=list)
    key_shares: list[Share] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    revealed: list[str] = field(default_factory=list)
    recovered: NDArray[np.float64] | None = None


def split_attack(
    n: int, colluders: int, declared: int, in_b: int, seed: int
) -> tuple[Session, Outcome]:
    """Run the attack on an ``n``-site round that declares ``declared`` colluders (its threshold
    the least allowed), with ``colluders`` real ones and ``in_b`` honest sites told the victim
    dropped (the other honest sites, and the victim, are told it survived).

    The victim is ``site-00``, the colluders the last ``colluders`` sites.
    """
    t = min_threshold(n, declared)
    s = Session(n, t, D, colluders=declared, seed=seed)
    victim, names = s.names[0], s.names
    bad = names[n - colluders :]
    honest = [m for m in names[1:] if m not in bad]
    group_b, group_a = honest[:in_b], honest[in_b:]
    u1 = s.advertise()
    s.mask(s.share(u1))  # every site masks; the aggregator holds every masked vector
    everyone = list(names)
    without = [m for m in names if m != victim]
    # The colluders sign both lists with their identity keys.
    sig_all = {
        c: s.identities.signers[c].sign(consistency_message(s.params, everyone)) for c in bad
    }
    sig_without = {
        c: s.identities.signers[c].sign(consistency_message(s.params, without)) for c in bad
    }
    for m in [victim, *group_a]:
        sig_all[m] = s.sites[m].check_consistency(everyone)
    for m in group_b:
        sig_without[m] = s.sites[m].check_consistency(without)
    out = Outcome()
    for c in bad:  # a colluder hands over both shares of the victim's secrets it holds
        seed_share, key_share = s.sites[c]._held[victim]
        out.seed_shares.append(seed_share)
        out.key_shares.append(key_share)
    for m in [victim, *group_a]:
        try:
            response = s.sites[m].unmask(everyone, [], sig_all)
        except SecAggError:
            out.refused.append(m)
            continue
        out.revealed.append(m)
        assert not response.key_shares  # told nobody dropped: no key share at all
        out.seed_shares.append(response.self_mask_shares[victim])
    for m in group_b:
        try:
            response = s.sites[m].unmask(without, [victim], sig_without)
        except SecAggError:
            out.refused.append(m)
            continue
        out.revealed.append(m)
        assert victim not in response.self_mask_shares
        out.key_shares.append(response.key_shares[victim])
    s_publics = {m: ad.s_public for m, ad in u1.items()}
    out.recovered = recover_input(
        s.params,
        victim,
        names,
        s_publics,
        s.transcript.masked[victim],
        out.seed_shares,
        out.key_shares,
    )
    return s, out


@pytest.mark.parametrize(("n", "colluders", "in_b"), [(5, 1, 2), (20, 5, 6)])
def test_the_attack_recovers_the_victims_input_when_the_threshold_ignores_the_colluders(
    n: int, colluders: int, in_b: int
) -> None:
    """The positive control: a round declaring no colluder (t = floor(n/2) + 1) while
    ``colluders`` sites collude. Both views gather t signatures, nobody refuses, and the
    victim's input comes out to the quantization step: 2 t <= n + S_C."""
    s, out = split_attack(n, colluders, declared=0, in_b=in_b, seed=n)
    t = s.params.threshold
    assert 2 * t <= n + colluders
    assert out.refused == []
    assert out.recovered is not None
    victim_input = s.inputs[s.names[0]]
    assert np.max(np.abs(out.recovered - victim_input)) <= 1.0 / s.fixed_point.scale


@pytest.mark.parametrize(("n", "colluders"), [(5, 1), (20, 5)])
def test_the_attack_fails_for_every_split_once_t_exceeds_half_of_n_plus_s_c(
    n: int, colluders: int
) -> None:
    """The same attack on a round declaring its real colluders (t = 4 of 5, 13 of 20): for every
    split of the honest sites (at least one told the victim dropped; with none there is no lie),
    the sites of at least one view refuse and reveal nothing, and the attacker never holds t
    shares of both the victim's self-mask seed and its key."""
    t = min_threshold(n, colluders)
    assert 2 * t > n + colluders
    honest = n - 1 - colluders
    for in_b in range(1, honest + 1):
        s, out = split_attack(n, colluders, declared=colluders, in_b=in_b, seed=100 * n + in_b)
        assert s.params.threshold == t
        assert out.recovered is None, in_b
        assert len(distinct(out.seed_shares)) < t or len(distinct(out.key_shares)) < t, in_b
        assert out.refused, in_b  # somebody noticed
        # A site that refused is over: no later request gets anything from it.
        for m in out.refused:
            with pytest.raises(Exception, match="needs stage"):
                s.sites[m].unmask(s.names, [], {})


def test_the_threshold_must_exceed_half_of_n_plus_s_c() -> None:
    """n = 5, S_C = 1 needs t = 4 (t = 3 is the attack's); n = 20, S_C = 5 needs 13."""
    fp5, fp20 = FixedPoint(1.0, 8, 5), FixedPoint(1.0, 8, 20)
    five, twenty = [f"s{i}" for i in range(5)], [f"s{i:02d}" for i in range(20)]
    with pytest.raises(ValueError, match=r"t > \(n \+ S_C\) / 2 with n=5 sites and S_C=1"):
        RoundParams.create(five, 3, 4, fp5, colluders=1)
    assert RoundParams.create(five, 4, 4, fp5, colluders=1).threshold == 4
    with pytest.raises(ValueError, match="S_C=5 colluders, got t=12"):
        RoundParams.create(twenty, 12, 4, fp20, colluders=5)
    assert RoundParams.create(twenty, 13, 4, fp20, colluders=5).threshold == 13
    assert [min_threshold(5, 1), min_threshold(20, 5), min_threshold(20, 6)] == [4, 13, 14]
    assert [min_threshold(2, 0), min_threshold(2, 1), min_threshold(4, 0)] == [2, 2, 3]
    with pytest.raises(ValueError, match="colluders must lie in"):
        min_threshold(5, 5)
    with pytest.raises(ValueError, match="colluders must be an int in"):
        RoundParams.create(five, 5, 4, fp5, colluders=5)
