"""What secure aggregation must withstand: tampering, substituted keys, a curious aggregator.

The statistical tests state their failure probability under the hypothesis they check (masked
vectors are uniform modulo 2^k, whatever the input): each p-value threshold of 1e-4 is the
probability that a correct implementation fails that assertion. Inputs and key material are
seeded, so the outcome is reproducible.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from scipy import stats

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.secagg import FixedPoint, RoundParams, SecAggError
from dpmarket.common.secagg.crypto import EcdsaSigner, generate_private_key, public_key_bytes
from dpmarket.common.secagg.fixedpoint import quantize
from dpmarket.common.secagg.protocol import (
    KeyAdvertisement,
    RoundStage,
    SecAggAggregator,
    SecAggSite,
    advertisement_message,
    consistency_message,
)
from dpmarket.common.secagg.shamir import Share
from tests.common.secagg.conftest import Session

if TYPE_CHECKING:
    from tests.common.secagg.conftest import Identities

    SessionFactory = Callable[..., Session]

P_MIN = 1e-4


# --- Tampering with the routed shares ---------------------------------------------------------


def test_a_tampered_share_ciphertext_is_detected(session: SessionFactory) -> None:
    s = session(5, 3, 16, seed=21)
    routed = s.share(s.advertise())
    victim = s.sites["site-02"]
    ciphertexts = dict(routed["site-02"])
    altered = bytearray(ciphertexts["site-04"])
    altered[40] ^= 0x80
    ciphertexts["site-04"] = bytes(altered)
    with pytest.raises(SecAggError, match="failed authentication"):
        victim.masked_input(ciphertexts, s.inputs["site-02"], s.rng)
    # Detected before the site released anything; the round is over for it.
    assert victim.stage is RoundStage.ABORTED
    with pytest.raises(FailedPreconditionError):
        victim.masked_input(routed["site-02"], s.inputs["site-02"], s.rng)


def test_a_ciphertext_relabelled_as_another_senders_is_detected(session: SessionFactory) -> None:
    s = session(5, 3, 16, seed=22)
    routed = s.share(s.advertise())
    ciphertexts = dict(routed["site-00"])
    ciphertexts["site-01"], ciphertexts["site-03"] = ciphertexts["site-03"], ciphertexts["site-01"]
    with pytest.raises(SecAggError, match="failed authentication"):
        s.sites["site-00"].masked_input(ciphertexts, s.inputs["site-00"], s.rng)


def test_a_ciphertext_for_another_recipient_is_detected(session: SessionFactory) -> None:
    s = session(5, 3, 16, seed=23)
    routed = s.share(s.advertise())
    ciphertexts = dict(routed["site-00"])
    ciphertexts["site-01"] = routed["site-02"]["site-01"]  # site-01's shares for site-02
    with pytest.raises(SecAggError, match="failed authentication"):
        s.sites["site-00"].masked_input(ciphertexts, s.inputs["site-00"], s.rng)


def test_a_truncated_ciphertext_is_detected(session: SessionFactory) -> None:
    s = session(3, 2, 16, seed=24)
    routed = s.share(s.advertise())
    ciphertexts = {k: v[:10] for k, v in routed["site-00"].items()}
    with pytest.raises(SecAggError, match="shorter than nonce and tag"):
        s.sites["site-00"].masked_input(ciphertexts, s.inputs["site-00"], s.rng)


# --- Keys substituted by the aggregator ---------------------------------------------------------


def _forged(
    params: RoundParams, site: str, signing_key: ec.EllipticCurvePrivateKey
) -> KeyAdvertisement:
    """Fresh keys presented as ``site``'s, signed with ``signing_key``."""
    c_public = public_key_bytes(generate_private_key())
    s_public = public_key_bytes(generate_private_key())
    message = advertisement_message(params.round_id, site, c_public, s_public)
    return KeyAdvertisement(site, c_public, s_public, EcdsaSigner(signing_key).sign(message))


