"""What the candidates method's gap to greedy is made of, measured on the design half.

Two causes, each idea measured without noise first:

(a) **privacy at small m** -- the validation embedding ``gtilde = g + N(0, sigma^2 I_d)``, with
    ``sigma = sigma_u(epsilon, delta) * 2 / m``, against the signal it must carry; how much a
    release in fewer, data-independent directions (the ``r`` random features of lowest frequency)
    or a vote of the validation points on each owner's own uniform sample would carry;
(b) **proposals that do not complement each other** -- each owner's local greedy matches D_v as a
    whole; an oracle lets owners propose against the residual of what was chosen so far (a second
    wave guided by the first, or several rounds), or lets the budget follow measured gains.

This module re-enacts the candidates method's structure in one process with the project's own
kernels (:func:`~dpmarket.common.summarization.kernels.embedding_greedy` for an owner's local
greedy, :func:`~dpmarket.common.summarization.kernels.exact_kernel_summary` for the curator's
re-ranking, :func:`~dpmarket.common.summarization.candidates.allocate_candidates` for the split),
so that each ingredient can be replaced by an oracle; it never changes the method's code and
releases nothing (a laboratory, not a protocol: the oracles read what a deployment could not).

Every variant reads at most ``3p`` owner points (the default's budget) and returns the curator's
exact re-ranking of what it read, or the uniform sample when that is closer to D_v (the
default's hedge), measured by its own MMD² to D_v over exact greedy's.

``python -m dpmarket.experiments.suite_diagnosis --seeds 3 --out out/diagnosis`` runs it on the
design half (it refuses a held-out scenario) and writes ``diagnosis.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.privacy.accounting import analytic_gaussian_sigma
from dpmarket.common.summarization.candidates import (
    allocate_candidates,
    relevance_threshold,
    shrink_embedding,
    validation_embedding,
    validation_embedding_sensitivity,
)
from dpmarket.common.summarization.kernels import (
    embedding_greedy,
    exact_kernel_summary,
    mmd2,
    rff_greedy,
)
from dpmarket.common.summarization.rff import draw_rff_params, random_fourier_features
from dpmarket.common.summarization.sketch_allocation import shrink_decision, split_gaussian_sigmas
from dpmarket.experiments.scenarios import Scenario
from dpmarket.experiments.suite import exact_greedy_reference, suite_scenario
from dpmarket.experiments.suite_split import require_design

__all__ = ["NOISE_FREE_VARIANTS", "NOISY_TARGETS", "Lab", "run_diagnosis", "signal_report"]

#: The candidates method's constants the laboratory re-enacts (the session's defaults).
D = 140
BUDGET_MULTIPLE = 3
RELEVANCE_KAPPA = 0.5
EPSILON = 1.0
DELTA = 1e-6
#: Numbers of low-frequency random features of the lower-dimensional release.
LOW_DIMENSIONS = (10, 20, 40)


def _split_evenly(total: int, capacities: Sequence[int]) -> list[int]:
    """p/K per owner within capacities (as the uniform method; the curator's split_evenly)."""
    shares = [0] * len(capacities)
    remaining = total
    open_ = [i for i, c in enumerate(capacities) if c > 0]
    while remaining > 0 and open_:
        each, extra = divmod(remaining, len(open_))
        for rank, i in enumerate(list(open_)):
            give = min(each + (1 if rank < extra else 0), capacities[i] - shares[i])
            shares[i] += give
            remaining -= give
        open_ = [i for i in open_ if shares[i] < capacities[i]]
    return shares


@dataclass
class Lab:
    """One scenario and session seed: h1 as the session draws it, every owner's features, the
    uniform sample, and the curator's exact re-ranking.

    Parameters
    ----------
    scenario : Scenario
    seed : int
        The session seed: h1's parameters are ``draw_rff_params`` from ``default_rng(seed)`` (as a
        session draws them); the uniform sample and the noise come from ``default_rng(seed + 1)``.
    exact_mmd2 : float
        Exact greedy's MMD² to D_v (the ratios' denominator).
    exact_index : ndarray of shape (p,), int64
        Exact greedy's points (indices into the pooled owners' points).
    """

    scenario: Scenario
    seed: int
    exact_mmd2: float
    exact_index: NDArray[np.int64]
    features: list[NDArray[np.float32]] = field(init=False)
    g: NDArray[np.float64] = field(init=False)

    def __post_init__(self) -> None:
        s = self.scenario
        self.params = draw_rff_params(s.n_features, D, s.gamma, np.random.default_rng(self.seed))
        self.features = [random_fourier_features(o.features, self.params) for o in s.owners]
        self.val_features = random_fourier_features(s.validation, self.params, dtype=np.float64)
        self.g = validation_embedding(self.val_features)
        self.p = s.default_p
        self.sizes = [o.n_points for o in s.owners]
        self.rng = np.random.default_rng(self.seed + 1)
        shares = _split_evenly(self.p, self.sizes)
        self.uniform = [
            np.sort(self.rng.choice(n, k, replace=False)) if k else np.zeros(0, np.int64)
            for n, k in zip(self.sizes, shares, strict=True)
        ]
        self.sigma = analytic_gaussian_sigma(
            EPSILON, DELTA, validation_embedding_sensitivity(s.validation.shape[0])
        )
        owner_of = np.concatenate([np.full(n, k) for k, n in enumerate(self.sizes)])
        self.exact_owner_counts = np.bincount(owner_of[self.exact_index], minlength=self.k)

    # ------------------------------------------------------------------ building blocks
    @property
    def k(self) -> int:
        """Number of owners."""
        return len(self.sizes)

    def points(self, picks: Mapping[int, NDArray[np.int64]]) -> NDArray[np.float64]:
        """The raw points of ``{owner: indices}``, in owner order."""
        parts = [self.scenario.owners[i].features[picks[i]] for i in sorted(picks) if picks[i].size]
        return np.concatenate(parts)

    def rerank(
        self, picks: Mapping[int, NDArray[np.int64]], *, hedge: bool = True
    ) -> tuple[float, dict[int, NDArray[np.int64]]]:
        """The curator's choice of p among what it read (exact greedy then exchanges), or the
        uniform sample when closer: its MMD² and the chosen points as ``{owner: indices}``."""
        owners = [i for i in sorted(picks) if picks[i].size]
        pool = self.points(picks)
        owner_of = np.concatenate([np.full(picks[i].size, i) for i in owners])
        index = np.concatenate([picks[i] for i in owners])
        order = exact_kernel_summary(pool, self.scenario.validation, self.p, self.scenario.gamma)
        value = mmd2(pool[order], self.scenario.validation, self.scenario.gamma)
        if hedge:
            sample = self.points(dict(enumerate(self.uniform)))
            value = min(value, mmd2(sample, self.scenario.validation, self.scenario.gamma))
        chosen = {i: index[order][owner_of[order] == i] for i in owners}
        return value, chosen

    def greedy(
        self,
        owner: int,
        target: NDArray[np.float64],
        count: int,
        *,
        start: NDArray[np.float64] | None,
        sent: NDArray[np.int64],
        columns: NDArray[np.int64] | None = None,
        space: Sequence[NDArray[np.float32]] | None = None,
        top: bool = False,
    ) -> NDArray[np.int64]:
        """Owner ``owner``'s local greedy: ``count`` unsent points matching ``target``,
        continuing from ``start`` (feature rows counted in q), on the h1 ``columns`` given, or
        in another feature ``space`` (one array per owner); with ``top``, its ``count`` unsent
        points of largest score ``target . h1(x)`` instead (no repulsion)."""
        f = (self.features if space is None else space)[owner]
        if columns is not None:
            f = np.ascontiguousarray(f[:, columns])
        count = min(count, self.sizes[owner] - sent.size)
        if count <= 0:
            return np.zeros(0, np.int64)
        exclude = np.zeros(self.sizes[owner], dtype=bool)
        exclude[sent] = True
        if top:
            scores = f.astype(np.float64) @ target
            scores[exclude] = -np.inf
            return np.argsort(-scores, kind="stable")[:count]
        seed = np.zeros((0, f.shape[1])) if start is None else start
        return embedding_greedy(f, target, seed, count, exclude=exclude)

    def other_space(
        self, gamma_factor: float, d: int
    ) -> tuple[list[NDArray[np.float32]], NDArray[np.float64]]:
        """Every owner's features and D_v's embedding under another public random-feature map:
        ``d`` features of the kernel ``exp(-gamma_factor * gamma ||x - y||^2)``, drawn from
        ``default_rng(seed + 2)`` (data independent)."""
        s = self.scenario
        rng = np.random.default_rng(self.seed + 2)
        params = draw_rff_params(s.n_features, d, gamma_factor * s.gamma, rng)
        space = [random_fourier_features(o.features, params) for o in s.owners]
        val = random_fourier_features(s.validation, params, dtype=np.float64)
        return space, validation_embedding(val)

    def relevance_counts(self, target: NDArray[np.float64], sigma: float = 0.0) -> np.ndarray:
        """Each owner's count of points scoring at least ``kappa ||g||^2`` (the counts path's
        allocation weights, without their Laplace noise)."""
        threshold = relevance_threshold(target, RELEVANCE_KAPPA, noise_sigma=sigma)
        direction = target.astype(np.float32)
        return np.array([float((f @ direction >= threshold).sum()) for f in self.features])

    def split(self, budget: int, weights: np.ndarray, taken: Sequence[int]) -> np.ndarray:
        """``budget`` points in proportion to ``weights`` within each owner's unsent points."""
        caps = [n - t for n, t in zip(self.sizes, taken, strict=True)]
        return allocate_candidates(budget, np.maximum(weights, 0.0), caps, even_share=0.0)

    def one_wave(
        self,
        weights: np.ndarray,
        target: Callable[[int], NDArray[np.float64]] | None = None,
        *,
        hedge: bool = True,
        columns: NDArray[np.int64] | None = None,
        space: Sequence[NDArray[np.float32]] | None = None,
        top: bool = False,
        hedge_size: int | None = None,
    ) -> float:
        """Today's structure: the uniform sample (``hedge``; ``hedge_size`` of its points, all
        p by default, and the fallback to it only when it has p), the rest of the 3p budget in
        proportion to ``weights``, each owner's local greedy against its ``target(owner)``
        (default g) continuing from its uniform points (in h1, its ``columns``, or another
        feature ``space``)."""
        size = (self.p if hedge_size is None else hedge_size) if hedge else 0
        uniform = self.hedge(size)
        budget = BUDGET_MULTIPLE * self.p - size
        shares = self.split(budget, weights, [u.size for u in uniform])
        picks: dict[int, NDArray[np.int64]] = {}
        for i in range(self.k):
            t = self.g if target is None else target(i)
            f = (self.features if space is None else space)[i]
            f = f if columns is None else f[:, columns]
            start = f[uniform[i]].astype(np.float64)
            new = self.greedy(
                i,
                t,
                int(shares[i]),
                start=start,
                sent=uniform[i],
                columns=columns,
                space=space,
                top=top,
            )
            picks[i] = np.concatenate([uniform[i], new])
        return self.rerank(picks, hedge=size == self.p)[0]

    def hedge(self, size: int) -> list[NDArray[np.int64]]:
        """The first ``size`` points of the uniform sample, split evenly among owners."""
        shares = _split_evenly(size, [u.size for u in self.uniform])
        return [u[:k] for u, k in zip(self.uniform, shares, strict=True)]

    def votes(self, picks: Mapping[int, NDArray[np.int64]]) -> np.ndarray:
        """How many validation points have their nearest read point (exact kernel) at each
        owner."""
        owners = [i for i in sorted(picks) if picks[i].size]
        pool = self.points(picks)
        owner_of = np.concatenate([np.full(picks[i].size, i) for i in owners])
        v = self.scenario.validation
        d2 = (v**2).sum(1)[:, None] + (pool**2).sum(1)[None, :] - 2 * v @ pool.T
        return np.bincount(owner_of[np.argmin(d2, axis=1)], minlength=self.k).astype(float)

    def useful(self, picks: Mapping[int, NDArray[np.int64]], scale: float) -> np.ndarray:
        """Per owner, how many of its read points are useful: each point counts
        ``clip((mean_v k(x, v) / scale - 1/4) / (1/2), 0, 1)`` (exact kernel; ``scale`` the
        typical kernel mean of a validation point, ``||g||^2``). No competition between owners:
        a point's credit depends on D_v and on the point only."""
        out = np.zeros(self.k)
        v, gamma = self.scenario.validation, self.scenario.gamma
        for i in sorted(picks):
            if picks[i].size == 0:
                continue
            x = self.scenario.owners[i].features[picks[i]]
            d2 = (x**2).sum(1)[:, None] + (v**2).sum(1)[None, :] - 2 * x @ v.T
            mean = np.exp(-gamma * np.maximum(d2, 0.0)).mean(axis=1)
            out[i] = np.clip((mean / max(scale, 1e-12) - 0.25) / 0.5, 0.0, 1.0).sum()
        return out

    def two_waves(self, first: float, allocation: str, *, hedge_size: int | None = None) -> float:
        """The uniform sample (``hedge_size`` points, p by default), a first wave of
        ``first`` of the targeted budget split by the relevance counts, then the rest split by
        what the first wave showed: ``"gains"``, each owner's points in the curator's re-ranked
        summary; ``"votes"``, the validation points whose nearest read point is the owner's.
        Each owner's local greedy continues from its own points read so far, against g."""
        size = self.p if hedge_size is None else hedge_size
        uniform = self.hedge(size)
        budget = BUDGET_MULTIPLE * self.p - size
        one = round(first * budget)
        shares = self.split(one, self.relevance_counts(self.g), [u.size for u in uniform])
        picks: dict[int, NDArray[np.int64]] = {}
        for i in range(self.k):
            start = self.features[i][uniform[i]].astype(np.float64)
            new = self.greedy(i, self.g, int(shares[i]), start=start, sent=uniform[i])
            picks[i] = np.concatenate([uniform[i], new])
        if allocation == "gains":
            _, chosen = self.rerank(picks, hedge=False)
            weights = np.array([chosen.get(i, np.zeros(0)).size for i in range(self.k)], float)
        elif allocation == "useful":
            weights = self.useful(picks, float(self.g @ self.g))
        else:
            weights = self.votes(picks)
        taken = [picks[i].size for i in range(self.k)]
        shares = self.split(budget - one, weights, taken)
        for i in range(self.k):
            start = self.features[i][picks[i]].astype(np.float64)
            new = self.greedy(i, self.g, int(shares[i]), start=start, sent=picks[i])
            picks[i] = np.concatenate([picks[i], new])
        return self.rerank(picks, hedge=size == self.p)[0]

    def noisy_two_waves(
        self,
        first: float,
        *,
        hedge_size: int,
        vote_share: float = 0.5,
        shrink_target: bool = False,
        second: bool = True,
        useful: bool = False,
    ) -> float:
        """:meth:`two_waves` (``"votes"``) with every release about D_v noised at epsilon 1 (the
        owners' counts at epsilon 1 too): gtilde and the noisy votes share the validation
        party's budget (``vote_share`` of it to the votes; Gaussian composition), the counts
        carry Laplace(1) noise, the decision is shrunk towards the even split as the sketch
        allocation's; each owner follows gtilde as released (or, with ``shrink_target``, shrunk
        towards its own mean, as by default). ``second=False``: one wave, the default structure at
        epsilon 1 (all of D_v's budget on gtilde). The votes' sensitivity is the D_v part only
        (sqrt(2)/m); their sensitivity to the owners' read points is not bounded here."""
        m = self.scenario.validation.shape[0]
        sens_g = validation_embedding_sensitivity(m)
        if second:
            sigma_g, sigma_v = split_gaussian_sigmas(
                EPSILON, DELTA, [sens_g, math.sqrt(2.0) / m], [1 - vote_share, vote_share]
            )
        else:
            sigma_g, sigma_v = analytic_gaussian_sigma(EPSILON, DELTA, sens_g), 0.0
        noisy = self.g + self.rng.normal(0.0, sigma_g, D)
        means = [f.mean(axis=0, dtype=np.float64) for f in self.features]

        def target(i: int) -> NDArray[np.float64]:
            return shrink_embedding(noisy, means[i], sigma_g)[0] if shrink_target else noisy

        uniform = self.hedge(hedge_size)
        budget = BUDGET_MULTIPLE * self.p - hedge_size
        one = round(first * budget) if second else budget
        counts = self.relevance_counts(noisy, sigma_g) + self.rng.laplace(0.0, 1.0, self.k)
        shares = self.split(one, counts, [u.size for u in uniform])
        picks: dict[int, NDArray[np.int64]] = {}
        for i in range(self.k):
            start = self.features[i][uniform[i]].astype(np.float64)
            new = self.greedy(i, target(i), int(shares[i]), start=start, sent=uniform[i])
            picks[i] = np.concatenate([uniform[i], new])
        if second and useful:
            # Sensitivity to D_v: every read point's credit moves by at most 1 / (m * 0.5 *
            # scale) (scale from the release: post-processing); to an owner's data: 1.
            scale = max(float(noisy @ noisy) - D * sigma_g**2, 1e-3)
            sizes = np.array([picks[i].size for i in range(self.k)], float)
            sens = float(np.linalg.norm(sizes)) / (m * 0.5 * scale)
            sigma_u = sigma_v * m / math.sqrt(2.0)  # the share's unit noise
            credit = self.useful(picks, scale)
            decision = (
                credit
                + self.rng.normal(0.0, sigma_u * sens, self.k)
                + self.rng.laplace(0.0, 1.0, self.k)
            )
        elif second:
            votes = self.votes(picks) / m + self.rng.normal(0.0, sigma_v, self.k)
            decision, _ = shrink_decision(votes, sigma_v)
        if second:
            taken = [picks[i].size for i in range(self.k)]
            shares = self.split(budget - one, np.maximum(decision, 0.0), taken)
            for i in range(self.k):
                start = self.features[i][picks[i]].astype(np.float64)
                new = self.greedy(i, target(i), int(shares[i]), start=start, sent=picks[i])
                picks[i] = np.concatenate([picks[i], new])
        return self.rerank(picks, hedge=hedge_size == self.p)[0]

    def mean_votes(self, norm_weight: float = 0.25) -> np.ndarray:
        """The sketch allocation's noise-free decision with exact h1 means instead of sketches:
        each validation point votes for the owner minimising ``w ||mu_k||^2 - 2 mu_k . h1(v)``."""
        means = np.stack([f.mean(axis=0, dtype=np.float64) for f in self.features])
        score = 2 * self.val_features @ means.T - norm_weight * (means**2).sum(1)[None, :]
        return np.bincount(np.argmax(score, axis=1), minlength=self.k).astype(float)

    def waves(self, rounds: int, allocation: str) -> float:
        """The uniform sample, then ``rounds`` waves sharing the other 2p reads: each owner's
        local greedy continues from the curator's current summary (the residual of what every
        owner proposed so far, released exactly: an oracle), the wave's budget split by the
        relevance counts (``"counts"``), by how many of each owner's points the current summary
        holds (``"gains"``), or given to the best bids across owners (``"auction"``: each
        owner's greedy scores, read exactly)."""
        picks = {i: self.uniform[i].copy() for i in range(self.k)}
        _, chosen = self.rerank(picks, hedge=False)
        counts = self.relevance_counts(self.g)
        total = (BUDGET_MULTIPLE - 1) * self.p
        per_wave = [total // rounds + (1 if r < total % rounds else 0) for r in range(rounds)]
        for budget in per_wave:
            start = self.points(chosen)
            start_h1 = random_fourier_features(start, self.params, dtype=np.float64).astype(
                np.float64
            )
            taken = [picks[i].size for i in range(self.k)]
            if allocation == "auction":
                shares = self._auction(budget, start_h1, picks)
            else:
                if allocation == "gains":
                    weights = np.array([chosen.get(i, np.zeros(0)).size for i in range(self.k)])
                    weights = weights.astype(np.float64)
                else:
                    weights = counts
                shares = self.split(budget, weights if weights.sum() > 0 else counts, taken)
            for i in range(self.k):
                new = self.greedy(i, self.g, int(shares[i]), start=start_h1, sent=picks[i])
                picks[i] = np.concatenate([picks[i], new])
            _, chosen = self.rerank(picks, hedge=False)
        return self.rerank(picks)[0]

    def _auction(
        self, budget: int, start_h1: NDArray[np.float64], picks: Mapping[int, NDArray[np.int64]]
    ) -> np.ndarray:
        """Shares that give the wave's reads to the largest exact bids across owners: each owner
        ranks ``budget`` proposals by its greedy, and the curator takes the best bids."""
        bids: list[tuple[float, int]] = []
        for i in range(self.k):
            new = self.greedy(i, self.g, budget, start=start_h1, sent=picks[i])
            q = start_h1.shape[0]
            direction = self.g - q / (q + 1) * start_h1.mean(axis=0)
            scores = self.features[i][new].astype(np.float64) @ direction
            bids += [(float(s), i) for s in scores]
        best = sorted(bids, reverse=True)[:budget]
        return np.bincount([i for _, i in best], minlength=self.k)


# ---------------------------------------------------------------------- the noise-free variants
def _today(lab: Lab) -> float:
    return lab.one_wave(lab.relevance_counts(lab.g))


def _today_no_hedge(lab: Lab) -> float:
    return lab.one_wave(lab.relevance_counts(lab.g), hedge=False)


def _oracle_allocation(lab: Lab) -> float:
    return lab.one_wave(lab.exact_owner_counts.astype(np.float64))


def _oracle_allocation_no_hedge(lab: Lab) -> float:
    return lab.one_wave(lab.exact_owner_counts.astype(np.float64), hedge=False)


def _two(first: float, allocation: str, hedge: int | None = None) -> Callable[[Lab], float]:
    def run(lab: Lab) -> float:
        return lab.two_waves(
            first, allocation, hedge_size=None if hedge is None else hedge * lab.p // 2
        )

    return run


def _wave(rounds: int, allocation: str) -> Callable[[Lab], float]:
    return lambda lab: lab.waves(rounds, allocation)


def _rff_greedy(lab: Lab) -> float:
    pool = np.concatenate(lab.features)
    chosen = rff_greedy(pool, lab.val_features, np.zeros((0, D)), lab.p)
    points = np.concatenate([o.features for o in lab.scenario.owners])[chosen]
    return mmd2(points, lab.scenario.validation, lab.scenario.gamma)


#: The noise-free variants, each a function of a :class:`Lab` returning an MMD² to D_v.
NOISE_FREE_VARIANTS: dict[str, Callable[[Lab], float]] = {
    "RFF greedy (pooled, reads all)": _rff_greedy,
    "today: hedge + counts, one wave": _today,
    "today without the hedge": _today_no_hedge,
    "oracle allocation (exact greedy's owners)": _oracle_allocation,
    "oracle allocation without the hedge": _oracle_allocation_no_hedge,
    "today, hedge p/2": lambda lab: lab.one_wave(
        lab.relevance_counts(lab.g), hedge_size=lab.p // 2
    ),
    "sketch-like votes (exact means)": lambda lab: lab.one_wave(lab.mean_votes()),
    "oracle allocation, hedge p/2": lambda lab: lab.one_wave(
        lab.exact_owner_counts.astype(np.float64), hedge_size=lab.p // 2
    ),
    "2 waves (1/2 + 1/2), gains": _two(0.5, "gains"),
    "2 waves (1/2 + 1/2), votes": _two(0.5, "votes"),
    "2 waves (1/4 + 3/4), votes": _two(0.25, "votes"),
    "2 waves (1/2 + 1/2), votes, hedge p/2": _two(0.5, "votes", 1),
    "2 waves (1/2 + 1/2), gains, hedge p/2": _two(0.5, "gains", 1),
    "2 waves (1/2 + 1/2), useful counts, hedge p/2": _two(0.5, "useful", 1),
    "2 waves (1/2 + 1/2), useful counts": _two(0.5, "useful"),
    "2 waves, residual, counts": _wave(2, "counts"),
    "2 waves, residual, gains": _wave(2, "gains"),
    "4 waves, residual, gains": _wave(4, "gains"),
    "2 waves, residual, auction": _wave(2, "auction"),
    "4 waves, residual, auction": _wave(4, "auction"),
}


# ---------------------------------------------------------------------- (a) the noisy targets
def _low_columns(lab: Lab, r: int) -> NDArray[np.int64]:
    """The ``r`` random features of lowest frequency ``||omega_j||`` (public, data
    independent)."""
    return np.sort(np.argsort(np.linalg.norm(lab.params.omega, axis=1), kind="stable")[:r])


def _noisy(lab: Lab, size: int, sigma: float) -> NDArray[np.float64]:
    return lab.rng.normal(0.0, sigma, size)


def _target_raw(lab: Lab) -> float:
    noisy = lab.g + _noisy(lab, D, lab.sigma)
    return lab.one_wave(lab.relevance_counts(lab.g), lambda _i: noisy)


def _target_js_own(lab: Lab) -> float:
    """Today's owner prior: James-Stein towards the owner's own mean h1 (Euclidean form)."""
    noisy = lab.g + _noisy(lab, D, lab.sigma)
    means = [f.mean(axis=0, dtype=np.float64) for f in lab.features]
    return lab.one_wave(
        lab.relevance_counts(lab.g), lambda i: shrink_embedding(noisy, means[i], lab.sigma)[0]
    )


def _target_low(r: int) -> Callable[[Lab], float]:
    def run(lab: Lab) -> float:
        columns = _low_columns(lab, r)
        # Every row's unit norm is kept: the sub-vector's sensitivity is still 2 / m.
        noisy = lab.g[columns] + _noisy(lab, r, lab.sigma)
        return lab.one_wave(lab.relevance_counts(lab.g), lambda _i: noisy, columns=columns)

    return run


def _target_other(gamma_factor: float, d: int, *, top: bool = False) -> Callable[[Lab], float]:
    def run(lab: Lab) -> float:
        space, g = lab.other_space(gamma_factor, d)
        noisy = g + _noisy(lab, d, lab.sigma)  # unit-norm rows: sensitivity 2 / m again
        return lab.one_wave(lab.relevance_counts(lab.g), lambda _i: noisy, space=space, top=top)

    return run


def _target_top(lab: Lab) -> float:
    noisy = lab.g + _noisy(lab, D, lab.sigma)
    return lab.one_wave(lab.relevance_counts(lab.g), lambda _i: noisy, top=True)


def _target_other_js(gamma_factor: float, d: int) -> Callable[[Lab], float]:
    def run(lab: Lab) -> float:
        space, g = lab.other_space(gamma_factor, d)
        noisy = g + _noisy(lab, d, lab.sigma)
        means = [f.mean(axis=0, dtype=np.float64) for f in space]
        return lab.one_wave(
            lab.relevance_counts(lab.g),
            lambda i: shrink_embedding(noisy, means[i], lab.sigma)[0],
            space=space,
        )

    return run


def _other_exact(lab: Lab, gamma_factor: float) -> float:
    space, g = lab.other_space(gamma_factor, D)
    return lab.one_wave(lab.relevance_counts(lab.g), lambda _i: g, space=space)


def _target_wiener(lab: Lab) -> float:
    """The owner's empirical-Bayes (Wiener) filter: with the prior ``g ~ N(mu_k, tau^2 C_k)``
    (``mu_k``, ``C_k``: the mean and covariance of the owner's own h1 rows) and the release's
    noise ``N(0, sigma^2 I)``, the posterior mean ``mu_k + tau^2 C_k (tau^2 C_k + sigma^2
    I)^-1 (gtilde - mu_k)``, with ``tau^2 = max(0, ||gtilde - mu_k||^2 - d sigma^2) / tr C_k``
    (method of moments). James-Stein is its isotropic case (``C_k = I``). Post-processing at the
    owner: no privacy cost."""
    noisy = lab.g + _noisy(lab, D, lab.sigma)
    targets = []
    for f in lab.features:
        x = f.astype(np.float64)
        mu = x.mean(axis=0)
        cov = np.cov(x, rowvar=False)
        diff = noisy - mu
        tau2 = max(0.0, float(diff @ diff) - D * lab.sigma**2) / max(float(np.trace(cov)), 1e-12)
        if tau2 == 0.0:
            targets.append(mu)
            continue
        values, vectors = np.linalg.eigh(cov)
        gain = tau2 * np.maximum(values, 0.0) / (tau2 * np.maximum(values, 0.0) + lab.sigma**2)
        targets.append(mu + vectors @ (gain * (vectors.T @ diff)))
    return lab.one_wave(lab.relevance_counts(lab.g), lambda i: targets[i])


def _target_cells(bits: int) -> Callable[[Lab], float]:
    """A release in a coarser, lower-dimensional feature map: the public domain cut into
    ``2^bits`` cells by random hyperplanes through its centre (data independent), the noisy
    histogram of D_v over the cells (one-hot rows: L2 sensitivity sqrt(2)/m), and each owner's
    target the histogram-weighted mean h1 of its own points cell by cell."""

    def run(lab: Lab) -> float:
        s = lab.scenario
        assert s.domain_low is not None and s.domain_high is not None
        centre = (s.domain_low + s.domain_high) / 2
        normals = np.random.default_rng(lab.seed + 3).normal(size=(bits, s.n_features))
        weights = 2 ** np.arange(bits)

        def cell(x: NDArray[np.float64]) -> NDArray[np.int64]:
            return ((x - centre) @ normals.T > 0).astype(np.int64) @ weights

        m = s.validation.shape[0]
        sigma = analytic_gaussian_sigma(EPSILON, DELTA, math.sqrt(2.0) / m)
        hist = np.bincount(cell(s.validation), minlength=2**bits) / m
        noisy = np.maximum(hist + _noisy(lab, 2**bits, sigma), 0.0)
        targets = []
        for owner, f in zip(s.owners, lab.features, strict=True):
            cells = cell(owner.features)
            w = noisy[cells]
            counts = np.bincount(cells, minlength=2**bits)[cells]
            w = w / counts  # each cell's weight spread over the owner's points in it
            targets.append((w @ f.astype(np.float64)) / w.sum() if w.sum() > 0 else f.mean(axis=0))
        return lab.one_wave(lab.relevance_counts(lab.g), lambda i: targets[i])

    return run


def _oracle_raw(lab: Lab) -> float:
    """The oracle allocation (exact greedy's owners) with half the hedge, each owner following
    gtilde as released at epsilon 1: what a perfect allocation leaves of the target's noise."""
    noisy = lab.g + _noisy(lab, D, lab.sigma)
    weights = lab.exact_owner_counts.astype(np.float64)
    return lab.one_wave(weights, lambda _i: noisy, hedge_size=lab.p // 2)


def _target_votes(lab: Lab) -> float:
    """Each validation point votes for the nearest of each owner's own uniform points (one
    vote per owner, so a validation point moves K one-hot vectors: L2 sensitivity sqrt(2K)/m);
    owner k's target is the noisy vote-weighted mean h1 of its own uniform points."""
    m = lab.scenario.validation.shape[0]
    sigma = analytic_gaussian_sigma(EPSILON, DELTA, math.sqrt(2 * lab.k) / m)
    targets = []
    for i in range(lab.k):
        u = lab.features[i][lab.uniform[i]].astype(np.float64)
        if u.shape[0] == 0:
            targets.append(lab.g * 0)
            continue
        near = np.argmax(lab.val_features @ u.T, axis=1)
        votes = np.bincount(near, minlength=u.shape[0]) / m + _noisy(lab, u.shape[0], sigma)
        w = np.maximum(votes, 0.0)
        targets.append(w @ u / w.sum() if w.sum() > 0 else u.mean(axis=0))
    return lab.one_wave(lab.relevance_counts(lab.g), lambda i: targets[i])


#: The targets an owner's local greedy can follow at epsilon = 1 (the allocation fixed to the
#: noise-free relevance counts, so that only the target's noise differs).
NOISY_TARGETS: dict[str, Callable[[Lab], float]] = {
    "exact g (no noise)": lambda lab: lab.one_wave(lab.relevance_counts(lab.g)),
    "gtilde as released": _target_raw,
    "gtilde, James-Stein to own mean (today)": _target_js_own,
    "gtilde, Wiener filter on own covariance": _target_wiener,
    **{f"{r} lowest-frequency features": _target_low(r) for r in LOW_DIMENSIONS},
    "votes on own uniform points": _target_votes,
    **{
        f"wider kernel gamma/{round(1 / f)}, d = {d}": _target_other(f, d)
        for f, d in ((1 / 4, 140), (1 / 16, 140), (1 / 4, 20))
    },
    **{
        f"wider kernel gamma/{round(1 / f)}, d = {d}, James-Stein": _target_other_js(f, d)
        for f, d in ((1 / 4, 140), (1 / 16, 140))
    },
    "noise-free target in gamma/4 space": lambda lab: _other_exact(lab, 1 / 4),
    "lab today at eps 1 (noisy counts, James-Stein)": lambda lab: lab.noisy_two_waves(
        0.0, hedge_size=lab.p, shrink_target=True, second=False
    ),
    "one wave at eps 1, gtilde as released": lambda lab: lab.noisy_two_waves(
        0.0, hedge_size=lab.p, second=False
    ),
    "2 waves votes at eps 1, James-Stein, hedge p": lambda lab: lab.noisy_two_waves(
        0.5, hedge_size=lab.p, shrink_target=True
    ),
    "2 waves votes at eps 1, hedge p": lambda lab: lab.noisy_two_waves(0.5, hedge_size=lab.p),
    "2 waves votes at eps 1, hedge p/2": lambda lab: lab.noisy_two_waves(
        0.5, hedge_size=lab.p // 2
    ),
    "oracle allocation, hedge p/2, gtilde as released": lambda lab: _oracle_raw(lab),
    "2 waves useful counts at eps 1, hedge p/2": lambda lab: lab.noisy_two_waves(
        0.5, hedge_size=lab.p // 2, useful=True
    ),
    "gtilde, top scores (no repulsion)": _target_top,
    **{f"{2**b} public cells, noisy D_v histogram": _target_cells(b) for b in (4, 6)},
    "wider kernel gamma/4, d = 140, top scores": _target_other(1 / 4, D, top=True),
    "wider kernel gamma/16, d = 140, top scores": _target_other(1 / 16, D, top=True),
}


def signal_report(lab: Lab) -> dict[str, float]:
    """The validation embedding's signal against its noise at epsilon 1 (counts path: the whole
    validation budget on gtilde).

    Returns
    -------
    dict
        ``sigma`` (noise per coordinate, and per score ``gtilde . h1(x)`` with ``||h1(x)|| ~ 1``),
        ``signal_norm`` (``||g||``), ``noise_norm`` (``sqrt(d) sigma``), ``score_spread`` (std of
        ``g . h1(x)`` over the pooled points), ``chosen_gap`` (mean score of exact greedy's
        points minus the pooled mean), and for r lowest-frequency features, ``energy_r`` (share
        of ``||g||^2``) and ``snr_r`` (``||g_r||^2 / (r sigma^2)``; ``snr_140`` for all).
    """
    pool = np.concatenate(lab.features).astype(np.float64)
    scores = pool @ lab.g
    exact = lab.exact_index
    out = {
        "m": float(lab.scenario.validation.shape[0]),
        "sigma": lab.sigma,
        "signal_norm": float(np.linalg.norm(lab.g)),
        "noise_norm": math.sqrt(D) * lab.sigma,
        "score_spread": float(scores.std()),
        "chosen_gap": float(scores[exact].mean() - scores.mean()),
        "snr_140": float(lab.g @ lab.g / (D * lab.sigma**2)),
    }
    for r in LOW_DIMENSIONS:
        columns = _low_columns(lab, r)
        energy = float(lab.g[columns] @ lab.g[columns])
        out[f"energy_{r}"] = energy / float(lab.g @ lab.g)
        out[f"snr_{r}"] = energy / (r * lab.sigma**2)
    return out


# ---------------------------------------------------------------------- driver
def _lab(name: str, seed: int, cache: Path) -> Lab:
    scenario = suite_scenario(name)
    exact = exact_greedy_reference(scenario, scenario.default_p, cache)
    pool = np.concatenate([o.features for o in scenario.owners])
    return Lab(scenario, seed, mmd2(pool[exact], scenario.validation, scenario.gamma), exact)


def _geomean(values: Sequence[float]) -> float:
    return float(np.exp(np.mean(np.log(np.asarray(values, dtype=np.float64)))))


def run_diagnosis(
    names: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    *,
    variants: Sequence[str] | None = None,
    noisy: bool = True,
    noisy_variants: Sequence[str] | None = None,
    noise_draws: int = 3,
) -> dict[str, Any]:
    """Every variant on every scenario and seed (geometric means of the ratio to exact greedy),
    and the signal report; written to ``out/diagnosis.json``.

    Raises
    ------
    HeldOutScenarioError
        If a scenario is not in the design half.
    """
    require_design(names, "the diagnosis")
    chosen = list(NOISE_FREE_VARIANTS if variants is None else variants)
    targets = list(NOISY_TARGETS if noisy_variants is None else noisy_variants) if noisy else []
    rows: dict[str, dict[str, Any]] = {}
    start = time.perf_counter()
    for name in names:
        ratios: dict[str, list[float]] = {v: [] for v in chosen}
        noisy_ratios: dict[str, list[float]] = {v: [] for v in targets}
        signals: list[dict[str, float]] = []
        for seed in seeds:
            lab = _lab(name, seed, out / "cache")
            for v in chosen:
                ratios[v].append(NOISE_FREE_VARIANTS[v](lab) / lab.exact_mmd2)
            signals.append(signal_report(lab))
            for v in targets:
                for _ in range(noise_draws):
                    noisy_ratios[v].append(NOISY_TARGETS[v](lab) / lab.exact_mmd2)
        rows[name] = {
            "noise_free": {v: _geomean(r) for v, r in ratios.items()},
            "noisy_targets": {v: _geomean(r) for v, r in noisy_ratios.items() if r},
            "signal": {k: float(np.mean([s[k] for s in signals])) for k in signals[0]},
        }
        print(f"{name}: done ({time.perf_counter() - start:.0f} s)", flush=True)
    document = {"scenarios": rows, "seeds": list(seeds), "seconds": time.perf_counter() - start}
    out.mkdir(parents=True, exist_ok=True)
    (out / "diagnosis.json").write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return document


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m dpmarket.experiments.suite_diagnosis``: the design half (or named
    scenarios), ``--seeds`` session seeds, results in ``--out``."""
    from dpmarket.experiments.suite_split import load_split

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("out/diagnosis"))
    parser.add_argument("--scenario", action="append", default=None)
    parser.add_argument("--variant", action="append", default=None)
    parser.add_argument("--noisy-variant", action="append", default=None)
    parser.add_argument("--no-noise", action="store_true")
    parser.add_argument("--noise-draws", type=int, default=3)
    args = parser.parse_args(argv)
    names = args.scenario or [n for n in load_split().design]
    run_diagnosis(
        names,
        range(args.seeds),
        args.out,
        variants=args.variant,
        noisy=not args.no_noise,
        noisy_variants=args.noisy_variant,
        noise_draws=args.noise_draws,
    )


if __name__ == "__main__":
    main()
