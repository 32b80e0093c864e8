"""Candidate intervals for undetermined capeFM fits, measured on releases drawn from the noise law
(``python -m dpmarket.experiments.cape_rules``; docs/results.md, "CAPE intervals on undetermined
fits").

The harness (:mod:`dpmarket.experiments.cape_coverage`) runs every repetition through the curator's
job: faithful, and about a second per repetition. Designing a rule needs many rules on the same
releases, so here each repetition draws the aggregator's release directly from its law, the
pooled noise-free coefficients of a harness case plus independent Gaussian entries of the plan's
per-order std (:meth:`dpmarket.common.cape.capefm.CapeFMPlan.aggregator_scales`; the law CAPE's
zero-sum noise leaves, Lemma 1), fits it as the curator does, and scores, per coefficient, how
often each rule's 95 % interval covers the case's truth:

===================  ===============================================================================
``floored``          the bootstrap over every draw, solve floored at 0.2 noise std (``hull=False``)
``hull``             the construction the curator reports (:func:`~dpmarket.common.cape.uncertainty.
                     capefm_estimates`)
``psd``              the bootstrap kept to its positive semidefinite draws alone
``mixture``          the percentile interval of the two bootstraps' draws pooled
``calibrated``       the mixture at a level per coefficient from a double bootstrap (Beran's
                     prepivoting) whose pseudo-truth is the released, regularized fit: 100
                     pseudo-releases of it, 200 draws each; the level is the 95 % quantile of
                     ``|2 u - 1|``, ``u`` the pseudo-truth's rank among a pseudo-release's draws
``prepivoted``       on resolved fits, the floored bootstrap at a level per coefficient from the
                     double bootstrap of ``calibrated`` (its pseudo-truth the released fit); on
                     undetermined fits the hull, whose ``undetermined`` flag is then on the
                     interval (docs/results.md, "CAPE intervals: the undetermined flag on the
                     interval")
``ar_joint``         the exact Anderson-Rubin set projected per coefficient at ``chi2_D(0.95)``
                     (:mod:`dpmarket.experiments.cape_ar`), on every fit, resolved or not
``ar_profile``       the same at ``chi2_1(0.95)`` (the profile set), on every fit
``ar_undetermined``  ``ar_profile`` where the fit is undetermined
``bc``               on resolved fits, Efron's bias-corrected percentile interval of a floored
                     bootstrap (B. Efron, JASA 82, 1987: levels ``Phi(2 z0 -+ z)``, ``z0`` from the
                     share of draws below the solve's value); the hull on undetermined fits, as
                     for every rule below
``debiased``         on resolved fits, the solve's value minus its analytic second-order bias
                     under the noise law (:func:`second_order_bias`, plug-in at the solve),
                     ``-+ z`` times the draws' standard deviation
``shifted``          on resolved fits, the percentile interval moved by twice that bias (its
                     centre carries the bias twice: the estimator's and the bootstrap's own)
``studentized``      on resolved fits, the percentile-t interval, each draw studentized by its
                     delta-method standard error under the noise law (:func:`_delta_variance`)
``basic``            on resolved fits, the percentile interval reflected around the solve
``tails``            on resolved fits, the percentile interval at lower and upper levels
                     calibrated apart by a double bootstrap around the solve (:func:`_tail_levels`;
                     slow, 100 x 200 draws per release)
===================  ===============================================================================

Resolved fits (no eigenvalue within one noise std of 0) get the floored bootstrap under every rule
but ``prepivoted``, ``ar_joint``, ``ar_profile`` and the rules from ``bc`` on (docs/results.md,
"CAPE intervals on resolved fits: bias corrections measured, none adopted"). ``--rule`` scores
some rules only (``calibrated``, ``prepivoted`` and ``tails`` are the slow ones); for the
Anderson-Rubin rules the output adds the share of releases with an unbounded interval and the
coverage among the bounded ones.
``--out`` keeps every release's hits, flag groups and clipped eigenvalues.
"""

from __future__ import annotations