def test_a_key_substituted_by_the_aggregator_is_detected(session: SessionFactory) -> None:
    """The aggregator swaps site-01's keys for its own (to read its shares or unmask it)."""
    s = session(5, 3, 16, seed=31)
    u1 = s.advertise()
    aggregator_key = ec.generate_private_key(ec.SECP256R1())
    u1["site-01"] = _forged(s.params, "site-01", aggregator_key)
    with pytest.raises(SecAggError, match="key advertisement of 'site-01' is not signed by"):
        s.sites["site-00"].share_keys(u1)
    assert s.sites["site-00"].stage is RoundStage.ABORTED


def test_another_sites_identity_key_cannot_vouch_for_a_substituted_key(
    session: SessionFactory,
) -> None:
    """A colluding site-03 signs keys presented as site-01's: signed, but not by site-01."""
    s = session(5, 3, 16, seed=32)
    u1 = s.advertise()
    u1["site-01"] = _forged(s.params, "site-01", s.identities.keys["site-03"])
    with pytest.raises(SecAggError, match="not signed by 'site-01'"):
        s.sites["site-00"].share_keys(u1)


def test_a_sites_own_advertisement_cannot_be_replaced(session: SessionFactory) -> None:
    s = session(3, 2, 16, seed=33)
    u1 = s.advertise()
    u1["site-00"] = _forged(s.params, "site-00", s.identities.keys["site-00"])
    with pytest.raises(SecAggError, match=r"advertisement of this site \('site-00'\) was replaced"):
        s.sites["site-00"].share_keys(u1)


def test_an_advertisement_from_another_round_is_not_accepted(session: SessionFactory) -> None:
    """Its static key's binding is genuine (signed by site-02), so site-00 shares, to site-02
    alone and under a pair key the curator cannot compute; its keys of the old round are not
    the ones site-02 authenticates to site-00 in this round, and site-00 refuses before it
    masks (tests/common/secagg/test_pairkeys.py: the same with site-02's static key unchanged,
    and the controls)."""
    old = session(3, 2, 16, seed=34)
    old_ads = old.advertise()
    s = session(3, 2, 16, seed=35, identities=old.identities)  # the same sites, a new round
    u1 = s.advertise()
    replayed = old_ads["site-02"]  # genuinely from site-02, for the old round id
    shown = {**u1, "site-02": replayed}
    shares = {n: s.sites[n].share_keys(shown if n == "site-00" else u1) for n in s.names}
    routed = s.aggregator.route_shares(shares)
    with pytest.raises(SecAggError, match=r"failed authentication|'site-02' this site was shown"):
        s.sites["site-00"].masked_input(routed["site-00"], s.inputs["site-00"], s.rng)
    assert s.sites["site-00"].stage is RoundStage.ABORTED


def test_repeated_public_keys_are_refused(session: SessionFactory) -> None:
    s = session(3, 2, 16, seed=36)
    u1 = s.advertise()
    u1["site-02"] = dataclasses.replace(u1["site-02"], c_public=u1["site-01"].c_public)
    with pytest.raises(SecAggError):
        s.sites["site-00"].share_keys(u1)


# --- What an unmasking response reveals -------------------------------------------------------


def test_no_response_holds_both_secrets_of_one_site(session: SessionFactory) -> None:
    s = session(7, 4, 16, seed=41)
    s.run({"site-01": "mask", "site-05": "mask", "site-03": "unmask"})
    assert s.transcript.dropped == ("site-01", "site-05")
    for name, response in s.transcript.responses.items():
        assert set(response.self_mask_shares).isdisjoint(response.key_shares), name
        assert set(response.self_mask_shares) == set(s.transcript.survivors)
        assert set(response.key_shares) == set(s.transcript.dropped)


