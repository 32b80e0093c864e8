"""The curator as CAPE aggregator (capeFM, Algorithm 4) against in-process owners.

Every site is a real :class:`dpmarket.owner.cape.CapeSite` with its secure-aggregation rounds
(:class:`dpmarket.owner.secagg.SiteRounds`, real key agreement and masks), wrapped so that the test
sees what crosses the boundary between an owner and the curator (the noise round's inputs, the
masked vectors, the broadcast total, the releases) and can make a site vanish at any stage, as a
crashed machine would: every later call to it fails as unavailable.

What must hold (DESIGN, "CAPE noise"; CAPE paper, Algorithms 1, 2 and 4, Lemma 1):

* the zero-sum noise sums to zero over exactly the sites whose releases are averaged when a site
  is lost during the noise round (the round is rerun); a site lost at its release leaves an
  average whose larger noise the report states; either way the stated noise is the estimate's;
* the curator sees masked vectors that are uniform modulo ``2^k`` (not the sites' draws) and
  releases that differ from the sites' exact coefficients by Gaussian noise of the planned scale;
* with little noise the fit is the non-private pooled least-squares fit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from numpy.typing import NDArray
from scipy import stats

from dpmarket.common.cape.agreement import SizeAttestation, plan_statement
from dpmarket.common.cape.capefm import aggregate_releases, fit_released, site_coefficients
from dpmarket.common.cape.dpgd import init_params, site_gradient
from dpmarket.common.cape.functional_mechanism import to_raw_coefficients
from dpmarket.common.cape.privacy import collusion_factor
from dpmarket.common.cape.spec import AnyCapeSpec, CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.cape.uncertainty import (
    capefm_estimates,
    mean_estimates,
    training_estimates,
)
from dpmarket.common.cape.zero_sum import zero_sum_correction
from dpmarket.common.errors import (
    AbortedError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)
from dpmarket.common.privacy.rng import make_rng
from dpmarket.common.secagg.crypto import EcdsaSigner
from dpmarket.common.secagg.fixedpoint import FixedPoint
from dpmarket.common.secagg.protocol import RoundParams
from dpmarket.curator.cape import CapeJob, CapeResult, job_for
from dpmarket.owner.cape import CapeSite
from dpmarket.owner.local import LocalCapeSiteEndpoint
from dpmarket.owner.secagg import SiteIdentity, SiteRounds
from dpmarket.runtime.tables import Table

#: Public bounds of the synthetic tables' features and target.
FEATURES = (("a", 0.0, 10.0), ("b", -5.0, 5.0), ("c", 0.0, 1.0))
TARGET = ("y", -10.0, 10.0)
COLUMNS = ("a", "b", "c", "y")
SITES = tuple(f"site-{i}" for i in range(5))
#: Where a site can vanish, in protocol order (the names of :meth:`Site._reach`'s stages).
STAGES = ("open", "attest", "plan", "advertise", "share", "mask", "check", "unmask", "release")


def _spec(epsilon: float = 1.0, delta: float = 1e-6) -> CapeJobSpec:
    return CapeJobSpec("linear", FEATURES, TARGET, epsilon=epsilon, delta=delta)


def _tables(rows: int, seed: int = 0, sites: Sequence[str] = SITES) -> list[Table]:
    """Equal-size tables in the public bounds: ``y = 0.3 a - 0.5 b + 2 c + U(-1, 1)``."""
    rng = np.random.default_rng(seed)
    out = []
    for name in sites:
        x = np.column_stack([rng.uniform(lo, hi, rows) for _, lo, hi in FEATURES])
        y = x @ np.array([0.3, -0.5, 2.0]) + rng.uniform(-1.0, 1.0, rows)
        out.append(Table(COLUMNS, np.column_stack([x, y]), name))
    return out


class Site(LocalCapeSiteEndpoint):
    """An in-process owner that records what it sends and receives, and may vanish.

    Parameters
    ----------
    table : Table
    key : EllipticCurvePrivateKey
        The site's signing key.
    trusted : dict
        Every site's public key (in-process: no CA).
    lose_at : str, optional
        The stage (one of :data:`STAGES`, or ``"gradient"``) at which the site vanishes: that
        call and every later one fail with :class:`UnavailableError`. ``"STAGE@k"`` vanishes at
        the ``k``-th call of the stage (from 1), ``"gradient@t"`` at iteration ``t``'s release.
    floor : int
        The owner's policy floor on ``S_C``.
    """

    def __init__(
        self,
        table: Table,
        key: ec.EllipticCurvePrivateKey,
        trusted: dict[str, ec.EllipticCurvePublicKey],
        lose_at: str | None = None,
        floor: int = 1,
    ) -> None:
        identity = SiteIdentity(table.name, key, b"", None).trusting(trusted)
        site = CapeSite(
            table.name, table, allow_seeded_sessions=True, identity=identity, min_colluders=floor
        )
        rounds = SiteRounds(
            identity,
            self._input,
            site.rng_for,
            on_finished=site.round_finished,
            min_colluders=site.min_colluders,
            admit=site.check_round,
        )
        super().__init__(site, rounds)
        self.table = table
        self.lose_at = lose_at
        self.lost = False
        self.inputs: dict[bytes, NDArray[np.float64]] = {}
        self.params: dict[bytes, RoundParams] = {}
        self.masked: dict[bytes, NDArray[np.uint64]] = {}
        self.totals: dict[bytes, NDArray[np.float64]] = {}
        self.releases: dict[bytes, NDArray[np.float64]] = {}
        #: (round id, iteration) -> (parameters, the round's sum for it, the release)
        self.gradients: dict[tuple[bytes, int], tuple[NDArray, NDArray, NDArray]] = {}
        self.calls: dict[str, int] = {}

    def _input(self, job_id: str, params: RoundParams) -> NDArray[np.float64]:
        """The owner's input source, recorded: its zero-sum noise draw for the round."""
        vector = self.site.noise_input(job_id, params)
        self.inputs[params.round_id] = vector.copy()
        self.params[params.round_id] = params
        return vector

    def _reach(self, stage: str, iteration: int | None = None) -> None:
        self.calls[stage] = self.calls.get(stage, 0) + 1
        count = self.calls[stage] if iteration is None else iteration
        if self.lost or self.lose_at in (stage, f"{stage}@{count}"):
            self.lost = True
            raise UnavailableError(f"{self.name} vanished at {stage}")

    async def open_job(self, job_id, spec, seed, consumer, market=None):
        self._reach("open")
        return await super().open_job(job_id, spec, seed, consumer, market)

    async def attest_plan(self, job_id, sites, colluders, first_iteration=0):
        self._reach("attest")
        return await super().attest_plan(job_id, sites, colluders, first_iteration)

    async def plan_job(self, job_id, sites, colluders, attestations, first_iteration=0):
        self._reach("plan")
        return await super().plan_job(job_id, sites, colluders, attestations, first_iteration)

    async def advertise_keys(self, job_id, params):
        self._reach("advertise")
        return await super().advertise_keys(job_id, params)

    async def reveal_nonce(self, job_id, params, advertisements, certificates):
        self._reach("reveal")
        return await super().reveal_nonce(job_id, params, advertisements, certificates)

    async def share_keys(self, job_id, params, advertisements, certificates, nonces=None):
        self._reach("share")
        return await super().share_keys(job_id, params, advertisements, certificates, nonces)

    async def masked_input(self, job_id, params, ciphertexts):
        self._reach("mask")
        masked = await super().masked_input(job_id, params, ciphertexts)
        self.masked[params.round_id] = masked.vector.copy()
        return masked

    async def consistency_check(self, job_id, params, survivors):
        self._reach("check")
        return await super().consistency_check(job_id, params, survivors)

    async def unmask(self, job_id, params, survivors, dropped, signatures, acknowledgements=None):
        self._reach("unmask")
        return await super().unmask(
            job_id, params, survivors, dropped, signatures, acknowledgements
        )

    async def release(self, job_id, round_id, total):
        self._reach("release")
        release = await super().release(job_id, round_id, total)
        self.totals[round_id] = np.array(total, dtype=np.float64)
        self.releases[round_id] = release.copy()
        return release

    async def release_gradient(self, job_id, round_id, iteration, parameters, total):
        self._reach("gradient", iteration)
        release = await super().release_gradient(job_id, round_id, iteration, parameters, total)
        self.gradients[round_id, iteration] = (parameters.copy(), total.copy(), release.copy())
        return release

    async def close_job(self, job_id):
        self._reach("close")
        return await super().close_job(job_id)