from dataclasses import dataclass

import click
import numpy as np
from numpy.typing import NDArray

from dpmarket.common.cape import uncertainty as unc
from dpmarket.common.cape.capefm import CapeFMPlan
from dpmarket.common.cape.functional_mechanism import (
    FMCoefficients,
    FMRelease,
    default_floor,
    fit_coefficients,
    fm_coefficients,
)
from dpmarket.common.cape.spec import CapeJobSpec
from dpmarket.experiments.cape_ar import ar_intervals
from dpmarket.experiments.cape_coverage import (
    CASES,
    FLAG_GROUPS,
    FlagCoverage,
    flag_group,
    split_by_flag,
    split_cell,
)

__all__ = ["RESOLVED_RULES", "RULES", "flag_split", "second_order_bias", "simulate"]

Array = NDArray[np.float64]
RULES = (
    "floored", "hull", "psd", "mixture", "calibrated", "prepivoted", "ar_joint", "ar_profile",
    "ar_undetermined", "bc", "debiased", "shifted", "studentized", "basic", "tails",
)  # fmt: skip
#: The rules that change the interval of resolved fits only (the hull on undetermined ones).
RESOLVED_RULES = ("bc", "debiased", "shifted", "studentized", "basic", "tails")
#: Pseudo-releases and draws per pseudo-release of the calibrating double bootstrap.
PSEUDO, INNER = 100, 200
#: Pseudo-releases of the equal-tailed calibration (rule ``tails``).
TAIL_PSEUDO = 100


@dataclass(frozen=True)
class Setup:
    """A harness case's plan, its pooled noise-free coefficients and raw map."""

    spec: CapeJobSpec
    plan: CapeFMPlan
    pooled: FMCoefficients
    raw_map: tuple[Array, Array]
    truth: Array


def _setup(name: str) -> Setup:
    case = CASES[name]()
    spec = case.spec
    assert isinstance(spec, CapeJobSpec), f"{name} is not a fit"
    sites = [spec.scaled(t.values[:, :-1], t.values[:, -1]) for t in case.tables]
    sizes = [len(y) for _, y in sites]
    coeffs = [fm_coefficients(x, y, spec.task) for x, y in sites]
    share = np.asarray(sizes, dtype=np.float64) / sum(sizes)
    pooled = FMCoefficients(
        coeffs[0].lam0,
        sum(s * c.lam1 for s, c in zip(share, coeffs, strict=True)),
        sum(s * c.lam2 for s, c in zip(share, coeffs, strict=True)),
    )
    return Setup(spec, spec.plan(sizes), pooled, spec.raw_map(), case.truth)


def _release(setup: Setup, rng: np.random.Generator) -> FMRelease:
    s, d, c = setup.plan.aggregator_scales(None), setup.plan.dim, setup.pooled
    noisy = FMCoefficients(
        c.lam0, c.lam1 + rng.normal(0.0, s[1], d), c.lam2 + rng.normal(0.0, s[2], (d, d))
    )
    return fit_coefficients(noisy, noise_std2=s[2], floor=default_floor(d, s[2]), scales=s)


def _solves(lam1: Array, lam2: Array, floor: float) -> tuple[Array, Array]:
    """Floored solves of stacked coefficients ``(..., D)``, ``(..., D, D)``; smallest eigenvalue."""
    vals, vecs = np.linalg.eigh(0.5 * (lam2 + np.swapaxes(lam2, -1, -2)))
    proj = np.einsum("...ji,...j->...i", vecs, lam1) / np.maximum(vals, floor)
    return -0.5 * np.einsum("...ij,...j->...i", vecs, proj), vals[..., 0]


