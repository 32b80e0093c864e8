"""Tests of dpmarket.common.cape.functional_mechanism: coefficients, sensitivities on worst-case
neighbouring data sets, the PSD projection, public bounds, dp-fm and objective perturbation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpmarket.common.cape.functional_mechanism import (
    FMCoefficients,
    check_domain,
    default_floor,
    dpfm_sensitivity,
    empirical_loss,
    fm_coefficients,
    fm_objective,
    fm_sensitivities,
    functional_mechanism,
    minimize_fm,
    objective_perturbation_logistic,
    order_scales,
    pack_coefficients,
    project_psd,
    released_orders,
    scale_to_bounds,
    stacked_sensitivity,
    to_raw_coefficients,
    unpack_coefficients,
)
from dpmarket.common.cape.privacy import exact_delta, gaussian_sigma
from dpmarket.common.privacy.noise import SeededNoise

D = 6


def _ball(rng: np.random.Generator, n: int, d: int = D) -> np.ndarray:
    """Points in the unit ball, a third of them on the sphere (where the worst cases live)."""
    x = rng.standard_normal((n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    radius = np.where(rng.uniform(size=n) < 1 / 3, 1.0, rng.uniform(size=n) ** (1 / d))
    return x * radius[:, None]


def _base(rng: np.random.Generator, task: str, n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    x = _ball(rng, n)
    y = rng.uniform(-1, 1, n) if task == "linear" else rng.integers(0, 2, n).astype(float)
    return x, y


def _diffs(
    task: str, x: np.ndarray, y: np.ndarray, x_new: np.ndarray, y_new: float
) -> tuple[float, float, float]:
    """Per-order change of the coefficients when the last record is replaced."""
    x2, y2 = x.copy(), y.copy()
    x2[-1], y2[-1] = x_new, y_new
    a, b = fm_coefficients(x, y, task), fm_coefficients(x2, y2, task)  # type: ignore[arg-type]
    return (
        abs(a.lam0 - b.lam0),
        float(np.linalg.norm(a.lam1 - b.lam1)),
        float(np.linalg.norm(a.lam2 - b.lam2)),
    )


def _set_last(
    x: np.ndarray, y: np.ndarray, x_last: np.ndarray, y_last: float
) -> tuple[np.ndarray, np.ndarray]:
    x, y = x.copy(), y.copy()
    x[-1], y[-1] = x_last, y_last
    return x, y


E1, E2 = np.eye(D)[0], np.eye(D)[1]


@pytest.mark.parametrize(
    ("task", "order", "old", "new"),
    [
        ("linear", 0, (E1, 1.0), (E1, 0.0)),  # |y^2 - y'^2| = 1
        ("linear", 1, (E1, 1.0), (E1, -1.0)),  # y x - y' x' = 2 e_1
        ("linear", 2, (E1, 0.5), (E2, 0.5)),  # orthogonal unit vectors
        ("logistic", 1, (E1, 0.0), (E1, 1.0)),  # (1/2 - y) flips sign
        ("logistic", 2, (E1, 0.0), (E2, 0.0)),
    ],
)
def test_sensitivities_are_attained_by_worst_case_neighbours(
    task: str, order: int, old: tuple[np.ndarray, float], new: tuple[np.ndarray, float]
) -> None:
    rng = np.random.default_rng(order)
    x, y = _base(rng, task)
    x, y = _set_last(x, y, *old)
    n = x.shape[0]
    got = _diffs(task, x, y, *new)[order]
    assert got == pytest.approx(fm_sensitivities(task, n)[order], rel=1e-12)  # type: ignore[arg-type]


@pytest.mark.parametrize("task", ["linear", "logistic"])
def test_no_neighbour_exceeds_the_sensitivities(task: str) -> None:
    """10,000 random neighbouring pairs in the domain, half with extreme targets."""
    rng = np.random.default_rng(11)
    x, y = _base(rng, task)
    n = x.shape[0]
    bounds = fm_sensitivities(task, n)  # type: ignore[arg-type]
    orders = released_orders(task, include_constant=True)  # type: ignore[arg-type]
    unit = stacked_sensitivity(task, orders)  # type: ignore[arg-type]
    olds, news = _ball(rng, 10_000), _ball(rng, 10_000)
    if task == "linear":
        ys = np.where(
            rng.uniform(size=(10_000, 2)) < 0.5,
            np.sign(rng.uniform(-1, 1, (10_000, 2))),
            rng.uniform(-1, 1, (10_000, 2)),
        )
    else:
        ys = rng.integers(0, 2, (10_000, 2)).astype(float)
    worst = np.zeros(3)
    worst_stack = 0.0
    for k in range(10_000):
        xa, ya = _set_last(x, y, olds[k], ys[k, 0])
        d = np.array(_diffs(task, xa, ya, news[k], ys[k, 1]))
        worst = np.maximum(worst, d)
        worst_stack = max(
            worst_stack,
            math.sqrt(sum((d[j] / bounds[j]) ** 2 for j in orders if bounds[j] > 0)),
        )
    assert np.all(worst <= np.array(bounds) * (1 + 1e-12))
    assert worst_stack <= unit * (1 + 1e-12)
    assert worst[2] > 0.9 * bounds[2]  # the search gets close to the bound


@pytest.mark.parametrize("task", ["linear", "logistic"])
def test_dpfm_sensitivity_bounds_the_l1_change_of_all_monomial_coefficients(task: str) -> None:
    rng = np.random.default_rng(5)
    x, y = _base(rng, task)
    n = x.shape[0]
    iu = np.triu_indices(D)
    factor = np.where(iu[0] == iu[1], 1.0, 2.0)

    def monomials(c: FMCoefficients) -> np.ndarray:
        return np.concatenate([[c.lam0], c.lam1, factor * c.lam2[iu]])

    bound = dpfm_sensitivity(task, D, n)  # type: ignore[arg-type]
    for _ in range(2_000):
        xa, ya = _set_last(x, y, _ball(rng, 1)[0], float(y[rng.integers(n)]))
        xb, yb = _set_last(x, y, _ball(rng, 1)[0], float(y[rng.integers(n)]))
        a = monomials(fm_coefficients(xa, ya, task))  # type: ignore[arg-type]
        b = monomials(fm_coefficients(xb, yb, task))  # type: ignore[arg-type]
        assert np.abs(a - b).sum() <= bound


def test_coefficients_reproduce_the_costs() -> None:
    rng = np.random.default_rng(2)
    x, y = _base(rng, "linear", 200)
    c = fm_coefficients(x, y, "linear")
    for _ in range(5):
        w = rng.standard_normal(D)
        assert fm_objective(w, c) == pytest.approx(empirical_loss(w, x, y, "linear"), rel=1e-12)
    w_fm = minimize_fm(c, floor=default_floor(D, trace=float(np.trace(c.lam2))))
    w_ls = np.linalg.lstsq(x, y, rcond=None)[0]
    np.testing.assert_allclose(w_fm, w_ls, rtol=1e-6, atol=1e-9)
    # logistic: the second-order Taylor form log 2 + z/2 + z^2/8 - y z
    xl, yl = _base(rng, "logistic", 200)
    cl = fm_coefficients(xl, yl, "logistic")
    w = 0.3 * rng.standard_normal(D)
    z = xl @ w
    taylor = float(np.mean(math.log(2) + z / 2 + z**2 / 8 - yl * z))
    assert fm_objective(w, cl) == pytest.approx(taylor, rel=1e-12)
    assert abs(taylor - empirical_loss(w, xl, yl, "logistic")) < 1e-3  # |z| <= 0.3 sqrt(D)


def test_pack_unpack_roundtrip() -> None:
    rng = np.random.default_rng(0)
    c = FMCoefficients(0.7, rng.standard_normal(D), rng.standard_normal((D, D)))
    for orders in [(1, 2), (0, 1, 2)]:
        back = unpack_coefficients(pack_coefficients(c, orders), D, orders, lam0=0.7)
        assert back.lam0 == c.lam0
        np.testing.assert_array_equal(back.lam1, c.lam1)
        np.testing.assert_array_equal(back.lam2, c.lam2)
    with pytest.raises(ValueError, match="orders"):
        pack_coefficients(c, (2, 1))


def test_project_psd_is_the_identity_on_psd_input() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((D, D))
    psd = a @ a.T + 0.1 * np.eye(D)
    np.testing.assert_allclose(project_psd(psd), psd, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(project_psd(psd, floor=0.05), psd, rtol=1e-12, atol=1e-12)
    singular = np.outer(a[0], a[0])  # PSD with D - 1 zero eigenvalues
    np.testing.assert_allclose(project_psd(singular), singular, atol=1e-12)


def test_project_psd_makes_an_indefinite_quadratic_solvable() -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((D, D))
    indefinite = a + a.T  # eigenvalues of both signs
    assert np.linalg.eigvalsh(indefinite)[0] < 0
    p = project_psd(indefinite, floor=1e-3)
    vals = np.linalg.eigvalsh(p)
    assert vals[0] >= 1e-3 * (1 - 1e-9)
    np.testing.assert_allclose(project_psd(p, floor=1e-3), p, atol=1e-12)  # idempotent
    # the nearest such matrix in Frobenius norm: eigenvalues above the floor are untouched
    sym_vals = np.linalg.eigvalsh(indefinite)
    np.testing.assert_allclose(vals, np.maximum(sym_vals, 1e-3), atol=1e-10)
    w = minimize_fm(FMCoefficients(0.0, rng.standard_normal(D), indefinite), floor=1e-3)
    assert np.all(np.isfinite(w))
    with pytest.raises(ValueError, match="floor"):
        minimize_fm(FMCoefficients(0.0, np.zeros(D), indefinite), floor=0.0)


def test_scale_to_bounds_maps_into_the_domain() -> None:
    rng = np.random.default_rng(3)
    bounds = np.array([[0.0, 10.0], [-5.0, 5.0], [100.0, 200.0]])
    x = rng.uniform(bounds[:, 0], bounds[:, 1], size=(500, 3))
    x[0] = bounds[:, 0]
    x[1] = bounds[:, 1]
    y = rng.uniform(20.0, 40.0, 500)
    xs, ys = scale_to_bounds(x, y, bounds, [20.0, 40.0])
    assert np.all(np.linalg.norm(xs, axis=1) <= 1 + 1e-12)
    np.testing.assert_allclose(np.abs(xs[:2]), 1 / math.sqrt(3))
    assert ys.min() >= -1 and ys.max() <= 1
    check_domain(xs, ys, "linear")
    # a model on the scaled data predicts the same values in raw units
    w = rng.standard_normal(3)
    coef, intercept = to_raw_coefficients(w, bounds, [20.0, 40.0])
    np.testing.assert_allclose(x @ coef + intercept, 20.0 + 10.0 * (xs @ w + 1.0), rtol=1e-12)


def test_values_outside_the_public_bounds_raise_and_name_the_cell() -> None:
    bounds = [[0.0, 1.0], [0.0, 1.0]]
    x = np.array([[0.5, 0.5], [0.2, 1.5], [0.1, 0.1]])
    with pytest.raises(ValueError, match="row 1, column 1"):
        scale_to_bounds(x, np.zeros(3), bounds, [-1.0, 1.0])
    x[1, 1] = 0.5
    with pytest.raises(ValueError, match="target value out of bounds at row 2"):
        scale_to_bounds(x, np.array([0.0, 0.0, 3.0]), bounds, [-1.0, 1.0])
    with pytest.raises(ValueError, match="label at row 0"):
        scale_to_bounds(x, np.array([2.0, 0.0, 1.0]), bounds, None, task="logistic")
    with pytest.raises(ValueError, match="lo < hi"):
        scale_to_bounds(x, np.zeros(3), [[0.0, 1.0], [1.0, 1.0]], [-1.0, 1.0])
    with pytest.raises(ValueError, match="row 0 has"):
        check_domain(np.array([[1.0, 1.0]]), np.zeros(1), "linear")


@pytest.mark.parametrize("task", ["linear", "logistic"])
def test_functional_mechanism_noise_has_the_calibrated_scale(task: str) -> None:
    """The released coefficients' noise has the stated std (chi-square, failure 1e-6), and the
    stacked release is (epsilon, delta)-DP by the exact Gaussian profile."""
    rng = np.random.default_rng(4)
    x, y = _base(rng, task, 300)
    eps, delta = 0.8, 1e-5
    orders = released_orders(task)  # type: ignore[arg-type]
    unit = stacked_sensitivity(task, orders)  # type: ignore[arg-type]
    kappa = gaussian_sigma(eps, delta, unit)
    assert exact_delta(eps, (unit / kappa) ** 2 / 2, unit / kappa) <= delta
    scales = order_scales(kappa, task, 300, orders)  # type: ignore[arg-type]
    exact = fm_coefficients(x, y, task)  # type: ignore[arg-type]
    res1, res2 = [], []
    for seed in range(40):
        rel = functional_mechanism(x, y, task, eps, delta, SeededNoise(np.random.default_rng(seed)))  # type: ignore[arg-type]
        assert rel.scales == pytest.approx(scales)
        res1.append((rel.coefficients.lam1 - exact.lam1) / scales[1])
        res2.append((rel.coefficients.lam2 - exact.lam2).ravel() / scales[2])
        assert np.all(np.isfinite(rel.w))
    for res in (np.concatenate(res1), np.concatenate(res2)):
        n = res.shape[0]
        stat = float(np.sum(res**2))
        assert stats.chi2.ppf(5e-7, n) <= stat <= stats.chi2.isf(5e-7, n)


def test_paper_calibration_is_per_order() -> None:
    rng = np.random.default_rng(6)
    x, y = _base(rng, "linear", 100)
    rel = functional_mechanism(
        x, y, "linear", 0.5, 1e-5, SeededNoise(rng), calibration="paper", include_constant=True
    )
    c = math.sqrt(2 * math.log(1.25 / 1e-5)) / 0.5
    assert rel.scales == pytest.approx({0: c / 100, 1: 4 * c / 100, 2: math.sqrt(2) * c / 100})


def test_objective_perturbation_logistic() -> None:
    rng = np.random.default_rng(8)
    n = 4_000
    w_true = np.array([3.0, -2.0, 1.0, 0.0, 0.0, 0.5])
    x = _ball(rng, n) * 0.9
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(x @ w_true)))).astype(float)
    w_big = objective_perturbation_logistic(x, y, 1e4, reg=1e-3, rng=np.random.default_rng(0))
    w_small = objective_perturbation_logistic(x, y, 0.1, reg=1e-3, rng=np.random.default_rng(0))
    assert np.all(np.isfinite(w_big)) and np.all(np.isfinite(w_small))
    # with a huge epsilon it is the regularized logistic regression
    from scipy.optimize import minimize

    z = 2 * y - 1

    def obj(w: np.ndarray) -> float:
        return float(np.mean(np.logaddexp(0, -z * (x @ w))) + 0.5e-3 * w @ w)

    w_ref = minimize(obj, np.zeros(D), method="BFGS").x
    np.testing.assert_allclose(w_big, w_ref, atol=2e-2)
    assert np.linalg.norm(w_small - w_ref) > np.linalg.norm(w_big - w_ref)