def _sites(
    tables: Sequence[Table],
    lose: dict[str, str] | None = None,
    floors: dict[str, int] | None = None,
    kinds: dict[str, type[Site]] | None = None,
) -> dict[str, Site]:
    keys = {t.name: ec.generate_private_key(ec.SECP256R1()) for t in tables}
    trusted = {name: key.public_key() for name, key in keys.items()}
    lose, floors, kinds = lose or {}, floors or {}, kinds or {}
    return {
        t.name: kinds.get(t.name, Site)(
            t, keys[t.name], trusted, lose.get(t.name), floors.get(t.name, 1)
        )
        for t in tables
    }


def _run(spec: CapeJobSpec, sites: dict[str, Site], seed: int) -> CapeResult:
    job = CapeJob(f"job-{seed}", spec, list(sites.values()), np.random.default_rng(seed))
    return asyncio.run(job.run())


def _run_any(spec: AnyCapeSpec, sites: dict[str, Site], seed: int) -> Any:
    return asyncio.run(job_for(f"job-{seed}", spec, list(sites.values()), make_rng(seed)).run())


def _exact_coefficients(spec: CapeJobSpec, site: Site, result: CapeResult) -> NDArray[np.float64]:
    """``Lambda_s``: the site's packed exact coefficients under the job's final plan."""
    names = result.report["sites"]
    plan = spec.plan([result.report["sizes"][n] for n in names])
    x, y = spec.scaled(site.table.select(spec.columns), site.table.select([spec.target[0]])[:, 0])
    return site_coefficients(plan, names.index(site.name), x, y)