def _levels(setup: Setup, solve: FMRelease, fit: FMRelease, rng: np.random.Generator) -> Array:
    """Per raw coefficient, the mixture's level from the double bootstrap (module docstring)."""
    s, d = setup.plan.aggregator_scales(None), setup.plan.dim
    m, c = setup.raw_map
    vals, vecs = np.linalg.eigh(0.5 * (solve.coefficients.lam2 + solve.coefficients.lam2.T))
    t2 = (vecs * np.maximum(vals, solve.floor)) @ vecs.T
    t1 = -2.0 * t2 @ fit.w
    truth = m @ fit.w + c
    ranks = []
    for _ in range(PSEUDO):
        r1 = t1 + rng.normal(0.0, s[1], d)
        r2 = t2 + rng.normal(0.0, s[2], (d, d))
        w, low = _solves(
            r1 + rng.normal(0.0, s[1], (INNER, d)), r2 + rng.normal(0.0, s[2], (INNER, d, d)),
            solve.floor,
        )  # fmt: skip
        below = (w @ m.T + c) <= truth
        ok = low >= 0.0
        weight = 1.0 + ok if ok.sum() >= INNER // 10 else np.ones(INNER)
        ranks.append(weight @ below / weight.sum())
    level = np.quantile(np.abs(2.0 * np.asarray(ranks) - 1.0), 0.95, axis=0)
    return np.asarray(np.clip(level, 0.5, 0.998))


def _intervals(
    setup: Setup, fit: FMRelease, seed: int, rules: frozenset[str] = frozenset(RULES)
) -> tuple[dict[str, tuple[Array, Array]], list[str | None]]:
    """Per rule, the intervals ``(low, high)`` of every raw coefficient; and each coefficient's
    flag group (:func:`~dpmarket.experiments.cape_coverage.flag_group`) as the curator reports
    it."""
    s = setup.plan.aggregator_scales(None)
    m, c = setup.raw_map
    labels = [str(i) for i in range(len(setup.truth))]
    out: dict[str, tuple[Array, Array]] = {}
    groups: list[str | None] = []
    if rules & {"ar_joint", "ar_profile", "ar_undetermined"}:
        from scipy.stats import chi2

        for rule, df in (("ar_joint", setup.plan.dim), ("ar_profile", 1)):
            low, high, _ = ar_intervals(fit, s[1], s[2], (m, c), float(chi2.ppf(0.95, df)))
            out[rule] = (low, high)
    for rule, hull in (("hull", True), ("floored", False)):
        est = unc.capefm_estimates(
            setup.plan, fit, labels, (m, c), np.random.default_rng([seed, 2]),
            task_covers="", hull=hull,
        )  # fmt: skip
        out[rule] = (np.array([e.low for e in est]), np.array([e.high for e in est]))
        if hull:
            groups = [flag_group(e) for e in est]
    solve = fit_coefficients(
        fit.coefficients, noise_std2=s[2], floor=unc.INTERVAL_FLOOR_SIGMAS * s[2], scales=s
    )
    sym = 0.5 * (fit.coefficients.lam2 + fit.coefficients.lam2.T)
    if not np.any(np.linalg.eigvalsh(sym) < unc.UNRESOLVED_SIGMAS * s[2]):
        same = ("psd", "mixture", "calibrated", "ar_undetermined")
        out = {**out, **{rule: out["floored"] for rule in same}}
        if rules & set(RESOLVED_RULES):
            out.update(
                _resolved_intervals(
                    setup, solve, np.random.default_rng([seed, 5]), "tails" in rules
                )
            )
        else:
            out.update({rule: out["floored"] for rule in RESOLVED_RULES})
        if "prepivoted" in rules:
            rng = np.random.default_rng([seed, 4])
            b = unc.bootstrap_replicates(setup.plan.dim)
            every, _ = unc.capefm_bootstrap(setup.plan, solve, rng, b, psd=False)
            out["prepivoted"] = _at_levels(every @ m.T + c, _levels(setup, solve, fit, rng))
        else:
            out["prepivoted"] = out["floored"]
        return out, groups
    out["prepivoted"] = out["hull"]
    out.update({rule: out["hull"] for rule in RESOLVED_RULES})
    if not rules & {"psd", "mixture", "calibrated"}:
        return {**out, **{rule: out["hull"] for rule in ("psd", "mixture", "calibrated")}}, groups
    if "ar_profile" in out:
        out["ar_undetermined"] = out["ar_profile"]
    rng = np.random.default_rng([seed, 3])
    b = unc.bootstrap_replicates(setup.plan.dim)
    every, _ = unc.capefm_bootstrap(setup.plan, solve, rng, b, psd=False)
    psd, conditioned = unc.capefm_bootstrap(setup.plan, solve, rng, b, psd=True)
    draws = {"psd": psd, "mixture": np.concatenate([every, psd]) if conditioned else every}
    for rule, w in draws.items():
        out[rule] = tuple(np.quantile(w @ m.T + c, [0.025, 0.975], axis=0))
    if "calibrated" not in rules:
        out["calibrated"] = out["mixture"]
        return out, groups
    out["calibrated"] = _at_levels(draws["mixture"] @ m.T + c, _levels(setup, solve, fit, rng))
    return out, groups


