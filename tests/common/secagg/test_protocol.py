"""Secure aggregation end to end: the sum, dropout at every stage, aborts below the threshold."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pytest

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.secagg import FixedPoint, RoundParams, SecAggError, run_in_process
from dpmarket.common.secagg.protocol import RoundStage, SecAggAggregator

if TYPE_CHECKING:
    from tests.common.secagg.conftest import Identities, Session

    SessionFactory = Callable[..., Session]


@pytest.mark.parametrize(("n", "threshold", "length"), [(3, 2, 500), (5, 3, 500), (20, 11, 2000)])
def test_sum_is_exact_within_quantization(
    session: SessionFactory, n: int, threshold: int, length: int
) -> None:
    s = session(n, threshold, length, seed=n, clip=3.0, resolution_bits=20)
    result = s.run()
    # Each site's rounding is off by less than one grid step: |error| < n / scale per entry.
    bound = n / s.fixed_point.scale
    assert np.max(np.abs(result - s.expected_sum(s.names))) < bound
    assert s.transcript.dropped == ()
    assert all(site.stage is RoundStage.DONE for site in s.sites.values())
    assert s.aggregator.stage is RoundStage.DONE


def test_run_in_process_matches_the_staged_round_bit_for_bit(
    session: SessionFactory,
    identities: Callable[..., Identities],
    byte_source: Callable[[int], Callable[[int], bytes]],
) -> None:
    s = session(5, 3, 300, seed=7)
    ids = identities(s.names)

    def once(drops: dict[str, str]) -> np.ndarray:
        return run_in_process(
            s.params,
            s.inputs,
            drop_at=drops,  # type: ignore[arg-type]
            signers=ids.signers,
            verifier=ids.verifier,
            random_bytes=byte_source(99),
            rng=np.random.default_rng(5),
        )

    drops = {"site-01": "mask", "site-03": "unmask"}
    first, second = once(drops), once(drops)
    np.testing.assert_array_equal(first, second)  # same sources, same result, bit for bit
    expected = s.expected_sum(["site-00", "site-02", "site-03", "site-04"])
    assert np.max(np.abs(first - expected)) < 4 / s.fixed_point.scale


@pytest.mark.parametrize(
    ("stage", "counted"),
    [
        ("advertise", False),  # never in U1: in no mask, not in the sum
        ("share", False),  # in U1, not U2: excluded before any mask is fixed
        ("mask", False),  # in U2, not U3: its pairwise masks are removed from shares
        ("check", True),  # in U3, signs nothing: its input counts, its self mask is rebuilt
        ("unmask", True),  # in U4: its input counts, its self mask is rebuilt from shares
    ],
)
def test_dropout_at_each_stage_gives_the_sum_over_the_right_sites(
    session: SessionFactory, stage: str, counted: bool
) -> None:
    s = session(5, 3, 200, seed=11)
    result = s.run({"site-02": stage})
    included = [n for n in s.names if counted or n != "site-02"]
    assert np.max(np.abs(result - s.expected_sum(included))) < 5 / s.fixed_point.scale
    # The result is far from the other candidate (with or without site-02).
    other = s.expected_sum(s.names if not counted else [n for n in s.names if n != "site-02"])
    assert np.max(np.abs(result - other)) > 0.1


def test_dropouts_at_every_stage_in_one_round(session: SessionFactory) -> None:
    s = session(13, 7, 300, seed=3)
    drops = {
        "site-01": "advertise",
        "site-04": "share",
        "site-05": "mask",
        "site-06": "mask",
        "site-07": "check",
        "site-08": "unmask",
    }
    result = s.run(drops)
    included = [
        "site-00",
        "site-02",
        "site-03",
        "site-07",
        "site-08",
        "site-09",
        "site-10",
        "site-11",
        "site-12",
    ]
    assert s.transcript.survivors == tuple(included)
    assert s.transcript.dropped == ("site-05", "site-06")
    assert sorted(s.transcript.signatures) == [n for n in included if n != "site-07"]
    assert sorted(s.transcript.responses) == [
        n for n in included if n not in ("site-07", "site-08")
    ]
    assert np.max(np.abs(result - s.expected_sum(included))) < 9 / s.fixed_point.scale


@pytest.mark.parametrize("stage", ["advertise", "share", "mask", "check", "unmask"])
def test_below_threshold_aborts_at_each_stage_and_releases_nothing(
    session: SessionFactory, stage: str
) -> None:
    s = session(5, 3, 50, seed=5)
    drops = dict.fromkeys(["site-00", "site-02", "site-04"], stage)
    with pytest.raises(SecAggError, match="below the threshold t=3"):
        s.run(drops)
    assert s.aggregator.stage is RoundStage.ABORTED
    assert s.transcript.result is None


@pytest.mark.parametrize("stage", ["advertise", "share", "mask", "check", "unmask"])
def test_run_in_process_aborts_below_threshold(stage: str) -> None:
    fp = FixedPoint(1.0, 16, 5)
    names = [f"s{i}" for i in range(5)]
    params = RoundParams.create(names, 3, 10, fp)
    inputs = {n: np.zeros(10) for n in names}
    with pytest.raises(SecAggError, match="below the threshold"):
        run_in_process(params, inputs, drop_at=dict.fromkeys(names[:3], stage))  # type: ignore[arg-type]


def test_sites_check_the_threshold_themselves(session: SessionFactory) -> None:
    """A site does not rely on the aggregator to count: it refuses to go on below t."""
    s = session(5, 3, 20, seed=2)
    u1 = s.advertise()
    few = {n: u1[n] for n in ["site-00", "site-01"]}
    with pytest.raises(SecAggError, match="2 sites advertised keys, below the threshold t=3"):
        s.sites["site-00"].share_keys(few)

    s = session(5, 3, 20, seed=2)
    u1 = s.advertise()
    routed = s.share(u1)
    only_one = {"site-01": routed["site-00"]["site-01"]}
    with pytest.raises(SecAggError, match="2 sites completed key sharing"):
        s.sites["site-00"].masked_input(only_one, s.inputs["site-00"], s.rng)


def test_stages_must_come_in_order(session: SessionFactory) -> None:
    s = session(3, 2, 10)
    site = s.sites["site-00"]
    with pytest.raises(FailedPreconditionError, match="needs stage 'shared'"):
        site.masked_input({}, s.inputs["site-00"], s.rng)
    site.advertise_keys()
    with pytest.raises(FailedPreconditionError, match="needs stage 'new'"):
        site.advertise_keys()
    with pytest.raises(FailedPreconditionError, match="needs stage 'checked'"):
        s.aggregator.finish({})
    with pytest.raises(FailedPreconditionError, match="needs stage 'masked'"):
        site.check_consistency(s.names)
    with pytest.raises(FailedPreconditionError, match="needs stage 'checked'"):
        site.unmask(s.names, [], {})


def test_an_out_of_range_input_is_refused_and_may_be_corrected(session: SessionFactory) -> None:
    s = session(3, 2, 4, seed=1)
    routed = s.share(s.advertise())
    site = s.sites["site-00"]
    with pytest.raises(ValueError, match=r"entry 3 is 1\.5, outside \[-1\.0, 1\.0\]"):
        site.masked_input(routed["site-00"], np.array([0.0, 0.1, -0.2, 1.5]), s.rng)
    assert site.stage is RoundStage.SHARED  # nothing left the site; it can send a valid input
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        site.masked_input(routed["site-00"], np.zeros(5), s.rng)
    site.masked_input(routed["site-00"], np.array([0.0, 0.1, -0.2, 1.0]), s.rng)
    assert site.stage is RoundStage.MASKED


@pytest.mark.parametrize(
    ("sites", "threshold", "message"),
    [
        (["a", "b", "c", "d"], 2, r"t > \(n \+ S_C\) / 2"),  # 2 disjoint pairs could disagree
        (["a", "b", "c"], 1, "2 <= t"),
        (["a", "b", "c"], 4, "t <= n"),
        (["a", "b", "a"], 2, "duplicate site ids"),
        (["a", ""], 2, "non-empty strings"),
    ],
)
def test_round_params_are_validated(sites: list[str], threshold: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RoundParams.create(sites, threshold, 10, FixedPoint(1.0, 8, 4))


def test_the_round_digest_binds_every_parameter() -> None:
    """Survivors' signatures cover the digest: any parameter told differently to two sites
    makes their signatures incompatible."""
    params = RoundParams(bytes(range(16)), ("a", "b", "c", "d"), 3, 5, FixedPoint(1.0, 8, 4), 0)
    variants = [
        dataclasses.replace(params, round_id=bytes(range(1, 17))),
        dataclasses.replace(params, sites=("a", "b", "c", "e")),
        dataclasses.replace(params, threshold=4),
        dataclasses.replace(params, colluders=1),
        dataclasses.replace(params, vector_length=6),
        dataclasses.replace(params, fixed_point=FixedPoint(2.0, 8, 4)),
        dataclasses.replace(params, fixed_point=FixedPoint(1.0, 9, 4)),
        dataclasses.replace(params, fixed_point=FixedPoint(1.0, 8, 5)),
    ]
    digests = {params.digest, *(v.digest for v in variants)}
    assert len(digests) == 1 + len(variants)
    assert params.digest == dataclasses.replace(params, sites=("d", "c", "b", "a")).digest


def test_round_params_sort_sites_and_need_headroom_and_a_long_round_id() -> None:
    params = RoundParams(bytes(16), ("c", "a", "b"), 2, 5, FixedPoint(1.0, 8, 3))
    assert params.sites == ("a", "b", "c")
    with pytest.raises(ValueError, match="could wrap"):
        RoundParams(bytes(16), ("a", "b", "c"), 2, 5, FixedPoint(1.0, 8, 2))
    with pytest.raises(ValueError, match="at least 16 bytes"):
        RoundParams(bytes(15), ("a", "b", "c"), 2, 5, FixedPoint(1.0, 8, 3))


def test_aggregator_refuses_malformed_messages(session: SessionFactory) -> None:
    s = session(4, 3, 10, seed=4)
    u1 = s.advertise()
    shares = {n: s.sites[n].share_keys(u1) for n in u1}
    shares["site-01"] = {k: v for k, v in shares["site-01"].items() if k != "site-02"}
    with pytest.raises(SecAggError, match="'site-01' addressed shares to"):
        s.aggregator.route_shares(shares)

    s = session(4, 3, 10, seed=4)
    routed = s.share(s.advertise())
    masked = {n: s.sites[n].masked_input(routed[n], s.inputs[n], s.rng) for n in routed}
    masked["site-03"] = masked["site-03"] | np.uint64(1 << s.params.modulus_bits)
    with pytest.raises(SecAggError, match="entry >= 2\\^k"):
        s.aggregator.collect_masked(masked)

    s = session(4, 3, 10, seed=4)
    routed = s.share(s.advertise())
    masked = {n: s.sites[n].masked_input(routed[n], s.inputs[n], s.rng) for n in routed}
    masked["site-03"] = masked["site-03"].astype(np.int64)
    with pytest.raises(SecAggError, match="must be uint64"):
        s.aggregator.collect_masked(masked)


def test_aggregator_refuses_a_response_with_the_wrong_shares(session: SessionFactory) -> None:
    s = session(5, 3, 10, seed=6)
    s.mask(s.share(s.advertise()), drop=["site-04"])
    signed = s.check()
    responses = {
        n: s.sites[n].unmask(s.transcript.survivors, s.transcript.dropped, signed)
        for n in s.transcript.survivors
    }
    response = responses["site-00"]
    response.self_mask_shares.pop("site-01")
    with pytest.raises(SecAggError, match="'site-00' holds the wrong shares"):
        s.aggregator.finish(responses)


def test_run_in_process_rejects_bad_arguments() -> None:
    fp = FixedPoint(1.0, 8, 3)
    params = RoundParams.create(["a", "b", "c"], 2, 4, fp)
    inputs = {n: np.zeros(4) for n in params.sites}
    with pytest.raises(ValueError, match="inputs are for"):
        run_in_process(params, {"a": np.zeros(4)})
    with pytest.raises(ValueError, match="bad drop"):
        run_in_process(params, inputs, drop_at={"a": "later"})  # type: ignore[dict-item]
    np.testing.assert_allclose(run_in_process(params, inputs), 0.0, atol=3 / fp.scale)


def test_the_aggregator_holds_no_secret_state(session: SessionFactory) -> None:
    s = session(3, 2, 8)
    agg = SecAggAggregator(s.params)
    assert not [k for k in vars(agg) if "private" in k or "seed" in k]