def _check_zero_sum_over_averaged_sites(
    spec: CapeJobSpec, sites: dict[str, Site], result: CapeResult, relative_step: float = 1e-6
) -> None:
    """The estimate is the average of releases of one noise round over exactly its sites.

    * every averaged site released in the same round, and no other site took part in it;
    * the total broadcast for it is the sum of exactly those sites' noise draws, and so their
      corrected noise ``e_s = e_hat_s - total / S`` sums to zero, within the stochastic
      rounding of secure aggregation: ``|sum_s e_s| = |sum_s e_hat_s - total|`` is less than one
      grid step per site and entry (``S * 2 clip / (2^30 - 1)``, about 1e-7 of the noise's
      standard deviation with 5 sites; ``relative_step`` bounds it);
    * the fit is the curator's fit of the average of those releases, bit for bit.
    """
    averaged = list(result.report["sites"])
    rounds = {rid for n in averaged for rid in sites[n].releases}
    assert len(rounds) == 1, f"the averaged releases come from {len(rounds)} noise rounds"
    (rid,) = rounds
    assert sorted(n for n, s in sites.items() if rid in s.inputs) == averaged
    params = sites[averaged[0]].params[rid]
    assert params.sites == tuple(averaged)
    draws = [sites[n].inputs[rid] for n in averaged]
    total = sites[averaged[0]].totals[rid]
    for n in averaged:
        np.testing.assert_array_equal(sites[n].totals[rid], total)
    plan = spec.plan([result.report["sizes"][n] for n in averaged])
    assert not plan.weighted  # equal sizes: the inputs are the draws e_hat_s themselves
    corrected = [zero_sum_correction(e, total, len(averaged)) for e in draws]
    step = 1.0 / params.fixed_point.scale
    assert np.max(np.abs(np.sum(corrected, axis=0))) <= len(averaged) * step
    assert len(averaged) * step < relative_step * min(plan.entry_scales(0))
    fit = fit_released(plan, aggregate_releases(plan, [sites[n].releases[rid] for n in averaged]))
    weights, intercept = to_raw_coefficients(fit.w, spec.feature_bounds, spec.target_bounds)
    np.testing.assert_array_equal(result.weights, weights[:-1])
    assert result.intercept == intercept + float(weights[-1])


# ------------------------------------------------------------------------------- dropouts
def test_with_every_site_one_noise_round_and_every_release_is_averaged() -> None:
    sites = _sites(_tables(40))
    result = _run(_spec(), sites, seed=1)
    assert result.report["noise_rounds"] == 1
    assert result.report["sites"] == list(SITES) and result.report["dropped"] == {}
    _check_zero_sum_over_averaged_sites(_spec(), sites, result)


@pytest.mark.parametrize(
    ("stage", "reason", "draws"),
    [
        ("attest", "attest", 1),  # lost before any round: the re-planned round is the only one
        ("plan", "plan", 1),
        ("advertise", "advertise keys", 2),
        ("share", "share keys", 2),
        ("mask", "masked input", 2),  # its keys were shared: its pairwise masks are removed
        ("check", "consistency check", 2),  # after masking: its draw is in the round's sum
        ("unmask", "unmask", 2),
    ],
)
def test_a_site_lost_during_the_noise_round_is_left_out_and_the_round_rerun(
    stage: str, reason: str, draws: int
) -> None:
    """A site lost before the releases: the curator re-plans without it and reruns the noise
    round, so the zero-sum property holds over exactly the four sites it averages."""
    lost = "site-2"
    sites = _sites(_tables(40), lose={lost: stage})
    result = _run(_spec(), sites, seed=2)
    report = result.report
    assert report["noise_rounds"] == 2  # the attempts: plans made
    assert report["sites"] == [s for s in SITES if s != lost]
    assert list(report["dropped"]) == [lost]
    assert report["dropped"][lost].startswith(reason)
    assert sites[lost].releases == {}
    _check_zero_sum_over_averaged_sites(_spec(), sites, result)
    # Every other site drew noise in each round that ran and released once, in the last.
    for name in report["sites"]:
        assert len(sites[name].inputs) == draws and len(sites[name].releases) == 1