@pytest.mark.parametrize(
    ("survivors", "message"),
    [
        (["site-00", "site-01", "site-02", "site-09"], "did not complete key sharing"),
        (["site-01", "site-02", "site-03", "site-04"], "not listed as a survivor"),
        (["site-00", "site-01"], "below the threshold t=3"),
        (["site-00", "site-00", "site-01", "site-02"], "repeats a site"),
    ],
)
def test_a_site_refuses_to_sign_a_survivor_list_it_could_not_unmask(
    session: SessionFactory, survivors: list[str], message: str
) -> None:
    s = session(5, 3, 16, seed=42)
    s.mask(s.share(s.advertise()))
    site = s.sites["site-00"]
    with pytest.raises(SecAggError, match=message):
        site.check_consistency(survivors)
    assert site.stage is RoundStage.ABORTED
    with pytest.raises(FailedPreconditionError):
        site.unmask(s.transcript.survivors, [], {})


def _checked(session: SessionFactory, seed: int) -> Session:
    """A 5-site round (t = 3) in which site-04 sent no masked input, every survivor signed."""
    s = session(5, 3, 16, seed=seed)
    s.mask(s.share(s.advertise()), drop=["site-04"])
    s.check()
    return s


@pytest.mark.parametrize(
    ("survivors", "dropped", "message"),
    [
        (
            ["site-00", "site-01", "site-02"],
            ["site-03", "site-04"],
            "not the list this site signed",
        ),
        (
            ["site-00", "site-01", "site-02", "site-03", "site-04"],
            [],
            "not the list this site signed",
        ),
        (["site-00", "site-01", "site-02", "site-03"], [], r"not this site's U2 \\ U3"),
        (
            ["site-00", "site-01", "site-02", "site-03"],
            ["site-03", "site-04"],
            r"not this site's U2 \\ U3",
        ),
        (
            ["site-00", "site-01", "site-02", "site-03"],
            ["site-04", "site-09"],
            r"not this site's U2 \\ U3",
        ),
        (["site-00", "site-00", "site-01", "site-02"], ["site-04"], "repeats a site"),
    ],
)
def test_a_site_unmasks_only_the_survivor_list_it_signed_and_its_own_dropped_sites(
    session: SessionFactory, survivors: list[str], dropped: list[str], message: str
) -> None:
    s = _checked(session, 42)
    site = s.sites["site-00"]
    with pytest.raises(SecAggError, match=message):
        site.unmask(survivors, dropped, s.transcript.signatures)
    assert site.stage is RoundStage.ABORTED
    with pytest.raises(FailedPreconditionError):  # nothing more, not even the right request
        site.unmask(s.transcript.survivors, s.transcript.dropped, s.transcript.signatures)


def _forged_signatures(s: Session, how: str) -> dict[str, bytes]:
    t = s.transcript
    signatures = dict(t.signatures)
    if how == "too few":
        return {n: signatures[n] for n in ("site-00", "site-01")}
    if how == "altered":
        bad = bytearray(signatures["site-01"])
        bad[-1] ^= 0x01
        signatures["site-01"] = bytes(bad)
    elif how == "by another key":
        # site-03's identity key signs in site-01's name.
        message = consistency_message(s.params, t.survivors)
        signatures["site-01"] = EcdsaSigner(s.identities.keys["site-03"]).sign(message)
    elif how == "for another list":
        # site-01 genuinely signed a different U3 (with site-04): valid, but not for this list.
        other = consistency_message(s.params, [*t.survivors, "site-04"])
        signatures["site-01"] = s.identities.signers["site-01"].sign(other)
    elif how == "under other parameters":
        other_params = dataclasses.replace(s.params, threshold=4)
        message = consistency_message(other_params, t.survivors)
        signatures["site-01"] = s.identities.signers["site-01"].sign(message)
    elif how == "own replaced":
        signatures["site-00"] = signatures["site-01"]
    elif how == "by a non-survivor":
        message = consistency_message(s.params, t.survivors)
        signatures["site-04"] = s.identities.signers["site-04"].sign(message)
    return signatures


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("too few", "2 signatures of the survivor list, below the threshold t=3"),
        ("altered", "'site-01' did not sign this site's survivor list"),
        ("by another key", "'site-01' did not sign this site's survivor list"),
        ("for another list", "'site-01' did not sign this site's survivor list"),
        ("under other parameters", "'site-01' did not sign this site's survivor list"),
        ("own replaced", r"signature of this site \('site-00'\) was replaced"),
        ("by a non-survivor", r"signatures of sites that are not survivors: \['site-04'\]"),
    ],
)
def test_a_site_reveals_nothing_without_t_valid_signatures_of_its_survivor_list(
    session: SessionFactory, how: str, message: str
) -> None:
    s = _checked(session, 47)
    site = s.sites["site-00"]
    with pytest.raises(SecAggError, match=message):
        site.unmask(s.transcript.survivors, s.transcript.dropped, _forged_signatures(s, how))
    assert site.stage is RoundStage.ABORTED


