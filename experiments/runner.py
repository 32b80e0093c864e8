"""Run protocols in one process (``dpmarket lab simulate``, tests, experiments), on the same code.

The curator's :class:`dpmarket.curator.summarization.session.SummarizationSession` drives in-process
owners through :class:`dpmarket.owner.local.LocalOwnerEndpoint`; the networked run drives gRPC
clients instead. With the same seed both produce the same summary. :func:`exact_greedy_summary` is
the non-private reference the demo and the evaluation compare against.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from numpy.typing import NDArray

from dpmarket.common.cape.spec import AnyCapeSpec, CapeJobSpec
from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.privacy.noise import NoiseSource, OpenDPNoise, SeededNoise
from dpmarket.common.privacy.rng import make_rng
from dpmarket.common.secagg.crypto import EcdsaSigner, EcdsaVerifier
from dpmarket.common.sketches import PrivateSketch, SketchMechanism
from dpmarket.common.sketches.spec import SketchSpec
from dpmarket.common.summarization.endpoints import OwnerEndpoint
from dpmarket.common.summarization.kernels import exact_kernel_greedy
from dpmarket.common.summarization.methods import HashesConfig, SummarizationConfig
from dpmarket.common.summarization.session_ledger import SessionLedger
from dpmarket.common.summarization.summary import SessionReport, SessionRequest, SummaryResult
from dpmarket.curator.cape import CapeMeanEstimate, CapeResult, CapeTrainingResult, job_for
from dpmarket.curator.summarization.session import (
    ProgressCallback,
    SessionContext,
    SummarizationSession,
)
from dpmarket.owner.cape import CapeSite
from dpmarket.owner.hash_keys import HashKeyParty
from dpmarket.owner.local import LocalCapeSiteEndpoint, LocalOwnerEndpoint
from dpmarket.owner.protocol import Owner
from dpmarket.owner.secagg import SiteIdentity
from dpmarket.owner.service import site_rounds
from dpmarket.runtime.tables import PointSet, Table


def simulate(
    owners: Sequence[PointSet],
    validation: NDArray[np.float64],
    seed_set: NDArray[np.float64],
    config: SummarizationConfig,
    *,
    seed: int | None,
    owner_ids: Sequence[str] | None = None,
    on_progress: ProgressCallback | None = None,
    owner_sketches: Mapping[str, PrivateSketch] | None = None,
) -> SummaryResult:
    """Run one session with every owner in this process.

    Parameters
    ----------
    owners : sequence of PointSet
        Each owner's data, shape (n_i, n).
    validation : ndarray of shape (m, n)
    seed_set : ndarray of shape (n0, n)
    config : SummarizationConfig
    seed : int or None
        Session seed (None: cryptographically seeded).
    owner_ids : sequence of str, optional
        Names of the owners (default: each point set's name).
    owner_sketches : mapping of str to PrivateSketch, optional
        The owners' published sketches by name (:func:`publish_sketches`), for the candidates
        method's sketch allocation.

    Raises
    ------
    dpmarket.common.errors.DPMarketError
        As :meth:`SummarizationSession.prepare` and :meth:`SummarizationSession.run`.
    """
    ids = list(owner_ids) if owner_ids is not None else [o.name for o in owners]
    # Unseeded runs draw production randomness everywhere: the owners ignore the curator's seeds.
    seeded = seed is not None
    endpoints = (
        local_hash_owners(owners, ids, seeded=seeded)
        if isinstance(config, HashesConfig)
        else [
            LocalOwnerEndpoint(Owner(i, data, allow_seeded_sessions=seeded))
            for i, data in zip(ids, owners, strict=True)
        ]
    )
    return run_session(
        endpoints,
        validation,
        seed_set,
        config,
        seed=seed,
        on_progress=on_progress,
        owner_sketches=owner_sketches,
    )


def local_hash_owners(
    owners: Sequence[PointSet], owner_ids: Sequence[str], *, seeded: bool = True
) -> list[LocalOwnerEndpoint]:
    """In-process owners that take part in the hashes mode (:mod:`dpmarket.owner.hash_keys`).

    Each owner gets a fresh ECDSA P-256 identity key and trusts the others' public keys directly
    (no CA in one process; a deployment takes them from the owners' certificates). The secret
    they agree on comes from ``os.urandom`` whatever the seed: it must not be reproducible by
    whoever knows a session seed.
    """
    keys = {name: ec.generate_private_key(ec.SECP256R1()) for name in owner_ids}
    verifier = EcdsaVerifier({name: key.public_key() for name, key in keys.items()})
    return [
        LocalOwnerEndpoint(
            Owner(
                name,
                data,
                allow_seeded_sessions=seeded,
                hash_party=HashKeyParty(name, EcdsaSigner(keys[name]), verifier),
            )
        )
        for name, data in zip(owner_ids, owners, strict=True)
    ]


def publish_sketches(
    owners: Sequence[PointSet],
    mechanism: SketchMechanism,
    *,
    seed: int | None,
    owner_ids: Sequence[str] | None = None,
) -> dict[str, PrivateSketch]:
    """Every owner's private sketch, released in this process (in-process research runs).

    The owner service publishes a sketch once, charged to its own ledger, to the curator's
    catalogue; in-process runs (``dpmarket lab simulate``, ``evaluate``, ``demo --in-process``,
    tests) release them here with :meth:`SketchMechanism.release` and charge no ledger, as those
    runs charge nothing else either. The sketch's epsilon still appears in the session's report
    (the ledger's ``owner_sketches``).

    Parameters
    ----------
    owners : sequence of PointSet
    mechanism : SketchMechanism
        The public map, domain and noise (e.g.
        :meth:`dpmarket.experiments.scenarios.Scenario.sketch_mechanism`).
    seed : int or None
        Seeds the noise (None: OpenDP's samplers).
    owner_ids : sequence of str, optional
        Names (default: each point set's name).

    Returns
    -------
    dict of str to PrivateSketch

    Notes
    -----
    Each owner's points are projected onto the mechanism's domain first
    (:meth:`dpmarket.common.sketches.domain.Domain.clamp`), as the owner service does before it
    publishes, so an in-process sketch is the one the networked owner would release.
    """
    ids = list(owner_ids) if owner_ids is not None else [o.name for o in owners]
    noise: NoiseSource = SeededNoise(make_rng(seed)) if seed is not None else OpenDPNoise()
    return {
        name: mechanism.release(mechanism.domain.clamp(data.features)[0], noise)
        for name, data in zip(ids, owners, strict=True)
    }


#: Owner ``k``'s sketch noise in a seeded run with sketch noise seed ``s`` is drawn from
#: ``numpy.random.default_rng(s * SKETCH_SEED_STRIDE + k)``: the seed ``dpmarket owner publish
#: --seed`` gets from the local launcher, and the one ``dpmarket lab simulate --sketch-spec`` uses.
SKETCH_SEED_STRIDE = 1000


def owner_sketch_seed(seed: int, index: int) -> int:
    """The sketch noise seed of owner number ``index`` (0-based, in the owners' order) in a run
    seeded with ``seed`` (:data:`SKETCH_SEED_STRIDE`)."""
    return int(seed) * SKETCH_SEED_STRIDE + int(index)


def declared_sketch_spec(
    declaration_path: str | Path, *, spec_name: str | None = None, seed: int | None
) -> SketchSpec:
    """The RFF spec a catalogue declaration file gives, drawn as the curator's catalogue draws it.

    ``dpmarket curator serve --sketch-spec FILE --sketch-seed S`` loads the declaration and draws
    its parameters from :func:`dpmarket.common.privacy.rng.make_rng` ``(S)``; this draws the same
    parameters from the same seed, so that sketches released in process under the result are the
    ones the owners would publish to that catalogue.

    Parameters
    ----------
    declaration_path : str or Path
        A catalogue declaration (TOML, :func:`dpmarket.curator.sketches.load_declaration`).
    spec_name : str, optional
        The spec (``"<declaration>/rff"``); default: the declaration's RFF map.
    seed : int or None
        The catalogue's ``--sketch-seed`` (None: a CSPRNG, as a catalogue without one).

    Raises
    ------
    FileNotFoundError, ValueError
        As :func:`dpmarket.curator.sketches.load_declaration`; ``ValueError`` also when the
        declaration has no RFF map or no spec of that name, or the spec is not an RFF spec.
    """
    from dpmarket.curator.sketches import load_declaration

    declaration = load_declaration(declaration_path)
    specs = {spec.name: spec for spec in declaration.draw(make_rng(seed))}
    name = spec_name if spec_name is not None else f"{declaration.name}/rff"
    if name not in specs:
        raise ValueError(f"{declaration_path} declares the spec(s) {sorted(specs)}, not {name!r}")
    if specs[name].kind != "rff":
        raise ValueError(f"spec {name!r} is a {specs[name].kind} spec; the allocation reads RFF")
    return specs[name]


def release_spec_sketches(
    tables: Sequence[Table], spec: SketchSpec, *, seed: int | None, epsilon: float | None = None
) -> dict[str, PrivateSketch]:
    """Every owner's sketch under a catalogue spec, released in this process as the owner
    service releases it (:func:`dpmarket.owner.sketches.spec_records`, then the spec's mechanism).

    Parameters
    ----------
    tables : sequence of Table
        Each owner's table (the spec's columns are selected by name), named as the owner.
    spec : SketchSpec
        E.g. :func:`declared_sketch_spec`.
    seed : int or None
        Owner ``k``'s noise is seeded with :func:`owner_sketch_seed` ``(seed, k)``, as the local
        launcher seeds ``dpmarket owner publish --seed``; None: OpenDP's samplers.
    epsilon : float, optional
        Each sketch's epsilon (default: the spec's), within the spec's range.

    Returns
    -------
    dict of str to PrivateSketch
        By table name. No ledger is charged (in-process runs charge nothing).

    Raises
    ------
    dpmarket.common.errors.InvalidArgumentError
        If a table lacks a column of the spec or the epsilon is outside its range.
    ValueError
        If ``spec`` is a marginals spec (not a linear sketch).
    """
    from dpmarket.common.sketches.marginals import MarginalsMechanism
    from dpmarket.owner.sketches import spec_records

    mechanism = spec.mechanism(epsilon)
    if isinstance(mechanism, MarginalsMechanism):
        raise ValueError(f"spec {spec.name!r} is a marginals spec; the allocation reads RFF")
    out = {}
    for k, table in enumerate(tables):
        noise: NoiseSource = (
            OpenDPNoise()
            if seed is None
            else SeededNoise(np.random.default_rng(owner_sketch_seed(seed, k)))
        )
        out[table.name] = mechanism.release(spec_records(spec, table), noise)
    return out


def run_session(
    endpoints: Sequence[OwnerEndpoint],
    validation: NDArray[np.float64],
    seed_set: NDArray[np.float64],
    config: SummarizationConfig,
    *,
    seed: int | None,
    on_progress: ProgressCallback | None = None,
    owner_sketches: Mapping[str, PrivateSketch] | None = None,
) -> SummaryResult:
    """Prepare and run one session against given owner endpoints, in a fresh event loop.

    Parameters
    ----------
    endpoints : sequence of OwnerEndpoint
        In-process owners, or wrappers of them (tests record or alter their messages).
    validation, seed_set, config, seed, on_progress, owner_sketches
        As :func:`simulate`.

    Raises
    ------
    dpmarket.common.errors.DPMarketError
        As :meth:`SummarizationSession.prepare` and :meth:`SummarizationSession.run`.
    """

    async def run() -> SummaryResult:
        # Seeded runs (tests, evaluation) keep numpy's seeded draws; others use OpenDP.
        session = SummarizationSession(
            SessionRequest(config, validation, seed_set, seed=seed),
            endpoints,
            SessionContext(
                session_id="simulated-session",
                on_progress=on_progress,
                owner_sketches=owner_sketches or {},
            ),
        )
        await session.prepare()
        return await session.run()

    return asyncio.run(run())


def exact_greedy_summary(
    owners: Sequence[Any], validation: np.ndarray, p: int, gamma: float
) -> SummaryResult:
    """Non-private greedy with the exact kernel on the pooled data (a reference, not a service).

    The summary's own MMD² to ``validation`` is what it minimises, as every method's summary is
    measured: a public seed set is not part of what a consumer receives."""
    start = time.perf_counter()
    pool = np.concatenate([o.features for o in owners])
    labels = (
        np.concatenate([o.labels for o in owners])
        if all(o.labels is not None for o in owners)
        else None
    )
    names = [o.name for o in owners for _ in range(o.n_points)]
    index = exact_kernel_greedy(pool, validation, np.zeros((0, pool.shape[1])), p, gamma)
    elapsed = time.perf_counter() - start
    report = SessionReport(
        method="greedy",
        summary_size=p,
        rounds=p,
        owner_points_accessed=int(pool.shape[0]),
        validation_points_accessed=int(validation.shape[0]),
        all_owners_bound=len(owners) * p,
        paper_bound=0.0,
        dropped_owners=(),
        ledger=SessionLedger(),
        wall_time_seconds=elapsed,
    )
    return SummaryResult(
        points=pool[index],
        labels=None if labels is None else labels[index],
        owner_ids=tuple(names[i] for i in index),
        report=report,
    )


def local_cape_sites(
    tables: Sequence[Table], *, seeded: bool = True
) -> list[LocalCapeSiteEndpoint]:
    """In-process CAPE sites over tables (one owner each, named after its table).

    Each site gets a fresh ECDSA P-256 signing key, and every site trusts the others' keys
    directly (no CA in one process); the networked run checks certificates instead.
    """
    keys = {t.name: ec.generate_private_key(ec.SECP256R1()) for t in tables}
    publics = {name: key.public_key() for name, key in keys.items()}
    endpoints = []
    for table in tables:
        identity = SiteIdentity(table.name, keys[table.name], b"", None).trusting(publics)
        site = CapeSite(table.name, table, allow_seeded_sessions=seeded, identity=identity)
        endpoints.append(LocalCapeSiteEndpoint(site, site_rounds(site)))
    return endpoints


def fit_cape(
    tables: Sequence[Table], spec: CapeJobSpec, *, seed: int | None
) -> tuple[CapeResult, dict[str, SessionSpend]]:
    """Fit a capeFM model with every owner in this process (secure aggregation included).

    With a seed, the owners' noise and rounding coins are seeded from it (the networked run with
    the same seed and seeded owners gives the same model bit for bit); without one they come from
    OpenDP and a CSPRNG.

    Raises
    ------
    dpmarket.common.errors.DPMarketError
        As :meth:`dpmarket.curator.cape.CapeJob.run`.
    """
    result, spend = run_cape(tables, spec, seed=seed)
    assert isinstance(result, CapeResult)
    return result, spend


def run_cape(
    tables: Sequence[Table], spec: AnyCapeSpec, *, seed: int | None
) -> tuple[CapeResult | CapeMeanEstimate | CapeTrainingResult, dict[str, SessionSpend]]:
    """Run any CAPE job (capeFM, mean, training) with every owner in this process, secure
    aggregation included; the same seed gives the networked run's answer bit for bit.

    Raises
    ------
    dpmarket.common.errors.DPMarketError
        As the job's ``run`` (:mod:`dpmarket.curator.cape`).
    """
    endpoints = local_cape_sites(tables, seeded=seed is not None)
    job = job_for("local-cape-job", spec, endpoints, make_rng(seed))

    async def run() -> CapeResult | CapeMeanEstimate | CapeTrainingResult:
        return await job.run()

    return asyncio.run(run()), job.owner_spend
