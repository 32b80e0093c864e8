"""How the candidates method splits its budget of owner points among the owners.

The candidate budget (:class:`CandidateBudget`, the strategy's) starts with a uniform sample of p
points, split as the uniform method splits its summary (:meth:`Allocator.hedge`); the rest is
split by the owners' noisy relevance counts (:meth:`Allocator.by_counts`: each owner adds its own
Laplace noise to its count) or by the owners' published RFF sketches
(:meth:`Allocator.by_sketches`: a Gaussian release about the validation set only; the sketches'
cost was charged to their owners at publication). :meth:`Allocator.choose` decides which, from
the request and the sketches at hand.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.privacy.accounting import PrivacyEvent
from dpmarket.common.privacy.ledger import Charge
from dpmarket.common.sketches import SketchLike
from dpmarket.common.summarization.calibration import gaussian_epsilon
from dpmarket.common.summarization.candidates import (
    allocate_candidates,
    mass_read_caps,
    relevance_threshold,
    shrinkage_strength,
    size_read_caps,
    validation_embedding_sensitivity,
)
from dpmarket.common.summarization.methods import AllocationFields
from dpmarket.common.summarization.rff import random_fourier_features
from dpmarket.common.summarization.session_ledger import (
    AllocationReport,
    CountsAllocationReport,
    SketchAllocationReport,
)
from dpmarket.common.summarization.sketch_allocation import (
    MASS_RELEASE_SHARE,
    VOTING_SCORES,
    derived_allocation_share,
    noisy_relevance,
    relevance_matrix,
    relevance_sensitivity,
    responsibilities,
    shrink_decision,
    sketch_map_count,
    sketch_masses,
    sketch_validation_means,
    sketch_validation_sensitivity,
    split_gaussian_sigmas,
)
from dpmarket.curator.summarization.release import Releases
from dpmarket.curator.summarization.state import SessionState

__all__ = ["Allocation", "Allocator", "CandidateBudget", "CandidateRequest", "split_evenly"]

#: The owners' requests by slot index, the validation embedding sent, and the allocation's
#: report (the ledger's ``candidates``).
Allocation = tuple[dict[int, "CandidateRequest"], NDArray[np.float64], AllocationReport]


class CandidateRequest(NamedTuple):
    """What the candidates method asks one owner for: ``points`` points, of which the first
    ``uniform`` are a uniform sample (the hedge) and the rest the owner's local greedy."""

    points: int
    uniform: int


class CandidateBudget(NamedTuple):
    """The most owner points a candidates session reads (``total``, >= p) and whether it
    starts with a uniform sample of p of them (``hedge``: the curator re-ranks and the budget
    holds at least 2p)."""

    total: int
    hedge: bool


