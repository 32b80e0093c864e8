"""No data-dependent text or number leaves an owner, between real processes over mTLS.

Two deployments are started as the README starts them (``dpmarket serve-owner --data … --table …``
with the default policy, no seeded runs; ``dpmarket serve-curator`` with a sketch declaration), each
with two owners and a curator as OS processes (:class:`dpmarket.deploy.launcher.LocalCluster`).
Their owners hold different data of the same public shape — the same row counts, columns and
declared 0/1 column — deployment ``b``'s values lying far from ``a``'s and outside the bounds and
domain that requests use. The same requests against both must get the same answers, except for the
noise of charged releases: the bounds-probing ``dpmarket cape mean --feature target=1000:2000``, a
logistic target that holds 1 and 2 (``cape train --target sex``), the summarization and sketch
refusals a consumer can provoke, and every refusal of the owners' own RPCs to a curator that probes
them directly (the curator may lie).

The two deployments' owners also run under different budgets (``b``'s are smaller) at other
addresses: what a consumer reads of an owner's refusal names neither (the owner's refusal to
the curator may say what is spent and left; the curator passes on a fixed text).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_diabetes

from dpmarket.common.cape.spec import CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.cape.uncertainty import MEAN_COVERS
from dpmarket.common.errors import DPMarketError
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.common.summarization.rff import draw_rff_params
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.consumer.client import CuratorClient
from dpmarket.curator.owners import GrpcOwnerEndpoint
from dpmarket.deploy.launcher import CURATOR_NAME, LocalCluster
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.transport import TransportSecurity

pytestmark = pytest.mark.integration

OWNERS = ("owner-0", "owner-1")
ROWS = 88
COLUMNS = ("age", "sex", "bmi", "bp", "target", "high")
#: Seconds: a safety net against a hang, not a timing assertion.
TIMEOUT = 120.0
DECLARATION = """
name = "clinic"
description = "age, body mass index and blood pressure; public physiological ranges"
columns = [
  { name = "age", low = 18.0, high = 80.0 },
  { name = "bmi", low = 15.0, high = 45.0 },
  { name = "bp", low = 60.0, high = 140.0 },
]

[mechanism]
noise = "laplace"
epsilon = 1.0
epsilon_range = [0.5, 1.0]