def test_a_site_lost_at_its_release_leaves_an_average_with_its_larger_noise_stated() -> None:
    """A site lost at its release, after the others released (and charged): the curator does not
    rerun the round but averages the four releases it received, and states the larger noise of
    that average (the lost site's zero-sum correction stays in it)."""
    lost = "site-2"
    spec = _spec()
    sites = _sites(_tables(40), lose={lost: "release"})
    result = _run(spec, sites, seed=3)
    report = result.report
    kept = [s for s in SITES if s != lost]
    assert report["noise_rounds"] == 1
    assert report["sites"] == kept and report["noise_round_sites"] == list(SITES)
    assert report["lost_at_release"] == [lost] and list(report["dropped"]) == [lost]
    plan = spec.plan([report["sizes"][n] for n in SITES])
    released = [SITES.index(n) for n in kept]
    stated = report["aggregator_noise_std"]
    assert stated == plan.aggregator_scales(released)
    for order, std in plan.aggregator_scales().items():
        # equal sizes, one of S = 5 lost: c = 0.8 for it and -0.2 for the others, variance
        # (0.64 + 4 * 0.04 + 4 / 5) / 0.8^2 = 2.5 times the pooled one (partial_average_variance)
        assert stated[order] == pytest.approx(std * math.sqrt(2.5))
    (rid,) = {rid for n in kept for rid in sites[n].releases}
    assert rid in sites[lost].inputs and rid not in sites[lost].releases
    fit = fit_released(
        plan,
        aggregate_releases(plan, [sites[n].releases[rid] for n in kept], released),
        released=released,
    )
    weights, intercept = to_raw_coefficients(fit.w, spec.feature_bounds, spec.target_bounds)
    np.testing.assert_array_equal(result.weights, weights[:-1])
    assert result.intercept == float(intercept + weights[-1])
    # The intervals are the bootstrap of that larger noise, drawn after the owners' seeds.
    rng = np.random.default_rng(3)
    rng.integers(0, 2**63 - 1, size=len(SITES))
    expected = capefm_estimates(
        plan,
        fit,
        spec.coefficient_labels,
        spec.raw_map(),
        np.random.default_rng(rng.integers(0, 2**63 - 1)),
        task_covers=spec.covers,
        released=released,
        values=[*result.weights, result.intercept],
    )
    assert result.estimates == expected
    assert report["estimates"] == [e.to_json() for e in expected]
    assert [e.value for e in expected] == [*result.weights, result.intercept]


def test_no_release_at_all_aborts_the_job() -> None:
    sites = _sites(_tables(40), lose={n: "release" for n in SITES})
    with pytest.raises(AbortedError, match="no site released"):
        _run(_spec(), sites, seed=3)


def test_fewer_than_two_sites_fail_with_failed_precondition() -> None:
    alone = _sites(_tables(40, sites=SITES[:1]))
    with pytest.raises(FailedPreconditionError, match="at least 2 sites; 1 remain"):
        _run(_spec(), alone, seed=4)
    assert alone[SITES[0]].inputs == {} and alone[SITES[0]].releases == {}
    # Two of three sites lost when the job opens: nothing is drawn, nothing released.
    three = _sites(_tables(40, sites=SITES[:3]), lose={SITES[0]: "open", SITES[2]: "open"})
    with pytest.raises(FailedPreconditionError, match="at least 2 sites; 1 remain") as info:
        _run(_spec(), three, seed=5)
    assert SITES[0] in str(info.value) and SITES[2] in str(info.value)
    assert all(s.inputs == {} and s.releases == {} for s in three.values())


# ------------------------------------------------------------------------ curator's view
def test_the_masked_vectors_the_curator_receives_are_uniform_not_the_sites_draws() -> None:
    """Each masked vector is ``x + pairwise masks + self mask`` mod ``2^k``: it must not be (the
    fixed-point encoding of) the site's noise draw, and must look uniform on ``[0, 2^k)``.

    KS test of ``masked / 2^k`` against Uniform(0, 1) over 5 sites x 10 jobs (the masks come
    from a CSPRNG, so this is a fresh sample each run): under uniformity ``p <= 1e-4`` has
    probability 1e-4, the test's failure probability.
    """
    samples = []
    for seed in range(10):
        sites = _sites(_tables(20, seed=seed))
        _run(_spec(), sites, seed=seed)
        for site in sites.values():
            ((rid, masked),) = site.masked.items()
            fp = site.params[rid].fixed_point
            draw = site.inputs[rid]
            # The encoding is floor or ceil of u (stochastic rounding): within one of u.
            u = draw * fp.scale + fp.levels / 2.0
            assert not np.any(np.abs(masked.astype(np.float64) - u) <= 1.0)
            samples.append(masked.astype(np.float64) / float(fp.modulus))
    pooled = np.concatenate(samples)
    assert stats.kstest(pooled, "uniform").pvalue > 1e-4


def test_a_release_differs_from_the_sites_coefficients_by_noise_of_the_planned_scale() -> None:
    """What the curator receives from site s is ``Lambda_s + e_s + g_s`` with ``e_s + g_s ~
    N(0, tau_s^2)`` per entry (equal sizes: ``(1 - 1/S) tau^2 + tau^2 / S``; Algorithm 2).

    Over 60 seeded jobs, one site per job (sites of one job are dependent through the zero-sum
    noise; entries of one release are independent), the standardized differences ``(release -
    Lambda_s) / tau_s`` are tested against N(0, 1) by Kolmogorov-Smirnov: ``p > 1e-4``
    (failure probability 1e-4 under the null; the run is seeded).
    """
    spec = _spec()
    z = []
    for seed in range(60):
        sites = _sites(_tables(30, seed=100 + seed))
        result = _run(spec, sites, seed=seed)
        name = SITES[seed % len(SITES)]
        site = sites[name]
        ((_, release),) = site.releases.items()
        exact = _exact_coefficients(spec, site, result)
        assert not np.allclose(release, exact)
        plan = spec.plan([result.report["sizes"][n] for n in result.report["sites"]])
        tau = plan.entry_scales(result.report["sites"].index(name))
        z.append((release - exact) / tau)
    pooled = np.concatenate(z)
    assert pooled.size == 60 * (spec.dim + spec.dim**2)
    assert stats.kstest(pooled, "norm").pvalue > 1e-4


