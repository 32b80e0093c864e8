"""Every command's default request passes the shipped default policies.

The defaults are read from the commands themselves (each click option's default), never copied
here, and each request is put to the same checks it meets in a deployment under
``deploy/policies/owner.toml`` and ``deploy/policies/curator.toml``, in process: the curator's
policy (parameter ranges, the session's terms), then the owners' own decisions on their durable
ledgers (a summarization session opened at real owners, a CAPE job opened at real sites, a
sketch published to a real catalogue). A default that one of them refuses fails here, naming
the command and the refusal.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import click
import numpy as np
import pytest

from dpmarket.common.cape.spec import CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.summarization.methods import ALLOCATIONS
from dpmarket.common.summarization.summary import SessionRequest
from dpmarket.consumer import cli as consumer_cli
from dpmarket.consumer.cli import cape_group
from dpmarket.curator.policy import CuratorPolicy, load_curator_policy
from dpmarket.curator.sketches import LocalCatalogEndpoint, SketchCatalog
from dpmarket.curator.summarization.session import SessionContext, SummarizationSession
from dpmarket.deploy.cli import command_at
from dpmarket.experiments.runner import publish_sketches
from dpmarket.experiments.scenarios import Scenario
from dpmarket.owner.cape import CapeSite
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.policy import OwnerPolicy, load_owner_policy
from dpmarket.owner.protocol import Owner
from dpmarket.owner.sketches import SketchPublisher, publish_to
from dpmarket.runtime.tables import PointSet, Table

POLICIES = Path(__file__).resolve().parents[2] / "deploy" / "policies"
SKETCH_SPECS = Path(__file__).resolve().parents[2] / "deploy" / "sketches"
K = 5


@pytest.fixture(scope="module")
def owner_policy() -> OwnerPolicy:
    return load_owner_policy(POLICIES / "owner.toml")


@pytest.fixture(scope="module")
def curator_policy() -> CuratorPolicy:
    return load_curator_policy(POLICIES / "curator.toml")


def test_the_shipped_policies_are_the_built_in_defaults(
    owner_policy: OwnerPolicy, curator_policy: CuratorPolicy
) -> None:
    """What a deployment without --policy runs is what the files document."""
    assert owner_policy == OwnerPolicy()
    assert curator_policy == CuratorPolicy()


def _defaults(command: click.Command) -> dict[str, Any]:
    return {p.name: p.default for p in command.params if p.name is not None}


def _ledgers(tmp_path: Path, policy: OwnerPolicy, n: int) -> list[OwnerLedger]:
    return [OwnerLedger.create(tmp_path / f"owner-{i}", policy) for i in range(n)]


# ----------------------------------------------------------------------------- request
def _request_cases(curator_policy: CuratorPolicy) -> list[tuple[str, str]]:
    return [
        (method, allocation)
        for method in curator_policy.methods
        for allocation in (ALLOCATIONS if method == "candidates" else ("sketch",))
    ]


@pytest.mark.parametrize(
    ("method", "allocation"),
    _request_cases(load_curator_policy(POLICIES / "curator.toml")),
    ids=lambda v: str(v),
)
def test_request_defaults_pass_both_policies(
    digits: Scenario,
    owner_policy: OwnerPolicy,
    curator_policy: CuratorPolicy,
    tmp_path: Path,
    method: str,
    allocation: str,
) -> None:
    """``dpmarket request -p 50 --method M`` with every other option at its default: the
    curator's ranges and terms check, then every owner opens the session on its own ledger.
    The sketch allocation runs when every owner published (charged at publication); without
    sketches the counts allocation's terms are those of ``--allocation counts``. The per-round
    methods answer the curator with exact bids, which the shipped owner policy does not serve
    (``access.allow_exact_bids = false``): they must be refused by it, naming the key, and
    pass under an owner's opt-in (with the rounds a point the demo's owners allow). Likewise
    the candidates method (the default), whose rows are picked along the curator's embedding
    (``access.allow_steered_selection = false``): refused by the shipped policy, naming the
    key and the uniform method, and served under the opt-in ``dpmarket init`` drafts."""
    options = _defaults(consumer_cli.request)
    options["allocation"] = allocation
    config = consumer_cli.summarization_config(50, method, options)
    validation = digits.validation
    curator_policy.check_request(config, validation.shape[0])
    sketches = {}
    if method == "candidates" and allocation == "sketch":
        sketches = publish_sketches(digits.owners[:K], digits.sketch_mechanism(), seed=0)

    def prepare(
        policy: OwnerPolicy, where: Path
    ) -> tuple[SummarizationSession, FailedPreconditionError | None]:
        ledgers = _ledgers(where, policy, K)
        owners = [
            LocalOwnerEndpoint(Owner(o.name, o, ledger=ledger))
            for o, ledger in zip(digits.owners[:K], ledgers, strict=True)
        ]
        session = SummarizationSession(
            SessionRequest(config, validation, np.zeros((0, validation.shape[1])), seed=0),
            owners,
            SessionContext(session_id="defaults", owner_sketches=sketches),
        )

        async def run() -> None:
            await session.prepare(check_terms=curator_policy.check_terms)
            await session.abandon()

        try:
            asyncio.run(run())  # raises on any refusal
        except FailedPreconditionError as exc:
            return session, exc
        finally:
            for ledger in ledgers:
                ledger.close()
        return session, None

    if method in ("private", "rounds"):
        refused, error = prepare(owner_policy, tmp_path / "default")
        assert error is not None and "left out: " in str(error)
        notes = refused.state.drop_notes()
        assert notes.count("access.allow_exact_bids = false") == K, notes
        owner_policy = dataclasses.replace(owner_policy, allow_exact_bids=True, rounds_per_point=8)
    if method == "candidates":
        refused, error = prepare(owner_policy, tmp_path / "default")
        assert error is not None, "the shipped owner policy must refuse steered selection"
        message = str(error)
        assert message.count("(refused the session)") == K, message
        assert message.count("access.allow_steered_selection = false") == 1, message
        assert "Use the uniform method" in message
        owner_policy = dataclasses.replace(owner_policy, allow_steered_selection=True)
    session, error = prepare(owner_policy, tmp_path)
    assert error is None, error
    assert session.allocation == ("sketch" if sketches else "counts")


# -------------------------------------------------------------------------------- CAPE
def _cape_spec(name: str) -> CapeJobSpec | CapeMeanSpec | CapeTrainingSpec:
    """The spec ``dpmarket cape NAME --feature x=0:1 [--target y]`` sends, other options at
    their defaults."""
    command = cape_group.commands[name]
    o = _defaults(command)
    features = (("x", 0.0, 1.0),)
    if name == "mean":
        return CapeMeanSpec(features, o["epsilon"], o["delta"], o["colluders"], o["calibration"])
    if name == "train":
        return CapeTrainingSpec(
            features=features,
            target="y",
            epsilon=o["epsilon"],
            delta=o["delta"],
            iterations=o["iterations"],
            learning_rate=o["learning_rate"],
            hidden=o["hidden_units"],
            clip=o["clip_norm"],
            colluders=o["colluders"],
        )
    return CapeJobSpec(
        task="linear" if name == "linreg" else "logistic",
        features=features,
        target=("y", 0.0, 1.0),
        epsilon=o["epsilon"],
        delta=o["delta"],
        colluders=o["colluders"],
        calibration=o["calibration"],
        fit_intercept=not o["no_intercept"],
    )


@pytest.mark.parametrize("name", ["mean", "linreg", "logreg", "train"])
def test_cape_defaults_pass_both_policies(
    owner_policy: OwnerPolicy, curator_policy: CuratorPolicy, tmp_path: Path, name: str
) -> None:
    spec = _cape_spec(name)
    curator_policy.check_cape(spec)
    rng = np.random.default_rng(0)
    table = Table(("x", "y"), np.c_[rng.random(40), rng.integers(0, 2, 40)], "t", binary=("y",))
    with OwnerLedger.create(tmp_path / "owner", owner_policy) as ledger:
        site = CapeSite("owner-0", table, ledger=ledger)
        assert site.open("job", spec, 0, curator="curator:curator", consumer="consumer:c") == 40


def test_every_cape_job_command_is_checked() -> None:
    jobs = {n for n, c in cape_group.commands.items() if "curator" in _defaults(c)}
    assert jobs == {"mean", "linreg", "logreg", "train"}


# ---------------------------------------------------------------------------- sketches
@pytest.mark.parametrize("declaration", sorted(p.name for p in SKETCH_SPECS.glob("*.toml")))
def test_sketch_publish_defaults_pass_both_policies(
    owner_policy: OwnerPolicy, curator_policy: CuratorPolicy, tmp_path: Path, declaration: str
) -> None:
    """Every shipped sketch declaration loads under the curator's policy, and an owner
    publishes each of its specs at the spec's default epsilon (``sketch publish --all``)
    under its own policy and ledger."""
    assert _defaults(command_at("owner", "publish"))["epsilon"] is None  # the spec's
    catalog = SketchCatalog.from_files(
        tmp_path / "curator", [SKETCH_SPECS / declaration], policy=curator_policy, seed=0
    )
    try:
        specs = catalog.specs()
        columns = specs[0].domain.names
        rng = np.random.default_rng(0)
        low = np.array([c["low"] for c in specs[0].domain.describe()])
        high = np.array([c["high"] for c in specs[0].domain.describe()])
        table = Table(tuple(columns), low + (high - low) * rng.random((50, len(columns))), "o")
        with OwnerLedger.create(tmp_path / "owner", owner_policy) as ledger:
            deliveries = publish_to(
                LocalCatalogEndpoint(catalog, "owner-0", "curator:curator"),
                SketchPublisher(ledger),
                table,
                [s.name for s in specs],
            )
        assert [d.spec for d in deliveries] == [s.name for s in specs]
    finally:
        catalog.close()


def test_points_for_the_sessions(digits: Scenario) -> None:
    """The scenario the request test runs on has the owners and points it assumes."""
    assert len(digits.owners) >= K
    assert all(isinstance(o, PointSet) for o in digits.owners)