def test_a_site_signs_once_and_answers_the_unmasking_request_only_once(
    session: SessionFactory,
) -> None:
    """A second signature (of a list without site-01) or a second request (now claiming
    site-01 dropped) gets nothing."""
    s = session(5, 3, 16, seed=43)
    survivors, dropped = s.mask(s.share(s.advertise()))
    site = s.sites["site-00"]
    signed = s.check()
    others = [n for n in survivors if n != "site-01"]
    with pytest.raises(FailedPreconditionError, match="needs stage 'masked'"):
        site.check_consistency(others)
    first = site.unmask(survivors, dropped, signed)
    assert "site-01" in first.self_mask_shares
    with pytest.raises(FailedPreconditionError):
        site.unmask(others, ["site-01"], signed)


def test_a_corrupted_share_never_yields_a_wrong_sum(session: SessionFactory) -> None:
    """Exactly t responses: a bad key share gives a key that does not match its advertisement;
    a bad self-mask share gives a sum that is not a sum of |U3| quantized vectors. More than t:
    the extra shares expose the inconsistency. In every case the round aborts."""

    def corrupt(share: Share) -> Share:
        return Share(share.x, (share.y + 1) % (2**521 - 1))

    s = session(5, 3, 100, seed=44)
    s.mask(s.share(s.advertise()), drop=["site-04"])
    signed = s.check()
    responses = {
        n: s.sites[n].unmask(s.transcript.survivors, s.transcript.dropped, signed)
        for n in ["site-00", "site-01", "site-02"]
    }
    responses["site-01"].key_shares["site-04"] = corrupt(responses["site-01"].key_shares["site-04"])
    with pytest.raises(SecAggError, match="reconstructed key of 'site-04' does not match"):
        s.aggregator.finish(responses)

    s = session(5, 3, 100, seed=45)
    s.mask(s.share(s.advertise()), drop=["site-04"])
    signed = s.check()
    responses = {
        n: s.sites[n].unmask(s.transcript.survivors, s.transcript.dropped, signed)
        for n in ["site-00", "site-01", "site-02"]
    }
    shares = responses["site-02"].self_mask_shares
    shares["site-03"] = corrupt(shares["site-03"])
    with pytest.raises(SecAggError, match="did not give a valid sum"):
        s.aggregator.finish(responses)

    s = session(5, 3, 100, seed=46)
    s.mask(s.share(s.advertise()))
    signed = s.check()
    responses = {
        n: s.sites[n].unmask(s.transcript.survivors, s.transcript.dropped, signed) for n in s.names
    }
    shares = responses["site-04"].self_mask_shares
    shares["site-00"] = corrupt(shares["site-00"])
    with pytest.raises(SecAggError, match=r"shares of 'site-00'.* are inconsistent"):
        s.aggregator.finish(responses)


# --- The aggregator's view: masked vectors are uniform ------------------------------------------