# ------------------------------------------------------------------------------- accuracy
def _scaled_weights(spec: CapeJobSpec, weights: NDArray[np.float64], intercept: float) -> NDArray:
    """Invert :func:`to_raw_coefficients` and the curator's folding of the intercept column:
    the weights on the scaled features, the intercept column's last."""
    fb = spec.feature_bounds
    d = spec.dim
    lo, hi = fb[:, 0], fb[:, 1]
    a = 2.0 / ((hi - lo) * math.sqrt(d))
    c = (-2.0 * lo / (hi - lo) - 1.0) / math.sqrt(d)
    low, high = spec.target[1:]
    half = (high - low) / 2.0
    w = np.empty(d)
    w[:-1] = weights / (half * a[:-1])
    rest = intercept - low - half * (c[:-1] @ w[:-1] + 1.0)
    w[-1] = rest / (half * (c[-1] + a[-1]))
    return w


def test_with_large_epsilon_the_fit_approaches_pooled_least_squares() -> None:
    """At epsilon = 1e3 the noise is small and capeFM's fit is the non-private pooled
    least-squares fit on the scaled data, within a tolerance from the planned noise.

    Tolerance (first-order perturbation of ``w = -(1/2) H^-1 lambda_1``, ``H`` the pooled
    ``X^T X / N``): ``delta_w = -(1/2) H^-1 (delta_lambda_1 + 2 sym(delta_H) w)`` has covariance
    ``(1/4) H^-1 Sigma H^-1`` with ``Sigma = s1^2 I + 2 s2^2 (||w||^2 I + w w^T)`` for the
    aggregator's per-entry noise ``s1`` (order 1) and ``s2`` (order 2; the symmetrized part has
    off-diagonal variance ``s2^2 / 2``). Each coordinate may deviate by 6 of its standard
    deviations (two-sided Gaussian tail 2e-9 per coordinate), times 1.1 for the second-order
    term (``||H^-1|| ||delta_H|| < 0.03`` here). The floor must not clip an eigenvalue.
    """
    spec = _spec(epsilon=1e3, delta=1e-6)
    tables = _tables(100, seed=7)
    result = _run(spec, _sites(tables), seed=8)
    assert result.report["eigenvalues_clipped"] == 0
    scaled = [spec.scaled(t.select(spec.columns), t.select(["y"])[:, 0]) for t in tables]
    x = np.vstack([s[0] for s in scaled])
    y = np.concatenate([s[1] for s in scaled])
    ols = np.linalg.lstsq(x, y, rcond=None)[0]
    # The inversion is right: the pooled fit survives the round trip through raw units.
    raw, raw_intercept = to_raw_coefficients(ols, spec.feature_bounds, spec.target_bounds)
    roundtrip = _scaled_weights(spec, raw[:-1], raw_intercept + float(raw[-1]))
    np.testing.assert_allclose(roundtrip, ols, rtol=1e-9, atol=1e-12)

    plan = spec.plan([t.n_rows for t in tables])
    s1, s2 = plan.aggregator_scales()[1], plan.aggregator_scales()[2]
    h_inv = np.linalg.inv(x.T @ x / x.shape[0])
    eye = np.eye(spec.dim)
    sigma = s1**2 * eye + 2 * s2**2 * (ols @ ols * eye + np.outer(ols, ols))
    std = np.sqrt(np.diag(h_inv @ sigma @ h_inv) / 4.0)
    second_order = np.linalg.norm(h_inv, 2) * 2 * s2 * math.sqrt(2 * spec.dim)
    assert second_order < 0.03
    tolerance = 1.1 * 6.0 * std
    assert np.max(tolerance) < 0.05  # small against weights of order 0.1 to 1: a real check
    fitted = _scaled_weights(spec, result.weights, result.intercept)
    assert np.all(np.abs(fitted - ols) <= tolerance), (fitted, ols, tolerance)


# ------------------------------------------------------------------------------- the mean
MEAN = CapeMeanSpec((*FEATURES, TARGET), epsilon=1.0, delta=1e-6)


def _assert_zero_sum(draws: Sequence[NDArray], total: NDArray, params: RoundParams) -> None:
    """``sum_s e_s = sum_s e_hat_s - total = 0`` over exactly these sites (equal sizes: the
    round sums the draws themselves), within the stochastic rounding of secure aggregation:
    one grid step per site and entry."""
    residual = np.max(np.abs(np.sum(draws, axis=0) - total))
    assert residual <= len(draws) / params.fixed_point.scale