def _delta_variance(inv: Array, w: Array, scales: dict[int, float], m: Array) -> Array:
    """Per raw coefficient, the first-order (delta-method) variance of ``M w_hat`` under the
    noise law, at inverse Gram matrices ``inv`` ``(..., D, D)`` and weights ``w`` ``(..., D)``:
    ``w_hat - w = -A^-1 (E w + e / 2)`` to first order, so ``Cov = A^-1 (a I + g w w^T) A^-1``
    with ``a = sigma_2^2 |w|^2 / 2 + sigma_1^2 / 4`` and ``g = sigma_2^2 / 2`` (``E`` the
    symmetrized order-2 noise: ``Cov(E_ij, E_lk) = sigma_2^2 (d_il d_jk + d_ik d_jl) / 2``).
    Returns shape ``(..., K)``."""
    g = 0.5 * scales[2] ** 2
    a = g * np.einsum("...d,...d->...", w, w) + 0.25 * scales[1] ** 2
    mi = np.einsum("kd,...de->...ke", m, inv)
    return np.asarray(
        a[..., None] * np.einsum("...ke,...ke->...k", mi, mi)
        + g * np.einsum("...ke,...e->...k", mi, w) ** 2
    )


def second_order_bias(inv: Array, w: Array, sigma2: float) -> Array:
    """The second-order bias of the capeFM solve ``w_hat = -(1/2) (A + E)^-1 (b + e)`` under the
    aggregator's Gaussian noise.

    Parameters
    ----------
    inv : ndarray of shape (D, D)
        ``A^-1``, the inverse of the symmetric (noise-free, or plug-in) Gram matrix, in the
        scaled domain.
    w : ndarray of shape (D,)
        The weights ``-(1/2) A^-1 b`` (scaled domain).
    sigma2 : float
        The standard deviation of one entry of the unsymmetrized order-2 noise
        (:meth:`dpmarket.common.cape.capefm.CapeFMPlan.aggregator_scales`, order 2).

    Returns
    -------
    ndarray of shape (D,)
        ``E[w_hat] - w`` to second order: ``sigma2^2 (A^-2 + tr(A^-1) A^-1) w / 2``.

    Notes
    -----
    ``E[(A + E)^-1] = A^-1 + A^-1 E[E A^-1 E] A^-1 + O(sigma^4)`` and, for the symmetrized noise
    (``Cov(E_ij, E_lk) = sigma2^2 (d_il d_jk + d_ik d_jl) / 2``, CAPE paper, Lemma 1's law per
    entry), ``E[E M E] = sigma2^2 (M + tr(M) I) / 2``; ``b = -2 A w`` and ``e`` is independent
    of ``E`` with mean 0. An expansion: valid where every eigenvalue of ``A`` is many noise std
    from 0. At diamonds' noise-free Gram matrix (smallest eigenvalue 1.6 noise std), among 2,516
    resolved releases of 4,000, it gives carat's mean bias within 7 % (0.144 against 0.154 in raw
    units) and color's and clarity's within 10 %, but not cut's, depth's, table's or the
    intercept's (opposite signs): higher orders dominate there (docs/results.md).
    """
    return np.asarray(0.5 * sigma2**2 * (inv @ inv + np.trace(inv) * inv) @ w)