class Allocator:
    """The allocation of a candidates budget among the owners.

    Parameters
    ----------
    state : SessionState
    config : AllocationFields
        The candidates method's configuration (or its hashes mode's).
    releases : Releases
        Releases the Gaussian validation embedding the counts allocation sends first.
    budget : CandidateBudget
        The budget to split (the strategy's).
    """

    def __init__(
        self,
        state: SessionState,
        config: AllocationFields,
        releases: Releases,
        budget: CandidateBudget,
    ) -> None:
        self.state = state
        self.config = config
        self.releases = releases
        self.budget = budget

    def choose(self) -> tuple[Literal["sketch", "counts"], str]:
        """The allocation: by sketches when asked for and every owner that answered has one,
        else by noisy counts; with the reason."""
        state = self.state
        cfg = self.config
        if cfg.allocation == "counts":
            return "counts", "requested"
        missing = [
            state.owner_name(i)
            for i in state.active()
            if state.owner_name(i) not in state.owner_sketches
        ]
        if not missing:
            return "sketch", ""
        charged = (
            f"every owner is charged epsilon {cfg.epsilon_owners_total:g} for its noisy relevance "
            "count instead"
        )
        spec = state.allocation_spec
        if spec is None:
            return "counts", (
                "no published sketch to read (the curator names no allocation spec: "
                f"curator serve --allocation-sketch-spec NAME): {charged}"
            )
        return "counts", (
            f"no sketch published under {spec} by {', '.join(missing)} (dpmarket owner publish "
            f"--spec {spec}): {charged}"
        )

    def owner_view(
        self, sigma: float, g_val: NDArray[np.float64]
    ) -> tuple[float, NDArray[np.float64] | None]:
        """How each owner denoises the released embedding before its local greedy:
        ``(shrinkage_sigma, prior_embedding)`` for SetValidationEmbedding.

        ``embedding_prior="owner"``: the noise each owner's proposal should assume, ``sigma *
        sqrt(c)``, ``c`` the session's ``shrinkage`` times
        :func:`~dpmarket.common.summarization.candidates.shrinkage_strength` of the release
        ``g_val`` (1 with ``shrinkage_strength="fixed"``), so that it shrinks gtilde
        (James-Stein) towards its own mean h1
        (:func:`dpmarket.common.summarization.candidates.shrink_towards_points`). ``"seed"``: the
        same, and with a seed set its public mean h1 as a second prior, which an owner takes when
        gtilde lies nearer to it in the metric of the owner's own scores. ``"none"``: gtilde as
        released. Never towards a zero prior: that would only scale the embedding down, and an
        owner's local greedy would then chase the repulsion of its own choices, not D_v.
        Post-processing of the release with public values (sigma, the seed set) and the owner's own
        data, at the owner.
        """
        state = self.state
        cfg = self.config
        if cfg.embedding_prior == "none":
            return 0.0, None
        prior = None
        if cfg.embedding_prior == "seed" and state.seed_set.shape[0] > 0:
            assert state.rff is not None
            seed = random_fourier_features(state.seed_set, state.rff, dtype=np.float64)
            prior = seed.mean(axis=0)
        strength = self.strength(g_val, sigma)
        if strength == 0.0:
            return 0.0, None
        return sigma * math.sqrt(strength), prior

    def strength(self, g_val: NDArray[np.float64], sigma: float) -> float:
        """The owners' shrinkage strength c (a multiple of the release's noise variance): the
        session's ``shrinkage`` times
        :func:`~dpmarket.common.summarization.candidates.shrinkage_strength` of the release
        ``g_val`` (noise ``sigma`` per coordinate) by ``shrinkage_strength``'s rule; 0: none."""
        cfg = self.config
        return cfg.shrinkage * shrinkage_strength(g_val, sigma, cfg.shrinkage_strength)

    async def send_embedding(
        self, owners: Sequence[int], g_val: NDArray[np.float64], sigma: float
    ) -> float:
        """SetValidationEmbedding to every owner in ``owners``: gtilde (noise ``sigma`` per
        coordinate) and how to shrink it (:meth:`owner_view`; with ``shrinkage_metric="scores"``,
        the amount read in the metric of each owner's scores). Returns the noise the owners
        assume (0: no shrinkage)."""
        state = self.state
        owner_sigma, prior = self.owner_view(sigma, g_val)
        score_metric = self.config.shrinkage_metric == "scores"
        await state.gather(
            owners,
            lambda i: state.endpoint(i).set_validation_embedding(
                state.owner_session_id,
                g_val,
                shrinkage_sigma=owner_sigma,
                prior_embedding=prior,
                score_metric=score_metric,
            ),
        )
        return owner_sigma

    def allocation_share(self) -> float:
        """The sketch allocation's share of the validation party's Gaussian budget: the
        request's ``allocation_share``, or when 0 :func:`derived_allocation_share`."""
        state = self.state
        cfg = self.config
        if cfg.allocation_share > 0:
            return cfg.allocation_share
        return derived_allocation_share(
            int(state.validation.shape[0]),
            len(state.active()),
            cfg.epsilon_validation_total,
            cfg.delta,
        )

    def hedge(self, owners: Sequence[int]) -> list[int]:
        """The uniform sample the budget starts with, per owner in ``owners``: p points split as
        the uniform method splits its summary (:func:`split_evenly`), when the budget hedges
        (:class:`CandidateBudget`); nothing otherwise.

        Each owner draws its share exactly as the uniform method's sample
        (:meth:`dpmarket.owner.protocol.OwnerSession.propose_candidates`), so for the same session
        seed the candidates hold the uniform method's summary, and the curator returns it when its
        own choice is not better
        (:meth:`dpmarket.curator.summarization.candidates.CandidatesStrategy.hedged`): the
        default's MMD² to D_v is never above uniform sampling's (with the exact re-ranking;
        ``embedding_rerank`` reads the sample but does not compare). The sample is data
        independent, so it changes no privacy figure; it costs p of the budget's reads.
        """
        if not self.budget.hedge:
            return [0] * len(owners)
        return split_evenly(self.config.summary_size, [self.state.capacity(i) for i in owners])

    def requests(
        self,
        owners: Sequence[int],
        weights: NDArray[np.float64],
        masses: NDArray[np.float64] | None = None,
    ) -> dict[int, CandidateRequest]:
        """Each owner's request: its uniform share (:meth:`hedge`) plus its share of the rest of
        the budget, an even part and then in proportion to ``weights``
        (:func:`allocate_candidates`), within its capacity; with ``read_cap`` c > 0, within
        ``ceil(n_k / c)`` of its size (:func:`size_read_caps`); with ``mass_cap`` c > 0 and
        ``masses`` (shape (len(owners),), :meth:`masses`), within c times its share of the
        masses times the targeted budget (:func:`mass_read_caps`)."""
        state = self.state
        budget = self.budget.total
        hedge = self.hedge(owners)
        caps = [min(state.capacity(i), budget) - h for i, h in zip(owners, hedge, strict=True)]
        if self.config.read_cap > 0:
            # Post-processing of the owners' public sizes: no privacy cost (size_read_caps).
            sizes = [state.info(i).num_points for i in owners]
            caps = size_read_caps(caps, sizes, self.config.read_cap, budget - sum(hedge)).tolist()
        if self.config.mass_cap > 0 and masses is not None:
            # Post-processing of the sketches and of gtilde: no privacy cost (sketch_masses).
            caps = mass_read_caps(caps, masses, self.config.mass_cap, budget - sum(hedge)).tolist()
        shares = allocate_candidates(
            budget - sum(hedge), weights, caps, even_share=self.config.candidate_even_share
        )
        return {
            i: CandidateRequest(int(s) + h, h)
            for i, s, h in zip(owners, shares, hedge, strict=True)
            if s + h > 0 and state.slots[i].active
        }

    async def by_counts(self, embedding: NDArray[np.float64], note: str) -> Allocation:
        """The counts allocation: gtilde at the whole validation budget, the owners' noisy
        relevance counts, shares in proportion to them (each owner at most the budget).
        ``note`` says why (:meth:`choose`)."""
        state = self.state
        cfg = self.config
        m = int(state.validation.shape[0])
        g_val, sigma = self.releases.gaussian_validation_release(embedding, m, cfg)
        # Owners count relevant points against gtilde as released, and denoise it for their
        # proposals only.
        owner_sigma = await self.send_embedding(state.active(), g_val, sigma)
        # Relevance counts, each a function of one owner's data: sensitivity 1 under replacing or
        # adding one point, so the Laplace(1 / eps_o) noise each owner adds to its own count (the
        # session's terms) makes the vector eps_o-DP. Charged here too: the session's ledger.
        threshold = relevance_threshold(g_val, cfg.relevance_threshold, noise_sigma=sigma)
        eps_o = cfg.epsilon_owners_total
        state.ledgers["owners"].charge(
            [
                Charge(
                    "owners",
                    "relevance counts + Laplace noise (drawn by each owner)",
                    PrivacyEvent("laplace", eps_o, 1, 1.0, scale=1.0 / eps_o),
                )
            ]
        )
        counts = await state.gather(
            state.active(),
            lambda i: state.endpoint(i).count_relevant(state.owner_session_id, threshold),
            stage="count",
        )
        state.require_owners()
        owners = sorted(counts)
        noisy = np.array([counts[i] for i in owners], dtype=np.float64)
        requests = self.requests(owners, np.maximum(noisy, 0.0))
        info = CountsAllocationReport(
            allocation_note=note,
            budget=self.budget.total,
            uniform_shares={state.owner_name(i): r.uniform for i, r in requests.items()},
            gaussian_sigma=sigma,
            embedding_prior=cfg.embedding_prior if owner_sigma > 0 else "none",
            shrinkage_metric=cfg.shrinkage_metric,
            shrinkage_strength=self.strength(g_val, sigma) if owner_sigma > 0 else 0.0,
            relevance_threshold=threshold,
            # Post-processing of the Laplace release, so safe to report; the exact counts are not.
            noisy_counts={
                state.owner_name(i): float(v) for i, v in zip(owners, noisy, strict=True)
            },
            shares={state.owner_name(i): r.points for i, r in requests.items()},
        )
        return requests, g_val, info

    async def by_sketches(self, embedding: NDArray[np.float64]) -> Allocation:
        """The sketch allocation (:mod:`dpmarket.common.summarization.sketch_allocation`):
        gtilde and the noisy mean responsibilities, two Gaussian releases about D_v whose
        composition is ``(epsilon_validation_total, delta)`` whatever the split
        (:meth:`allocation_share`); with ``mass_cap`` > 0 a third, D_v's mean features in the
        sketches' own maps (:meth:`masses`), takes
        :data:`~dpmarket.common.summarization.sketch_allocation.MASS_RELEASE_SHARE` of the
        budget and the first two split the rest, so the three still compose to
        ``(epsilon_validation_total, delta)``; shares from the second, shrunk towards the even split
        (:func:`~dpmarket.common.summarization.sketch_allocation.shrink_decision`). Owners
        receive gtilde and how to shrink it (:meth:`owner_view`); all of it post-processing of
        the two releases with public values. Owners release nothing before their candidates."""
        state = self.state
        cfg = self.config
        m = int(state.validation.shape[0])
        owners = state.active()
        sketches = [state.owner_sketches[state.owner_name(i)] for i in owners]
        sens_g = validation_embedding_sensitivity(m)
        sens_a = relevance_sensitivity(m)
        share = self.allocation_share()
        if cfg.mass_cap > 0:
            # A third release about D_v, its mean features in the sketches' own maps (the mass
            # cap's): MASS_RELEASE_SHARE of the budget; gtilde and the decision split the rest.
            sens_s = sketch_validation_sensitivity(
                m, sketch_map_count(sketches, int(state.validation.shape[1]))
            )
            keep = 1.0 - MASS_RELEASE_SHARE
            sigma_g, sigma_a, sigma_s = split_gaussian_sigmas(
                cfg.epsilon_validation_total,
                cfg.delta,
                [sens_g, sens_a, sens_s],
                [keep * (1.0 - share), keep * share, MASS_RELEASE_SHARE],
            )
            mass_release: tuple[float, float] | None = (sigma_s, sens_s)
        else:
            sigma_g, sigma_a = split_gaussian_sigmas(
                cfg.epsilon_validation_total, cfg.delta, [sens_g, sens_a], [1.0 - share, share]
            )
            mass_release = None
        relevance = await asyncio.to_thread(
            relevance_matrix,
            sketches,
            state.validation,
            score=cfg.relevance_score,
            rng=state.rng,
            norm_weight=cfg.relevance_norm_weight,
        )
        pi = responsibilities(relevance, vote=cfg.relevance_score in VOTING_SCORES)
        # Charge every release about D_v before the first leaves the curator.
        self._charge_sketch_releases((sigma_g, sens_g), (sigma_a, sens_a), mass_release)
        g_val = self.embedding_release(embedding, sigma_g)
        noisy, decision, decision_alpha = self.decision_release(pi, sigma_a)
        masses = await self.masses(sketches, mass_release)
        owner_sigma = await self.send_embedding(owners, g_val, sigma_g)
        state.require_owners()
        requests = self.requests(owners, np.maximum(decision, 0.0), masses)
        info = SketchAllocationReport(
            budget=self.budget.total,
            uniform_shares={state.owner_name(i): r.uniform for i, r in requests.items()},
            gaussian_sigma=sigma_g,
            embedding_prior=cfg.embedding_prior,
            shrinkage_metric=cfg.shrinkage_metric,
            shrinkage_strength=self.strength(g_val, sigma_g) if owner_sigma > 0 else 0.0,
            relevance_score=cfg.relevance_score,
            allocation_share=share,
            allocation_sigma=sigma_a,
            decision_shrinkage=decision_alpha,
            # The release itself (post-processing of it is what the owners see).
            noisy_relevance={
                state.owner_name(i): float(v) for i, v in zip(owners, noisy, strict=True)
            },
            shares={state.owner_name(i): r.points for i, r in requests.items()},
        )
        return requests, g_val, info

    async def masses(
        self, sketches: Sequence[SketchLike], release: tuple[float, float] | None
    ) -> NDArray[np.float64] | None:
        """The owners' masses near D_v for the mass cap (None when ``release`` is None, the cap
        off): D_v's mean features in the sketches' own maps
        (:func:`~dpmarket.common.summarization.sketch_allocation.sketch_validation_means`) plus
        Gaussian noise ``release = (sigma, L2 sensitivity)`` from the session's noise source,
        already charged to D_v's ledger by :meth:`_charge_sketch_releases`; then
        :func:`~dpmarket.common.summarization.sketch_allocation.sketch_masses`' upper bounds,
        post-processing of that release and of the published ``sketches``. Only the caps derived
        from it leave the curator (as the owners' requests)."""
        if release is None:
            return None
        sigma, _ = release
        means = await asyncio.to_thread(sketch_validation_means, sketches, self.state.validation)
        noisy = means + self.state.noise.gaussian(sigma, int(means.shape[0]))
        upper, _ = await asyncio.to_thread(sketch_masses, sketches, noisy, sigma)
        return upper

    def embedding_release(
        self, embedding: NDArray[np.float64], sigma: float
    ) -> NDArray[np.float64]:
        """The sketch allocation's gtilde: ``embedding + N(0, sigma^2 I_d)`` from the session's
        noise source (charged by the caller before it leaves the curator)."""
        return embedding + self.state.noise.gaussian(sigma, self.config.rff_dimension)

    def decision_release(
        self, pi: NDArray[np.float64], sigma: float
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], float]:
        """The sketch allocation's decision from the responsibilities ``pi`` (shape (m, K)):
        the release ``r~ = mean pi + N(0, sigma^2 I_K)``
        (:func:`~dpmarket.common.summarization.sketch_allocation.noisy_relevance`), and its
        post-processing towards the even split
        (:func:`~dpmarket.common.summarization.sketch_allocation.shrink_decision`) with the
        shrinkage factor."""
        _, noisy = noisy_relevance(pi, sigma, self.state.noise)
        decision, alpha = shrink_decision(noisy, sigma)
        return noisy, decision, alpha

    def _charge_sketch_releases(
        self,
        embedding: tuple[float, float],
        allocation: tuple[float, float],
        mass: tuple[float, float] | None = None,
    ) -> None:
        """Charge the sketch allocation's Gaussian releases about D_v, each given as
        ``(sigma, L2 sensitivity)``: gtilde, the noisy mean responsibilities and, with the mass
        cap, D_v's noisy mean features in the sketches' maps."""
        cfg = self.config
        labels = [
            "gtilde = mean h1(D_v) + Gaussian noise",
            f"sketch allocation: mean {cfg.relevance_score} responsibilities + Gaussian noise",
        ]
        releases = [embedding, allocation]
        if mass is not None:
            labels.append("mass cap: mean sketch-map features of D_v + Gaussian noise")
            releases.append(mass)
        self.state.ledgers["validation"].charge(
            [
                Charge(
                    "validation",
                    label,
                    PrivacyEvent(
                        "gaussian",
                        gaussian_epsilon(sigma, cfg.delta, sens),
                        1,
                        sens,
                        scale=sigma,
                        delta=cfg.delta,
                    ),
                )
                for label, (sigma, sens) in zip(labels, releases, strict=True)
            ]
        )


def split_evenly(total: int, capacities: Sequence[int]) -> list[int]:
    """Split ``total`` into near-equal shares (p/K each) that respect each owner's capacity.

    Raises
    ------
    InvalidArgumentError
        If the capacities sum to less than ``total``.
    """
    if sum(capacities) < total:
        raise InvalidArgumentError(f"owners hold {sum(capacities)} points, fewer than {total}")
    shares = [0] * len(capacities)
    remaining = total
    open_ = [i for i, c in enumerate(capacities) if c > 0]
    while remaining > 0:
        each, extra = divmod(remaining, len(open_))
        for rank, i in enumerate(list(open_)):
            want = each + (1 if rank < extra else 0)
            give = min(want, capacities[i] - shares[i])
            shares[i] += give
            remaining -= give
        open_ = [i for i in open_ if shares[i] < capacities[i]]
    return shares