def test_a_mean_is_the_average_of_one_round_of_releases_over_exactly_its_sites() -> None:
    sites = _sites(_tables(40))
    result = _run_any(MEAN, sites, seed=11)
    report = result.report
    assert report["task"] == "mean" and report["sites"] == list(SITES)
    assert report["noise_rounds"] == 1 and report["lost_at_release"] == []
    (rid,) = sites[SITES[0]].releases
    _assert_zero_sum(
        [s.inputs[rid] for s in sites.values()],
        sites[SITES[0]].totals[rid],
        sites[SITES[0]].params[rid],
    )
    releases = [sites[n].releases[rid] for n in SITES]
    plan = MEAN.plan([40] * 5)
    raw = aggregate_releases(plan, releases)
    assert result.estimates == mean_estimates(plan, raw, MEAN.columns)
    # One value per column: the mean returned is each estimate's (cut to the column's bounds).
    np.testing.assert_array_equal(result.mean, [e.value for e in result.estimates])
    assert report["aggregator_noise_std"] == plan.aggregator_std()
    assert report["baseline_noise_std"] == plan.baseline_stds()
    exact = np.vstack([s.table.values for s in sites.values()]).mean(axis=0)
    assert np.all(np.abs(raw - exact) <= 6 * plan.aggregator_std())
    assert report["estimates"] == [e.to_json() for e in result.estimates]


def test_a_mean_with_a_site_lost_at_its_release_states_the_larger_noise() -> None:
    sites = _sites(_tables(40), lose={"site-2": "release"})
    result = _run_any(MEAN, sites, seed=12)
    kept = [s for s in SITES if s != "site-2"]
    assert result.report["sites"] == kept and result.report["lost_at_release"] == ["site-2"]
    plan = MEAN.plan([40] * 5)
    stated = result.report["aggregator_noise_std"]
    assert stated == plan.aggregator_std([0, 1, 3, 4])
    assert stated == pytest.approx(plan.aggregator_std() * math.sqrt(2.5))
    assert all(e.standard_error == stated for e in result.estimates)


# ---------------------------------------------------------------------- gradient descent
LABELLED = ("a", "b", "c", "label")


def _labelled_tables(rows: int, sites: Sequence[str], seed: int = 0) -> list[Table]:
    """Tables with a label their owners declare 0/1: ``label = [0.3 a - 0.5 b + 2 c + U(-1, 1)
    > 1.5]``."""
    out = []
    for table in _tables(rows, seed, sites):
        y = (table.values[:, 3] > 1.5).astype(np.float64)
        values = np.column_stack([table.values[:, :3], y])
        out.append(Table(LABELLED, values, table.name, binary=("label",)))
    return out


def _training(iterations: int = 6) -> CapeTrainingSpec:
    return CapeTrainingSpec(FEATURES, "label", 1.0, 1e-5, iterations, 1.0, 4, 1.0)


def _replay(
    spec: CapeTrainingSpec, sites: dict[str, Site], result: Any, seed: int
) -> list[list[str]]:
    """Check every iteration against what crossed the boundary; return its averaged sites.

    Each iteration's parameters are the previous ones minus the learning rate times the
    (Remark 3) average of the releases of that iteration, starting from the curator's public
    initial parameters (bit for bit); every averaged release comes from one noise round whose
    draws sum to zero over exactly its sites, unless the report states that iteration's larger
    noise; no site releases an iteration twice."""
    rng = make_rng(seed)
    rng.integers(0, 2**63 - 1, size=len(sites))  # the owners' seeds come first
    theta = init_params(spec.dim, spec.hidden, rng)
    averaged_per_iteration = []
    stated = result.report["noise_std_per_iteration"]
    data = {
        n: spec.scaled(s.table.select(spec.columns), s.table.select([spec.target])[:, 0])
        for n, s in sites.items()
    }
    z = []
    for t in range(spec.iterations):
        seen = {n: [k for k in s.gradients if k[1] == t] for n, s in sites.items()}
        assert all(len(keys) <= 1 for keys in seen.values()), f"iteration {t} released twice"
        averaged = sorted(n for n, keys in seen.items() if keys)
        (rid,) = {keys[0][0] for keys in seen.values() if keys}
        round_sites = sorted(n for n, s in sites.items() if rid in s.inputs)
        params = sites[averaged[0]].params[rid]
        assert params.sites == tuple(round_sites)
        plan = spec.plan(
            [sites[n].table.n_rows for n in round_sites],
            first_iteration=min(k[1] for s in sites.values() for k in s.gradients if k[0] == rid),
            colluders=result.report["colluders"],
        )
        row = t - plan.first_iteration
        for n in averaged:
            np.testing.assert_array_equal(sites[n].gradients[rid, t][0], theta)
        total = sites[averaged[0]].gradients[rid, t][1]
        draws = [sites[n].inputs[rid].reshape(plan.round_iterations, -1)[row] for n in round_sites]
        for n in averaged:  # one broadcast sum per iteration
            np.testing.assert_array_equal(sites[n].gradients[rid, t][1], total)
        released = [round_sites.index(n) for n in averaged]
        partial = released if averaged != round_sites else None
        if partial is None:
            _assert_zero_sum(draws, total, params)
        assert stated[t] == plan.aggregator_std(partial)
        releases = [sites[n].gradients[rid, t][2] for n in averaged]
        average = aggregate_releases(plan, releases, partial)
        exact = np.mean(
            [site_gradient(theta, *data[n], clip=spec.clip, hidden=spec.hidden) for n in averaged],
            axis=0,
        )
        z.append((average - exact) / stated[t])
        theta = theta - spec.learning_rate * average
        averaged_per_iteration.append(averaged)
    np.testing.assert_array_equal(result.parameters, theta)
    size = np.size(z)
    ratio = float(np.mean(np.square(z)))
    assert stats.chi2.ppf(5e-7, size) / size <= ratio <= stats.chi2.isf(5e-7, size) / size, ratio
    return averaged_per_iteration