def _resolved_intervals(
    setup: Setup, solve: FMRelease, rng: np.random.Generator, tails: bool
) -> dict[str, tuple[Array, Array]]:
    """The :data:`RESOLVED_RULES`' intervals of a resolved fit, from one floored bootstrap of
    ``solve`` (the interval's solve, floor 0.2 noise std)."""
    from scipy.stats import norm

    s, d = setup.plan.aggregator_scales(None), setup.plan.dim
    m, c = setup.raw_map
    b = unc.bootstrap_replicates(d)
    lam1 = np.asarray(solve.coefficients.lam1, dtype=np.float64)
    lam2 = np.asarray(solve.coefficients.lam2, dtype=np.float64)
    vals, vecs = np.linalg.eigh(0.5 * (lam2 + lam2.T))
    inv_hat = (vecs / np.maximum(vals, solve.floor)) @ vecs.T
    w_hat = -0.5 * inv_hat @ lam1
    raw_hat = m @ w_hat + c
    l1 = lam1 + rng.normal(0.0, s[1], (b, d))
    l2 = lam2 + rng.normal(0.0, s[2], (b, d, d))
    dv, dvec = np.linalg.eigh(0.5 * (l2 + np.swapaxes(l2, 1, 2)))
    inv = np.einsum("bij,bj,bkj->bik", dvec, 1.0 / np.maximum(dv, solve.floor), dvec)
    w = -0.5 * np.einsum("bij,bj->bi", inv, l1)
    raw = w @ m.T + c
    z = float(norm.ppf(0.975))
    share = np.clip((raw < raw_hat).mean(axis=0), 0.5 / b, 1.0 - 0.5 / b)
    z0 = norm.ppf(share)
    bc = _at_quantiles(raw, norm.cdf(2.0 * z0 - z), norm.cdf(2.0 * z0 + z))
    bias = m @ second_order_bias(inv_hat, w_hat, s[2])
    sd = raw.std(axis=0, ddof=1)
    q_lo, q_hi = np.quantile(raw, [0.025, 0.975], axis=0)
    se_hat = np.sqrt(_delta_variance(inv_hat, w_hat, s, m))
    t = (raw - raw_hat) / np.sqrt(_delta_variance(inv, w, s, m))
    t_lo, t_hi = np.quantile(t, [0.025, 0.975], axis=0)
    return {
        "bc": bc,
        "debiased": (raw_hat - bias - z * sd, raw_hat - bias + z * sd),
        "shifted": (q_lo - 2.0 * bias, q_hi - 2.0 * bias),
        "studentized": (raw_hat - t_hi * se_hat, raw_hat - t_lo * se_hat),
        "basic": (2.0 * raw_hat - q_hi, 2.0 * raw_hat - q_lo),
        "tails": _at_quantiles(raw, *_tail_levels(setup, solve, rng)) if tails else (q_lo, q_hi),
    }


def _tail_levels(setup: Setup, solve: FMRelease, rng: np.random.Generator) -> tuple[Array, Array]:
    """Per raw coefficient, the lower and upper levels of the equal-tailed calibrated percentile
    interval (Beran's prepivoting, each tail apart; Hall 1992, Section 3.11): in a world whose
    truth is ``solve``, :data:`PSEUDO` pseudo-releases each get :data:`INNER` floored draws, and
    ``u`` is the pseudo-truth's rank among them; the levels are ``u``'s 2.5 % and 97.5 %
    quantiles over the pseudo-releases."""
    s, d = setup.plan.aggregator_scales(None), setup.plan.dim
    m, c = setup.raw_map
    lam2 = np.asarray(solve.coefficients.lam2, dtype=np.float64)
    vals, vecs = np.linalg.eigh(0.5 * (lam2 + lam2.T))
    t2 = (vecs * np.maximum(vals, solve.floor)) @ vecs.T
    t1 = -2.0 * t2 @ solve.w
    truth = m @ solve.w + c
    r1 = t1 + rng.normal(0.0, s[1], (TAIL_PSEUDO, 1, d))
    r2 = t2 + rng.normal(0.0, s[2], (TAIL_PSEUDO, 1, d, d))
    w, _ = _solves(
        r1 + rng.normal(0.0, s[1], (TAIL_PSEUDO, INNER, d)),
        r2 + rng.normal(0.0, s[2], (TAIL_PSEUDO, INNER, d, d)),
        solve.floor,
    )
    ranks = ((w @ m.T + c) <= truth).mean(axis=1)
    low, high = np.quantile(ranks, [0.025, 0.975], axis=0)
    return np.clip(low, 0.0, 0.5), np.clip(high, 0.5, 1.0)


