"""Releases about the validation set and the running summary (Algorithm 3, steps 3 and 5).

The validation embedding gtilde is released once per session: by h2 (MWEM, the paper), by the
Gaussian mechanism (the rounds and candidates methods) or exactly (non-private greedy): the
methods choose (:mod:`~dpmarket.curator.summarization.rounds`,
:mod:`~dpmarket.curator.summarization.candidates`). The running summary's embedding g_l reaches
the owners every round through a :class:`SummaryRelease`: exact, by h2 warm-started across
rounds, by the binary-tree continual release, or not at all. Each release is charged to the
session's ledger before it leaves the curator.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.privacy.accounting import PrivacyEvent, analytic_gaussian_sigma
from dpmarket.common.privacy.ledger import Charge
from dpmarket.common.summarization.calibration import TREE_INCREMENT_SENSITIVITY, gaussian_epsilon
from dpmarket.common.summarization.candidates import (
    validation_embedding,
    validation_embedding_sensitivity,
)
from dpmarket.common.summarization.continual import TreePrefixSum
from dpmarket.common.summarization.methods import GaussianFields, H2Fields, RoundsConfig
from dpmarket.common.summarization.mwem import MWEMRelease, MWEMState
from dpmarket.common.summarization.quantization import quantize_features
from dpmarket.curator.summarization.state import Party, SessionState

__all__ = [
    "ExactSummary",
    "MWEMSummary",
    "NoSummary",
    "Releases",
    "SummaryRelease",
    "TreeSummary",
]


class SummaryRelease:
    """How the running summary embedding g_l reaches the owners each round (Algorithm 3, step 5).

    :meth:`release` returns ``(g, q)`` to broadcast in ``round_`` (charging what it releases);
    :meth:`add` takes the h1 features of the point added at the end of ``round_``.
    """

    def release(self, round_: int) -> tuple[NDArray[np.float64], int]:
        """The embedding g (shape (d,)) and summary size q to broadcast in ``round_``."""
        raise NotImplementedError

    def add(self, features: NDArray[np.float64], round_: int) -> None:
        """Take h1's features (shape (d,)) of the point added at the end of ``round_``."""
        raise NotImplementedError


class ExactSummary(SummaryRelease):
    """Non-private greedy: the exact mean h1 embedding of the summary."""

    def __init__(self, seed_features: NDArray[np.floating]) -> None:
        self.q = seed_features.shape[0]
        self.total = seed_features.sum(axis=0)

    def release(self, round_: int) -> tuple[NDArray[np.float64], int]:
        return (np.zeros_like(self.total) if self.q == 0 else self.total / self.q), self.q

    def add(self, features: NDArray[np.float64], round_: int) -> None:
        self.total = self.total + features
        self.q += 1


class MWEMSummary(SummaryRelease):
    """The paper's h2 release of the quantized summary, MWEM warm-started across rounds; round 1
    releases the public seed set only (charged as ``"public"``)."""

    def __init__(
        self,
        state: SessionState,
        config: H2Fields,
        seed_features: NDArray[np.floating],
        charge: Callable[[Party, str, MWEMRelease], None],
    ) -> None:
        cfg = config
        self.config = cfg
        self.state = state
        self.charge = charge
        self.q = seed_features.shape[0]
        self.eta = cfg.eta
        self.quantized_sum = (
            quantize_features(seed_features, self.eta, state.rng).sum(axis=0)
            if self.q > 0
            else np.zeros(cfg.rff_dimension)
        )
        self.mwem = MWEMState(cfg.rff_dimension, self.eta)

    def release(self, round_: int) -> tuple[NDArray[np.float64], int]:
        state = self.state
        cfg = self.config
        if self.q == 0:
            return np.zeros(cfg.rff_dimension), 0
        public = round_ == 1
        release = self.mwem.release(
            self.quantized_sum,
            self.q,
            cfg.t_init if public else cfg.iterations_subsequent,
            cfg.epsilon_first_epoch if public else cfg.epsilon_per_later_iteration,
            state.rng,
            state.noise,
        )
        self.charge(
            "public" if public else "owners",
            f"h2(h1(D_s)) round {round_}" + (" (seed set only)" if public else ""),
            release,
        )
        return release.embedding, self.q

    def add(self, features: NDArray[np.float64], round_: int) -> None:
        self.quantized_sum = (
            self.quantized_sum + quantize_features(features[None, :], self.eta, self.state.rng)[0]
        )
        self.q += 1