def test_a_training_steps_on_the_average_of_every_iterations_releases() -> None:
    """One noise round draws every iteration's zero-sum noise; each iteration's average is over
    all five sites and its noise cancels; the parameters replay bit for bit."""
    spec = _training()
    sites = _sites(_labelled_tables(30, SITES))
    result = _run_any(spec, sites, seed=21)
    report = result.report
    assert report["noise_rounds"] == 1 and len(report["segments"]) == 1
    assert all(len(s.inputs) == 1 for s in sites.values())
    assert _replay(spec, sites, result, 21) == [list(SITES)] * spec.iterations
    plan = spec.plan([30] * 5)
    assert report["epsilon"] == plan.epsilon <= spec.epsilon
    assert report["noise_std_per_iteration"] == [plan.aggregator_std()] * spec.iterations
    # No interval for a network: the consumer flags every parameter from the parameters and the
    # last step's noise; the reply carries no per-parameter text (it stays the parameters' size).
    assert "estimates" not in report
    last = report["noise_std_per_iteration"][-1]
    estimates = training_estimates(result.parameters, spec.parameter_labels, 1.0, last)
    assert [e.label for e in estimates] == list(spec.parameter_labels)
    assert [e.value for e in estimates] == result.parameters.tolist()
    floor = f"{spec.learning_rate * plan.aggregator_std():.3g}"
    for e in estimates:
        (flag,) = e.flags
        assert e.low is None and flag.code == "no_interval" and floor in flag.reason


def test_a_site_lost_mid_training_leaves_one_iteration_with_its_noise_stated_then_a_new_round() -> (
    None
):
    """Seven sites (S_C = 2); site-3 vanishes at iteration 2's release. Iteration 2 is the
    average of the six others, with the larger noise stated; iterations 3.. come from a fresh
    noise round over exactly the six, zero-sum again, with S_C kept at 2 (the default for six
    sites would be 1, a weaker guarantee for the later iterations)."""
    names = tuple(f"site-{i}" for i in range(7))
    spec = _training(iterations=5)
    sites = _sites(_labelled_tables(30, names), lose={"site-3": "gradient@2"})
    result = _run_any(spec, sites, seed=22)
    report = result.report
    six = [n for n in names if n != "site-3"]
    assert _replay(spec, sites, result, 22) == [list(names)] * 2 + [six] * 3
    assert report["lost_at_release"] == {"site-3": 2} and report["colluders"] == 2
    assert [s["sites"] for s in report["segments"]] == [list(names), six]
    assert [(s["first_iteration"], s["last_iteration"]) for s in report["segments"]] == [
        (0, 2),
        (3, 4),
    ]
    full = spec.plan([30] * 7)
    stds = report["noise_std_per_iteration"]
    assert stds[:2] == [full.aggregator_std()] * 2
    assert stds[2] == full.aggregator_std([0, 1, 2, 4, 5, 6]) > full.aggregator_std()
    later = report["segments"][1]["site_noise_std"]
    assert later == pytest.approx(
        [math.sqrt(collusion_factor(6, 2)) * 2.0 / 30 / full.loss_sigma] * 6, rel=1e-12
    )


def test_a_site_lost_in_the_noise_round_of_a_later_segment_is_left_out_before_it_releases() -> None:
    """site-1 vanishes at iteration 1's release, site-4 while advertising keys for the second
    round: the curator reruns that round without it, and iterations 2.. are zero-sum over the
    three sites left."""
    spec = _training(iterations=4)
    sites = _sites(
        _labelled_tables(30, SITES), lose={"site-1": "gradient@1", "site-4": "advertise@2"}
    )
    result = _run_any(spec, sites, seed=23)
    three = ["site-0", "site-2", "site-3"]
    four = [n for n in SITES if n != "site-1"]
    assert _replay(spec, sites, result, 23) == [list(SITES), four, three, three]
    assert result.report["noise_rounds"] == 3
    assert result.report["dropped"]["site-4"].startswith("advertise keys")