def _at_quantiles(raw: Array, low: Array, high: Array) -> tuple[Array, Array]:
    """Per column ``j`` of ``raw`` ``(B, K)``, its ``low[j]`` and ``high[j]`` quantiles."""
    lows = [np.quantile(raw[:, j], q) for j, q in enumerate(low)]
    highs = [np.quantile(raw[:, j], q) for j, q in enumerate(high)]
    return np.asarray(lows), np.asarray(highs)


def _at_levels(raw: Array, level: Array) -> tuple[Array, Array]:
    """Per column of the draws ``raw`` ``(B, K)``, the central interval at ``level[j]``."""
    lows = [np.quantile(raw[:, j], (1.0 - q) / 2.0) for j, q in enumerate(level)]
    highs = [np.quantile(raw[:, j], (1.0 + q) / 2.0) for j, q in enumerate(level)]
    return np.asarray(lows), np.asarray(highs)


def simulate(
    name: str, reps: int, seed: int = 0, rules: tuple[str, ...] = RULES
) -> dict[str, Array]:
    """Per rule, the fraction of ``reps`` releases whose interval covers each raw coefficient's
    truth (shape ``(K,)``), ``"undetermined"``: the fraction of undetermined fits, and
    ``"<rule>_unbounded"`` for the Anderson-Rubin rules: the fraction of infinite intervals, and
    per rule and flag group ``g`` of :data:`~dpmarket.experiments.cape_coverage.FLAG_GROUPS`
    (the group of each coefficient as the curator reports it), ``"<rule>_<g>_count"`` and
    ``"<rule>_<g>_covered"`` (shape ``(K,)``, integer-valued): the releases in the group and how
    many of their intervals cover (:func:`flag_split`); per release, ``"clipped"`` (shape
    ``(reps,)``): the eigenvalues the release's floor raised (flag ``shrunk``), ``"group"``
    (shape ``(reps, K)``): each coefficient's flag group as its index in ``FLAG_GROUPS`` (-1:
    none), and ``"<rule>_hits"`` (shape ``(reps, K)``, 0 or 1): whether each interval covers."""
    setup = _setup(name)
    wanted = frozenset(rules)
    covered = {rule: np.zeros(len(setup.truth)) for rule in RULES}
    infinite = {rule: 0.0 for rule in RULES}
    finite_covered = {rule: np.zeros(len(setup.truth)) for rule in RULES}
    undetermined = 0.0
    clipped = []
    groups: list[list[str | None]] = []
    hits: dict[str, list[NDArray[np.bool_]]] = {rule: [] for rule in RULES}
    for r in range(seed, seed + reps):
        fit = _release(setup, np.random.default_rng([r, 1]))
        clipped.append(fit.clipped)
        intervals, release_groups = _intervals(setup, fit, r, wanted)
        groups.append(release_groups)
        undetermined += intervals["psd"] is not intervals["floored"]
        for rule, (low, high) in intervals.items():
            hit = (low <= setup.truth) & (setup.truth <= high)
            hits[rule].append(hit)
            covered[rule] += hit
            infinite[rule] += float(np.isinf(high).any())
            if np.isfinite(high).all():
                finite_covered[rule] += (low <= setup.truth) & (setup.truth <= high)
    return {
        **{k: v / reps for k, v in covered.items() if k in wanted},
        **{f"{k}_unbounded": np.array(v / reps) for k, v in infinite.items() if k in wanted},
        **{
            f"{k}_bounded": v / max(1.0, reps - infinite[k])
            for k, v in finite_covered.items()
            if k in wanted
        },
        "undetermined": np.array(undetermined / reps),
        "clipped": np.asarray(clipped, dtype=np.float64),
        "group": np.array(
            [[FLAG_GROUPS.index(g) if g is not None else -1 for g in row] for row in groups],
            dtype=np.float64,
        ),
        **{f"{k}_hits": np.array(v, dtype=np.float64) for k, v in hits.items() if k in wanted},
        **{
            f"{rule}_{g}_{field}": np.asarray(getattr(split[g], field), dtype=np.float64)
            for rule in RULES
            if rule in wanted
            for split in (split_by_flag(groups, np.array(hits[rule])),)
            for g in FLAG_GROUPS
            for field in ("count", "covered")
        },
    }