class TreeSummary(SummaryRelease):
    """Rounds method: ``g_l = (sum h1(D_init) + noisy prefix sum of h1 of acquired points) / q``,
    the prefix sum released by the binary tree
    (:class:`dpmarket.common.summarization.continual.TreePrefixSum`) with noise ``sigma``
    (:func:`~dpmarket.common.summarization.calibration.rounds_tree_sigma`)."""

    def __init__(
        self,
        state: SessionState,
        config: RoundsConfig,
        seed_features: NDArray[np.floating],
        sigma: float,
    ) -> None:
        cfg = config
        self.config = config
        self.state = state
        self.n_seed = seed_features.shape[0]
        self.seed_sum = seed_features.sum(axis=0)
        self.p = cfg.summary_size
        # Rounds 2..p release the prefix sums of acquired points 1..p-1; the p-th is never used.
        self.tree = TreePrefixSum(
            max(self.p - 1, 1), cfg.rff_dimension, sigma, state.rng, state.noise
        )
        self.charged = False

    def release(self, round_: int) -> tuple[NDArray[np.float64], int]:
        q = self.n_seed + self.tree.count
        if q == 0:
            return np.zeros_like(self.seed_sum), 0
        if self.tree.count > 0 and not self.charged:
            self._charge()
        return (self.seed_sum + self.tree.prefix_sum()) / q, q

    def _charge(self) -> None:
        """Charge the whole tree once, at its first release: every acquired point enters at most
        ``levels`` released nodes, each a Gaussian mechanism of L2 sensitivity 2 sqrt(2)."""
        state = self.state
        cfg = self.config
        sigma, levels, sens = self.tree.sigma, self.tree.levels, TREE_INCREMENT_SENSITIVITY
        state.ledgers["owners"].charge(
            [
                Charge(
                    "owners",
                    f"summary embedding: binary-tree prefix sums, {levels} nodes per point",
                    PrivacyEvent(
                        "gaussian",
                        gaussian_epsilon(sigma, cfg.delta, sens),
                        levels,
                        sens,
                        scale=sigma,
                        delta=cfg.delta,
                    ),
                )
            ]
        )
        self.charged = True

    def add(self, features: NDArray[np.float64], round_: int) -> None:
        if round_ < self.p:  # the last point is never released
            self.tree.add(features)


class NoSummary(SummaryRelease):
    """Rounds method without a summary broadcast: a zero embedding and q = 0 every round, so the
    owners bid ``gtilde . h1(x)``."""

    def __init__(self, d: int) -> None:
        self.d = d

    def release(self, round_: int) -> tuple[NDArray[np.float64], int]:
        return np.zeros(self.d), 0

    def add(self, features: NDArray[np.float64], round_: int) -> None:
        return None


class Releases:
    """The session's releases of embeddings, each charged before it is sent.

    Parameters
    ----------
    state : SessionState
        The session's state: configuration, randomness, noise and ledgers.
    """

    def __init__(self, state: SessionState) -> None:
        self.state = state

    def mwem_validation_embedding(
        self, val_features: NDArray[np.floating], config: H2Fields
    ) -> NDArray[np.float64]:
        """gtilde by h2 (the paper's step 3): ``T_init`` MWEM iterations at
        ``epsilon_validation`` on the quantized h1 features of D_v (shape (m, d)); charged to the
        validation ledger."""
        state = self.state
        cfg = config
        val_sums = quantize_features(val_features, cfg.eta, state.rng).sum(axis=0)
        release = MWEMState(cfg.rff_dimension, cfg.eta).release(
            val_sums,
            val_features.shape[0],
            cfg.t_init,
            cfg.epsilon_validation,
            state.rng,
            state.noise,
        )
        self.charge_mwem("validation", "h2(h1(D_v)): validation embedding", release)
        return release.embedding

    def gaussian_validation_embedding(
        self, val_features: NDArray[np.floating], config: GaussianFields
    ) -> tuple[NDArray[np.float64], float]:
        """:meth:`gaussian_validation_release` of ``validation_embedding(val_features)``
        (``val_features``: h1(D_v), shape (m, d))."""
        return self.gaussian_validation_release(
            validation_embedding(val_features), int(val_features.shape[0]), config
        )

    def gaussian_validation_release(
        self, embedding: NDArray[np.float64], m: int, config: GaussianFields
    ) -> tuple[NDArray[np.float64], float]:
        """gtilde = ``embedding`` + N(0, sigma^2 I) at (epsilon_validation_total, delta); charged.
        ``embedding`` is validation_embedding(h1(D_v)), shape (d,), of m validation points.
        Returns gtilde (shape (d,)) and sigma.

        L2 sensitivity 2 / m under replacing one validation point (m public): the mean of the
        validation points' unit-norm h1 rows (:func:`dpmarket.common.summarization.candidates.
        validation_embedding`)."""
        state = self.state
        cfg = config
        sensitivity = validation_embedding_sensitivity(m)
        eps_v = cfg.epsilon_validation_total
        sigma = analytic_gaussian_sigma(eps_v, cfg.delta, sensitivity)
        g_val = embedding + state.noise.gaussian(sigma, cfg.rff_dimension)
        state.ledgers["validation"].charge(
            [
                Charge(
                    "validation",
                    "gtilde = mean h1(D_v) + Gaussian noise",
                    PrivacyEvent("gaussian", eps_v, 1, sensitivity, scale=sigma, delta=cfg.delta),
                )
            ]
        )
        return g_val, sigma

    def charge_mwem(self, party: Party, label: str, release: MWEMRelease) -> None:
        """Charge one h2 release: T exponential-mechanism selections and T Laplace measurements."""
        ledger = self.state.ledgers["validation" if party == "validation" else "owners"]
        eps, count, sens = release.epsilon, release.iterations, release.sensitivity
        ledger.charge(
            [
                Charge(
                    party, f"{label}: selections", PrivacyEvent("exponential", eps, count, sens)
                ),
                Charge(
                    party,
                    f"{label}: measurements",
                    PrivacyEvent("laplace", eps, count, sens, scale=sens / eps),
                ),
            ]
        )