def test_an_owner_releases_each_iteration_once_in_order_and_only_gradients() -> None:
    """The owner, not the curator, bounds what a training releases: an iteration twice, an
    iteration before the last one released, a re-plan of released iterations and a one-off
    release are refused; so are malformed parameters."""
    spec = _training(iterations=3)
    (table,) = _labelled_tables(20, ["solo"])
    keys = {n: ec.generate_private_key(ec.SECP256R1()) for n in ("other", "solo")}
    trusted = {n: k.public_key() for n, k in keys.items()}
    site = CapeSite(
        "solo", table, identity=SiteIdentity("solo", keys["solo"], b"", None).trusting(trusted)
    )
    site.open("job", spec, 1, curator="curator:c", consumer="consumer:x")
    sites = ["other", "solo"]

    def plan(first_iteration: int = 0) -> Any:
        own, _ = site.attest("job", sites, 1, curator="curator:c", first_iteration=first_iteration)
        statement = plan_statement("job", spec, sites, 1, first_iteration, "other", 20)
        other = SizeAttestation("other", 20, EcdsaSigner(keys["other"]).sign(statement))
        return site.plan(
            "job",
            sites,
            1,
            {"other": other, "solo": own},
            {},
            curator="curator:c",
            first_iteration=first_iteration,
        )

    plan0 = plan()
    params = RoundParams.create(sites, 2, plan0.round_length, FixedPoint(1.0, 20, 2), colluders=1)
    site.noise_input("job", params)
    site.round_finished("job", params.round_id, sites)
    theta = np.zeros(plan0.size)
    total = np.zeros(plan0.size)
    rid = params.round_id
    site.release_gradient("job", rid, 1, theta, total, curator="curator:c")
    with pytest.raises(FailedPreconditionError, match="released at most once"):
        site.release_gradient("job", rid, 1, theta, total, curator="curator:c")
    with pytest.raises(FailedPreconditionError, match="not after the last one released"):
        site.release_gradient("job", rid, 0, theta, total, curator="curator:c")
    with pytest.raises(InvalidArgumentError, match=r"iteration must lie in \[0, 3\)"):
        site.release_gradient("job", rid, 3, theta, total, curator="curator:c")
    with pytest.raises(InvalidArgumentError, match="parameters must be"):
        site.release_gradient(
            "job", rid, 2, np.full(plan0.size, np.nan), total, curator="curator:c"
        )
    with pytest.raises(FailedPreconditionError, match="releases gradients"):
        site.release("job", rid, total, curator="curator:c")
    with pytest.raises(FailedPreconditionError, match="a new plan must start after it"):
        plan(first_iteration=1)
    later = plan(first_iteration=2)
    assert later.round_length == plan0.size


# ------------------------------------------------------------------------------ S_C and counts
def test_the_default_s_c_is_raised_to_the_highest_floor_and_so_is_the_threshold() -> None:
    """Five sites default to S_C = 1; one owner's policy requires 3: the job defends against 3
    colluders, every site plans with it, and the noise round's threshold is the least t with
    2 t > 5 + 3, i.e. 5 of 5."""
    sites = _sites(_tables(40), floors={"site-3": 3})
    result = _run(_spec(), sites, seed=31)
    assert result.report["colluders"] == 3
    (params,) = sites["site-0"].params.values()
    assert (params.colluders, params.threshold) == (3, 5)


def test_a_job_asking_for_fewer_colluders_than_an_owners_floor_releases_nothing() -> None:
    """An owner refuses S_C = 1 below its floor of 2 when the job opens: a job that needs every
    site fails naming it, before anything is drawn or released; one that may run on any 2 runs
    without it, planned over the others alone, the refusal's policy key in its report."""
    sites = _sites(_tables(40), floors={"site-2": 2})
    spec = dataclasses.replace(_spec(), colluders=1)
    every = CapeJob("job-32", spec, list(sites.values()), make_rng(32), min_sites=len(sites))
    with pytest.raises(FailedPreconditionError, match=r"owner site-2: .*S_C=1 .* floor of 2"):
        asyncio.run(every.run())
    assert all(not s.inputs and not s.releases for s in sites.values())
    result = _run(spec, sites, seed=33)
    others = sorted(set(sites) - {"site-2"})
    assert result.report["sites"] == others and list(result.report["sizes"]) == others
    assert result.report["dropped"]["site-2"].startswith(
        "open: refused (FAILED_PRECONDITION: cape.min_colluders); the owner's own words: «"
    )
    assert not sites["site-2"].inputs and not sites["site-2"].releases


class LiesAboutItsSize(Site):
    """A colluding site that signs one count and hands the curator another."""

    async def attest_plan(self, job_id, sites, colluders, first_iteration=0):
        attestation, certificate = await super().attest_plan(
            job_id, sites, colluders, first_iteration
        )
        return dataclasses.replace(attestation, rows=attestation.rows * 10), certificate


def test_a_count_that_does_not_verify_aborts_the_job_before_any_noise_is_drawn() -> None:
    """site-4 signs its own count and relays ten times more: every other owner finds the count
    not signed for the plan and aborts the job; no site drew noise or released anything."""
    sites = _sites(_tables(40), kinds={"site-4": LiesAboutItsSize})
    with pytest.raises(AbortedError, match=r"row count of 'site-4' \(400\) is not signed"):
        _run(_spec(), sites, seed=33)
    assert all(not s.inputs and not s.releases for s in sites.values())