def flag_split(result: dict[str, Array], rule: str) -> dict[str, FlagCoverage]:
    """A rule's per-coefficient coverage conditional on the flag group, from :func:`simulate`'s
    result (its ``"<rule>_<group>_count"`` and ``"_covered"`` entries).

    Raises
    ------
    KeyError
        If ``rule`` was not scored.
    """
    return {
        g: FlagCoverage(
            g,
            tuple(int(n) for n in result[f"{rule}_{g}_count"]),
            tuple(int(n) for n in result[f"{rule}_{g}_covered"]),
        )
        for g in FLAG_GROUPS
    }


@click.command("cape-rules")
@click.option("--reps", default=200, show_default=True, type=click.IntRange(min=1))
@click.option("--case", "cases", multiple=True, type=click.Choice(sorted(CASES)), required=True)
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
@click.option(
    "--rule", "rules", multiple=True, type=click.Choice(RULES),
    help="Rules to score (default all; ``calibrated`` is the slow one).",
)  # fmt: skip
@click.option(
    "--out", type=click.Path(dir_okay=False), default=None,
    help="Also write every case's result (:func:`simulate`) to this .npz, keys '<case>/<key>'.",
)  # fmt: skip
def main(
    reps: int, cases: tuple[str, ...], seed: int, rules: tuple[str, ...], out: str | None
) -> None:
    """Per-coefficient coverage of each candidate rule on releases drawn from the noise law."""
    chosen = tuple(r for r in RULES if r in rules) if rules else RULES
    saved: dict[str, Array] = {}
    for name in cases:
        result = simulate(name, reps, seed, chosen)
        saved.update({f"{name}/{k}": v for k, v in result.items()})
        if out is not None:
            np.savez_compressed(out, **saved)  # type: ignore[arg-type]
        click.echo(
            f"{name}: {reps} releases, undetermined {100 * float(result['undetermined']):.0f} %"
            "; per coefficient (index), conditional on its flag: count: covered % "
            "[Wilson 95 %] verdict against 95 +- 3"
        )
        for rule in chosen:
            per = " ".join(f"{100 * v:5.1f}" for v in result[rule])
            extra = ""
            if rule.startswith("ar_"):
                share = float(result[f"{rule}_unbounded"])
                finite = round(reps * (1.0 - share))
                bounded = " ".join(f"{100 * v:.1f}" for v in result[f"{rule}_bounded"])
                extra = f"  (unbounded {100 * share:.1f} %" + (
                    f"; the {finite} bounded cover {bounded})" if finite else ")"
                )
            click.echo(f"  {rule:16s} {per}{extra}")
            split = flag_split(result, rule)
            for j in range(len(result[rule])):
                cells = "   ".join(f"{g} {split_cell(split[g], j)}" for g in FLAG_GROUPS)
                click.echo(f"    {j:<3d} {cells}")


if __name__ == "__main__":  # python -m dpmarket.experiments.cape_rules --case nmes-linreg
    main()