[maps.hist]
bins = 4
"""
#: Deployment ``b``'s owners' policy: smaller budgets than the defaults ``a`` runs under (10 in
#: all, 2 per session), the same points; both refuse a session or job asking epsilon 3.
SMALLER_BUDGETS = """
[budget]
epsilon = 8.0
[session]
epsilon = 1.5
[access]
allow_steered_selection = true   # as deployment a's drafted policy
"""
#: Both curators: the module's requests exceed the default 10 per consumer and minute.
CURATOR_POLICY = """
[sessions]
per_consumer_per_minute = 1000
"""
ADDRESS = re.compile(r"127\.0\.0\.1:\d+")
#: Session and job ids: 128 random bits drawn per request by the curator, public.
SESSION_ID = re.compile(r"\b[0-9a-f]{32}\b")


def _tables(directory: Path, variant: str) -> tuple[list[Path], list[Path]]:
    """Per owner: a point set (.npy, 3 features) and a table with ``sex`` coded 1/2 as in the
    diabetes study and a 0/1 ``high``. Variant ``b``: other patients, heavier and older, targets
    rescaled (nothing like ``a``'s values; the same shape)."""
    x, y = load_diabetes(return_X_y=True, scaled=False)
    x, y = np.asarray(x), np.asarray(y)
    rows = slice(0, 2 * ROWS) if variant == "a" else slice(2 * ROWS, 4 * ROWS)
    x, y = x[rows], y[rows]
    if variant == "b":
        x[:, 0] += 30.0  # ages beyond the domain's 80
        x[:, 2] += 15.0  # body mass indices beyond 45
        y = 1.5 * y
    y = y + (0.25 if variant == "a" else 0.375)  # raw values no report could hold by chance
    high = (y > np.median(y)).astype(np.float64)
    rng = np.random.default_rng(0 if variant == "a" else 1)
    points, tables = [], []
    for i, owner in enumerate(OWNERS):
        part = slice(i * ROWS, (i + 1) * ROWS)
        frame = pd.DataFrame(x[part, :4], columns=list(COLUMNS[:4]))
        frame["target"], frame["high"] = y[part], high[part]
        tables.append(directory / f"{owner}.parquet")
        frame.to_parquet(tables[-1])
        points.append(directory / f"{owner}.npy")
        scale = 1.0 if variant == "a" else 25.0
        np.save(points[-1], scale * rng.normal(size=(ROWS, 3)))
    return points, tables


class Deployment:
    """One running deployment and the raw values its owners hold."""

    def __init__(self, cluster: LocalCluster, tables: list[Path], directory: Path) -> None:
        self.cluster = cluster
        self.tables = tables
        self.directory = directory

    def raw_targets(self) -> list[float]:
        return [float(v) for t in self.tables for v in pd.read_parquet(t)["target"]]

    def consumer(self) -> CuratorClient:
        return CuratorClient(
            self.cluster.curator_target, self.cluster.consumer_security(), timeout=TIMEOUT
        )

    def as_curator(
        self, owner: int, endpoint: type[GrpcOwnerEndpoint] = GrpcOwnerEndpoint
    ) -> GrpcOwnerEndpoint:
        """An owner's RPCs called directly with the curator's own certificate (by ``endpoint``:
        the curator's own client, or one with a function replaced)."""
        curator = Identity("curator", CURATOR_NAME)
        security = TransportSecurity.from_files(*identity_files(self.cluster.pki_dir, curator))
        name = self.cluster.owner_ids[owner]
        return endpoint(
            self.cluster.owner_targets[owner], security, Identity("owner", name), deadline=TIMEOUT
        )

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``dpmarket ARGS --curator … --pki-dir … --name consumer`` as a consumer would run it."""
        command = [
            sys.executable, "-m", "dpmarket.deploy.cli", *args,
            "--curator", self.cluster.curator_target,
            "--pki-dir", str(self.cluster.pki_dir), "--name", "consumer",
        ]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False)


@pytest.fixture(scope="module")
def deployments(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Deployment]]:
    out: dict[str, Deployment] = {}
    clusters = []
    try:
        for variant in ("a", "b"):
            directory = tmp_path_factory.mktemp(f"deployment-{variant}")
            points, tables = _tables(directory, variant)
            declaration = directory / "clinic.toml"
            declaration.write_text(DECLARATION, encoding="utf-8")
            curator_policy = directory / "curator-policy.toml"
            curator_policy.write_text(CURATOR_POLICY, encoding="utf-8")
            policy = None
            if variant == "b":
                policy = directory / "owner-policy.toml"
                policy.write_text(SMALLER_BUDGETS, encoding="utf-8")
            cluster = LocalCluster(
                points,
                OWNERS,
                directory / "logs",
                owner_tables=tables,
                owner_binary_columns=("high",),
                allow_seeded_sessions=False,
                sketch_specs=[declaration],
                sketch_seed=0,
                owner_policy=policy,
                curator_policy=curator_policy,
            )
            clusters.append(cluster)
            cluster.start()
            cluster.publish_sketches(
                dict(zip(OWNERS, tables, strict=True)), directory / "publish", seed=None
            )
            out[variant] = Deployment(cluster, tables, directory)
        yield out
    finally:
        for cluster in clusters:
            cluster.stop()


def _normalized(text: str) -> str:
    """Addresses (ports) and the curator's random session ids differ between deployments and
    are public: mask them."""
    return SESSION_ID.sub("ID", ADDRESS.sub("ADDR", text))


def _refusal(call: Callable[[], Any]) -> str:
    with pytest.raises(DPMarketError) as info:
        call()
    return f"{type(info.value).__name__}: {_normalized(str(info.value))}"


# ------------------------------------------------------------------------------- the probe
def test_the_bounds_probe_returns_no_raw_value_and_no_count(
    deployments: dict[str, Deployment],
) -> None:
    """``dpmarket cape mean --feature target=1000:2000`` (every target lies below 1000): the
    answer is a charged DP release of the clamped data — 1000 plus noise of the stated std —
    with the same report at both deployments apart from noise and timings, and nothing the
    CLI prints or writes holds a raw value or speaks of rows or values outside."""
    reports = {}
    for variant, deployment in deployments.items():
        out = deployment.directory / "mean.json"
        done = deployment.cli(
            "cape", "mean", "--feature", "target=1000:2000",
            "--epsilon", "1", "--delta", "1e-6", "--out", str(out), "--json",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        text = out.read_text(encoding="utf-8")
        document = json.loads(text)
        report = document["report"]
        std = report["aggregator_noise_std"]
        # Six standard deviations: fails with probability below 2e-9 for a correct release.
        assert abs(document["mean"]["target"] - 1000.0) <= 6 * std
        printed = text + done.stdout + done.stderr
        numbers = {float(n) for n in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", printed)}
        assert not numbers & set(deployment.raw_targets())
        # The estimates' interval and flags are post-processing of the charged release, worded
        # from a fixed vocabulary of public terms (what the interval covers names the clamp to
        # the request's bounds); everything else must not speak of rows or values outside.
        estimates = document.pop("estimates")
        assert [e["covers"] for e in estimates] == [MEAN_COVERS]
        # stdout: the same document (--json), then one line of what was estimated.
        rest = json.dumps(document) + done.stdout.strip().splitlines()[-1] + done.stderr
        for word in ("row", "outside", "clamp", "bound"):
            assert word not in rest.lower(), word
        reports[variant] = {k: v for k, v in report.items() if k not in ("seconds",)}
    assert reports["a"] == reports["b"]


# ------------------------------------------------------------------------ consumer, CAPE path
def test_cape_refusals_a_consumer_provokes_are_the_same_whatever_the_owners_hold(
    deployments: dict[str, Deployment],
) -> None:
    """``cape train --target sex`` and ``cape logreg --target sex`` (1 and 2 in the table), a
    column no owner has, a guarantee beyond the owners' policy: the same status and text at
    both deployments, naming the request and the owners' declarations only."""
    features = ("--feature", "age=18:80", "--feature", "bmi=15:45")
    commands = [
        ("cape", "train", *features, "--target", "sex", "--iterations", "2"),
        ("cape", "logreg", *features, "--target", "sex"),
    ]
    seen: dict[str, list[str]] = {}
    for variant, deployment in deployments.items():
        outcomes = []
        for command in commands:
            done = deployment.cli(*command, "--out", str(deployment.directory / "x.json"))
            assert done.returncode == 1
            outcomes.append(_normalized(done.stderr.strip()))
        bounds = (("age", 18.0, 80.0), ("bmi", 15.0, 45.0))
        with deployment.consumer() as client:
            for spec in (
                CapeMeanSpec((("weight", 0.0, 200.0),), 1.0, 1e-6),
                CapeJobSpec("linear", bounds, ("target", 0.0, 400.0), 3.0, 1e-6),
                CapeTrainingSpec(bounds, "target", 1.0, 1e-5, 2, 1.0, 2, 1.0),
            ):
                if isinstance(spec, CapeMeanSpec):
                    outcomes.append(_refusal(functools.partial(client.estimate_cape_mean, spec)))
                elif isinstance(spec, CapeTrainingSpec):
                    outcomes.append(_refusal(functools.partial(client.train_cape, spec)))
                else:
                    outcomes.append(_refusal(functools.partial(client.fit_cape, spec)))
        seen[variant] = outcomes
    assert seen["a"] == seen["b"]
    train, logreg, missing, budget, target = seen["a"]
    assert "column 'sex' is not a 0/1 column of owner owner-0: a training needs" in train
    assert "this owner declares ['high']" in train and "2.0" not in train
    assert "logistic regression needs" in logreg
    assert missing.startswith("InvalidArgumentError") and "['weight']" in missing
    assert budget == (
        "BudgetRefusedError: curator at ADDR: owner owner-0: its privacy budget does not "
        "allow this session (budget refused) (FAILED_PRECONDITION)"
    )
    assert "column 'target' is not a 0/1 column" in target


# ---------------------------------------------------------------- consumer, summarization path
def test_summarization_refusals_a_consumer_provokes_are_the_same_whatever_the_owners_hold(
    deployments: dict[str, Deployment],
) -> None:
    """A validation set of the wrong width, a summary larger than the owners' data, terms an
    owner's policy refuses: the same status and text at both deployments."""
    rng = np.random.default_rng(0)
    seen = {}
    for variant, deployment in deployments.items():
        with deployment.consumer() as client:
            outcomes = [
                _refusal(
                    lambda: client.create_session(
                        CandidatesConfig(summary_size=5),
                        rng.normal(size=(10, 4)),
                        np.zeros((0, 4)),
                    )
                ),
                _refusal(
                    lambda: client.create_session(
                        CandidatesConfig(summary_size=500),
                        rng.normal(size=(10, 3)),
                        np.zeros((0, 3)),
                    )
                ),
                _refusal(
                    lambda: client.create_session(
                        CandidatesConfig(summary_size=5, epsilon_owners_total=3.0),
                        rng.normal(size=(10, 3)),
                        np.zeros((0, 3)),
                    )
                ),
            ]
        seen[variant] = outcomes
    assert seen["a"] == seen["b"]
    width, size, terms = seen["a"]
    assert "3 features per point but the validation set has 4" in width
    assert f"exceeds the {2 * ROWS} points" in size
    assert terms.startswith("FailedPreconditionError")
    assert "left out: owner-0 (budget refused), owner-1 (budget refused)" in terms


def test_budget_refusals_read_the_same_whatever_the_owners_budgets_and_addresses(
    deployments: dict[str, Deployment],
) -> None:
    """``dpmarket request`` and ``dpmarket cape mean`` asking epsilon 3 of every owner: both
    deployments' owners refuse (2 and 1.5 per session), their refusals to the curator saying
    what is spent and left at each; the consumer reads the same text at both, naming the owners
    and "budget refused", no owner address and no budget figure. Only the curator's address,
    which the consumer gave itself, differs."""
    validation = np.random.default_rng(0).normal(size=(10, 3))
    seen = {}
    for variant, deployment in deployments.items():
        path = deployment.directory / "validation.npy"
        np.save(path, validation)
        outputs = []
        for command in (
            ("request", "--validation", str(path), "-p", "5", "--epsilon-owners-total", "3",
             "--out", str(deployment.directory / "s.npy"),
             "--report", str(deployment.directory / "r.json")),
            ("cape", "mean", "--feature", "age=18:80", "--epsilon", "3", "--delta", "1e-6",
             "--out", str(deployment.directory / "m.json")),
        ):  # fmt: skip
            done = deployment.cli(*command)
            assert done.returncode == 1, done.stdout + done.stderr
            text = done.stdout + done.stderr
            for target in deployment.cluster.owner_targets:
                assert target not in text and target.rsplit(":", 1)[1] not in text, text
            outputs.append(text.replace(deployment.cluster.curator_target, "CURATOR"))
        seen[variant] = outputs
        # The owners' own refusals did state their figures: to the curator, in its log.
        curator_log = (deployment.cluster.log_dir / "curator.log").read_text(encoding="utf-8")
        assert "owner budget exceeded" in curator_log and re.search(r"\d left", curator_log)
    assert seen["a"] == seen["b"]
    request, cape = seen["a"]
    assert "left out: owner-0 (budget refused), owner-1 (budget refused)" in request
    assert "owner owner-0: its privacy budget does not allow this session" in cape
    for text in (request, cape):
        assert not re.search(r"spent|\d left|1\.5|of (2|8|10)\b", text), text


# ----------------------------------------------------------------------- consumer, sketch path
def test_sketches_are_published_whatever_the_values_and_their_refusals_match(
    deployments: dict[str, Deployment],
) -> None:
    """Deployment ``b``'s ages and body mass indices lie beyond the catalogue's domain: its
    owners published anyway (clamped, counted in their own logs only), so the catalogue looks
    the same to a consumer at both deployments, and so do its refusals."""
    seen = {}
    for variant, deployment in deployments.items():
        with deployment.consumer() as client:
            published = sorted(p.owner for p in client.sketches("clinic/hist"))
            seen[variant] = [
                published,
                _refusal(lambda: client.sketches("clinic/rff")),
                _refusal(lambda: client.sketch_spec("nope")),
            ]
    assert seen["a"] == seen["b"]
    assert seen["a"][0] == list(OWNERS)
    # The projection is logged alike at both (its counts in the owner's own log only): some
    # values moved at b, none at a.
    moved = {
        v: _moved_counts(d.cluster.log_dir / "publish-owner-0.log") for v, d in deployments.items()
    }
    assert moved["a"] and not any(moved["a"])
    assert any(moved["b"])


def _moved_counts(log: Path) -> list[int]:
    """Every count of values moved that the owner's log states for a projection."""
    lines = [line for line in log.read_text().splitlines() if "projected onto the spec's" in line]
    return [int(n) for line in lines for n in re.findall(r"'[^']*' (\d+)", line)]


# ---------------------------------------------------------------- a curator probing the owners
async def _probe(deployment: Deployment) -> list[str]:
    """A script of calls a lying curator could make of owner-0; each outcome as text."""
    owner = deployment.as_curator(0)  # its channel belongs to this event loop
    rff = draw_rff_params(3, 16, 0.5, np.random.default_rng(1))
    wide = draw_rff_params(4, 16, 0.5, np.random.default_rng(1))
    g = np.full(16, 0.05)
    terms = OwnerTerms(SessionMethod.CANDIDATES_COUNTS, 1.0, 0.0)
    uniform = OwnerTerms(SessionMethod.UNIFORM, 0.0, 0.0)
    sex = CapeJobSpec("logistic", (("age", 18.0, 80.0),), ("sex", 0.0, 1.0), 1.0, 1e-6)
    probe = CapeMeanSpec((("target", 1000.0, 2000.0),), 1.0, 1e-6)
    sites = ["owner-0", "owner-1"]

    async def lying_plan() -> Any:
        """Relay this owner's own signed row count, one row short."""
        attestation, certificate = await owner.attest_plan("j", sites, 1, 0)
        lie = dataclasses.replace(attestation, rows=attestation.rows - 1)
        return await owner.plan_job("j", sites, 1, {"owner-0": (lie, certificate)}, 0)

    steps: list[Callable[[], Awaitable[Any]]] = [
        owner.info,
        lambda: owner.open_session("w", wide, 0, consumer="consumer:c", terms=terms),
        lambda: owner.bid("nope", 1, g, 0),
        lambda: owner.open_session("s", rff, 0, consumer="consumer:c", terms=terms),
        lambda: owner.bid("s", 1, g, 0),
        lambda: owner.set_validation_embedding("s", g[:5]),
        lambda: owner.set_validation_embedding("s", g),
        lambda: owner.count_relevant("s", float("nan")),
        lambda: owner.sample_uniform("s", 1),
        lambda: owner.release_point("s", 3),
        lambda: owner.propose_candidates("s", 0),
        lambda: owner.close_session("s"),
        lambda: owner.open_session("u", rff, 0, consumer="consumer:c", terms=uniform),
        lambda: owner.sample_uniform("u", 200),
        lambda: owner.close_session("u"),
        lambda: owner.open_job("j", sex, 1, "consumer:c"),
        lambda: owner.open_job("j", probe, 1, "consumer:c"),
        lambda: owner.attest_plan("j", ["owner-0", "zz"], 1, 0),  # a site off the roster
        lying_plan,
        lambda: owner.plan_job("j", ["a", "b"], 1, {}, 0),
        lambda: owner.release("j", b"round", np.zeros(1)),
        lambda: owner.close_job("j"),
        lambda: owner.close_job("j"),
    ]
    outcomes = []
    for step in steps:
        try:
            outcomes.append(f"ok: {await step()!r}")
        except DPMarketError as exc:
            outcomes.append(f"{type(exc).__name__}: {_normalized(str(exc))}")
    await owner.close()
    return outcomes


def test_a_curator_probing_the_owners_directly_gets_the_same_answers_from_different_data(
    deployments: dict[str, Deployment],
) -> None:
    """Every step of the script, refusals and successes, is answered the same by owner-0 of
    both deployments: the owners' answers depend on the request and their public declarations
    (row count, feature count, columns, declared 0/1 columns, policy) only."""
    seen = {v: asyncio.run(_probe(d)) for v, d in deployments.items()}
    assert seen["a"] == seen["b"]
    refused = [o for o in seen["a"] if not o.startswith("ok")]
    assert len(refused) >= 11, seen["a"]
    assert any("count 200 exceeds the 88 points not yet sent" in o for o in refused)
    assert any("not a 0/1 column" in o for o in refused)
    assert any(
        "row count relayed for this owner (owner-0) is not the one it signed" in o for o in refused
    )
    assert any("does not accept ['zz'] as peers" in o for o in refused)


# ------------------------------------------------ a curator crafting a training's parameters
#: Mapped body mass index (15..45 -> -1..1) above which the crafted parameters overflow: no
#: record of deployment ``a`` lies above (its largest is 0.55), many of ``b``'s (clamped to 1).
THRESHOLD = 0.75
MAX = float(np.finfo(np.float64).max)


class _CraftingEndpoint(GrpcOwnerEndpoint):
    """The curator's own client with one function replaced (a stranger's attack): every
    ReleaseCapeGradient sends ``theta = [W1 = MAX, b1 = MAX (1 - c), w2 = 1e-310, b2 = 0]``, whose
    ``W1 x + b1`` overflows exactly for the records above ``c``; each answer is kept as text."""

    outcomes: list[str]

    async def release_gradient(self, job_id, round_id, iteration, parameters, total):
        theta = np.array([MAX, MAX * (1.0 - THRESHOLD), 1e-310, 0.0])
        try:
            out = await super().release_gradient(job_id, round_id, iteration, theta, total)
        except DPMarketError as exc:
            self.outcomes.append(f"{type(exc).__name__}: {_normalized(str(exc))}")
            raise
        self.outcomes.append("released")
        return out


async def _crafted_training(deployment: Deployment) -> list[str]:
    """A training run by the curator's own code over both owners (real gRPC, secure aggregation
    and ledgers) with the crafted parameters; what each owner answered, then the job's end."""
    from dpmarket.curator.cape import job_for

    endpoints = [deployment.as_curator(i, _CraftingEndpoint) for i in range(len(OWNERS))]
    outcomes: list[str] = []
    for endpoint in endpoints:
        endpoint.outcomes = outcomes  # type: ignore[attr-defined]
    spec = CapeTrainingSpec((("bmi", 15.0, 45.0),), "high", 1.0, 1e-6, 2, 1.0, 1, 1.0)
    job = job_for("crafted-" + "0" * 24, spec, endpoints, np.random.default_rng(0))
    try:
        await job.run()
        outcomes.append("trained")
    except DPMarketError as exc:
        outcomes.append(f"{type(exc).__name__}: {_normalized(str(exc))}")
    finally:
        for endpoint in endpoints:
            await endpoint.close()
    return sorted(outcomes[:-1]) + outcomes[-1:]


def test_a_curator_crafting_a_trainings_parameters_gets_the_same_answers_from_different_data(
    deployments: dict[str, Deployment],
) -> None:
    """The stranger's attack over real processes: deployment ``b``'s owners hold records whose
    mapped body mass index exceeds the threshold the parameters encode, ``a``'s none. Both
    deployments' owners refuse the parameters on public grounds (beyond what an honest training
    reaches), the same way, so the curator learns nothing of the records. The control (main
    before this fix): ``a``'s owners released, ``b``'s answered INVALID_ARGUMENT 'f_s holds NaN or
    inf values' after charging."""
    seen = {v: asyncio.run(_crafted_training(d)) for v, d in deployments.items()}
    assert seen["a"] == seen["b"]
    answers = seen["a"][:-1]
    assert len(answers) == len(OWNERS)
    assert all("parameters of iteration 0 reach |theta| = 1.79769e+308" in a for a in answers)