def _masked_vector(session: SessionFactory, value: float, seed: int) -> tuple[np.ndarray, int]:
    """site-00's masked input in a 3-site round where every site's input is ``value``."""
    length = 100_000
    names = [f"site-{i:02d}" for i in range(3)]
    s = session(
        3,
        2,
        length,
        seed=seed,
        clip=1.0,
        resolution_bits=16,
        inputs={n: np.full(length, value) for n in names},
    )
    s.mask(s.share(s.advertise()))
    return s.transcript.masked["site-00"], s.params.modulus_bits


def _top_bits_counts(values: np.ndarray, modulus_bits: int, bits: int = 8) -> np.ndarray:
    return np.bincount(
        (values >> np.uint64(modulus_bits - bits)).astype(np.int64), minlength=2**bits
    )


def test_a_masked_vector_is_uniform_modulo_q(session: SessionFactory) -> None:
    """Chi-square on the top 8 bits (256 cells, 100,000 entries, ~390 per cell) and KS on
    ``y / q``, for the two extreme inputs; each fails with probability 1e-4 if uniform."""
    for value, seed in ((-1.0, 51), (1.0, 52)):
        masked, k = _masked_vector(session, value, seed)
        assert masked.dtype == np.uint64 and int(masked.max()) < 2**k
        assert stats.chisquare(_top_bits_counts(masked, k)).pvalue > P_MIN
        assert stats.kstest(masked / 2.0**k, "uniform").pvalue > P_MIN


def test_masked_vectors_of_very_different_inputs_look_the_same(session: SessionFactory) -> None:
    """Inputs all -clip (quantized to 0) against all +clip (2^16 - 1): the two masked vectors
    pass a two-sample chi-square (top 8 bits) and a two-sample KS test, both ways."""
    low, k = _masked_vector(session, -1.0, 53)
    high, _ = _masked_vector(session, 1.0, 54)
    table = np.stack([_top_bits_counts(low, k), _top_bits_counts(high, k)])
    assert stats.chi2_contingency(table).pvalue > P_MIN
    assert stats.ks_2samp(low / 2.0**k, high / 2.0**k).pvalue > P_MIN
    assert stats.ks_2samp(high / 2.0**k, low / 2.0**k).pvalue > P_MIN


def test_the_uniformity_tests_would_catch_an_unmasked_input() -> None:
    """The same tests reject the quantized inputs themselves (power check of the tests above)."""
    fp = FixedPoint(1.0, 16, 3)
    rng = np.random.default_rng(0)
    low = quantize(np.full(100_000, -1.0), fp, rng)
    high = quantize(rng.uniform(-1, 1, 100_000), fp, rng)
    k = fp.modulus_bits
    assert stats.chisquare(_top_bits_counts(high, k)).pvalue < 1e-10
    table = np.stack([_top_bits_counts(low, k), _top_bits_counts(high, k)]) + 1
    assert stats.chi2_contingency(table).pvalue < 1e-10


def test_default_sources_give_fresh_masks_every_round(
    identities: Callable[..., Identities],
) -> None:
    """With the default key sources (os.urandom), two rounds over the same inputs and the same
    rounding coins mask differently: nothing is derived from a fixed or low-entropy seed."""
    names = ["a", "b", "c"]
    ids = identities(names)
    fp = FixedPoint(1.0, 16, 3)
    inputs = {n: np.linspace(-1, 1, 10_000) for n in names}

    def masked_of_a() -> np.ndarray:
        params = RoundParams.create(names, 2, 10_000, fp)
        sites = {
            n: SecAggSite(n, params, signer=ids.signers[n], verifier=ids.verifier) for n in names
        }
        agg = SecAggAggregator(params)
        u1 = agg.collect_advertisements({n: sites[n].advertise_keys() for n in names})
        routed = agg.route_shares({n: sites[n].share_keys(u1) for n in names})
        return sites["a"].masked_input(routed["a"], inputs["a"], np.random.default_rng(0))

    first, second = masked_of_a(), masked_of_a()
    # Equal entries by chance: 2^-18 each; 1% of 10,000 would be ~40 sigma away.
    assert np.mean(first == second) < 0.01
