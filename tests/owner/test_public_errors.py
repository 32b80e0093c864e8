"""Every refusal of an owner depends on public inputs only: the same request against owners that
hold different data of the same public shape (row count, columns, declared 0/1 columns, policy)
gets the same error class and the same text, on every error path of summarization, CAPE and
secure aggregation. Values outside a request's bounds are clamped (counted in the owner's log),
never refused; what was clamped changes the charged release only.

Each test runs one script of requests against two owners and compares the outcomes step by step;
it fails as soon as an outcome varies with the data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.common.cape.agreement import SizeAttestation, plan_statement
from dpmarket.common.cape.spec import CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.errors import DPMarketError
from dpmarket.common.secagg.crypto import EcdsaSigner
from dpmarket.common.secagg.fixedpoint import FixedPoint
from dpmarket.common.secagg.protocol import RoundParams
from dpmarket.common.summarization.rff import draw_rff_params
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.curator.secagg import aggregate
from dpmarket.deploy.pki import init_ca, issue_all, owner_pins
from dpmarket.owner.cape import CapeSite
from dpmarket.owner.local import LocalSecureAggregationEndpoint
from dpmarket.owner.protocol import Owner
from dpmarket.owner.secagg import SiteIdentity, SiteRounds
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.tables import PointSet, Table

N, D_RFF = 30, 16
CURATOR, CONSUMER = "curator:c", "consumer:x"
COLUMNS = ("bmi", "age", "sex", "spam")

Outcome = tuple[str, str]


def _outcome(step: Callable[[], Any]) -> Outcome:
    """``("ok", "")`` or the error's class and text."""
    try:
        step()
    except (DPMarketError, ValueError) as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


def _same_outcomes(
    make: Callable[[int], Any], script: list[tuple[str, Callable[[Any], Any]]]
) -> list[Outcome]:
    """Run ``script`` against owners built from two data seeds; assert every step's outcome is
    the same at both; return the outcomes."""
    owners = [make(0), make(1)]
    outcomes = []
    for name, step in script:
        seen = [_outcome(lambda o=o, step=step: step(o)) for o in owners]  # type: ignore[misc]
        assert seen[0] == seen[1], (name, seen)
        outcomes.append(seen[0])
    return outcomes


# ------------------------------------------------------------------------------- summarization
def _owner(seed: int) -> Owner:
    rng = np.random.default_rng(seed)
    scale = 1.0 if seed == 0 else 40.0  # very different values, the same public shape
    return Owner(
        "o",
        PointSet(scale * rng.normal(size=(N, 3)), rng.integers(0, 2, N), "o"),
        max_sessions=2,
        max_rff_dimension=64,
    )


def test_every_summarization_refusal_is_the_same_whatever_the_owner_holds() -> None:
    rff = draw_rff_params(3, D_RFF, 0.5, np.random.default_rng(1))
    wide = draw_rff_params(4, D_RFF, 0.5, np.random.default_rng(1))
    big = draw_rff_params(3, 128, 0.5, np.random.default_rng(1))
    counts = OwnerTerms(SessionMethod.CANDIDATES_COUNTS, 1.0, 0.0)
    rounds = OwnerTerms(SessionMethod.PRIVATE, 1.0, 1e-6, max_rounds=2)
    uniform = OwnerTerms(SessionMethod.UNIFORM, 0.0, 0.0)
    g = np.full(D_RFF, 0.05)

    def embed_after_bid(o: Owner) -> None:
        o.bid("t", 1, g, 0)
        o.set_validation_embedding("t", 2 * g)

    script: list[tuple[str, Callable[[Owner], Any]]] = [
        ("empty id", lambda o: o.open_session("", rff, 0, terms=counts)),
        ("wrong feature count", lambda o: o.open_session("s", wide, 0, terms=counts)),
        ("d above the limit", lambda o: o.open_session("s", big, 0, terms=counts)),
        ("open", lambda o: o.open_session("s", rff, 0, terms=counts)),
        ("open again", lambda o: o.open_session("s", rff, 0, terms=counts)),
        ("open a second", lambda o: o.open_session("t", rff, 0, terms=rounds)),
        ("beyond max sessions", lambda o: o.open_session("u", rff, 0, terms=uniform)),
        ("unknown session", lambda o: o.bid("nope", 1, g, 0)),
        ("another curator's", lambda o: o.bid("t", 1, g, 0, curator="curator:other")),
        # The counts session: its steps in order, each once; nothing of another method.
        ("bid under counts terms", lambda o: o.bid("s", 1, g, 0)),
        ("sample under counts terms", lambda o: o.sample_uniform("s", 1)),
        ("count before embedding", lambda o: o.noisy_relevant_count("s", 0.0)),
        ("candidates before embedding", lambda o: o.propose_candidates("s", 1)),
        ("embedding of wrong size", lambda o: o.set_validation_embedding("s", g[:3])),
        ("embedding with nan", lambda o: o.set_validation_embedding("s", np.full(D_RFF, np.nan))),
        ("embedding", lambda o: o.set_validation_embedding("s", g)),
        ("the same embedding", lambda o: o.set_validation_embedding("s", g)),
        ("another embedding", lambda o: o.set_validation_embedding("s", 2 * g)),
        ("candidates before the count", lambda o: o.propose_candidates("s", 1)),
        ("nan threshold", lambda o: o.noisy_relevant_count("s", float("nan"))),
        ("count", lambda o: o.noisy_relevant_count("s", 0.0)),
        ("count again", lambda o: o.noisy_relevant_count("s", 0.0)),
        ("count at another threshold", lambda o: o.noisy_relevant_count("s", 0.5)),
        ("no candidates", lambda o: o.propose_candidates("s", 0)),
        ("more uniform than candidates", lambda o: o.propose_candidates("s", 1, uniform_count=2)),
        ("negative uniform", lambda o: o.propose_candidates("s", 1, uniform_count=-1)),
        ("more candidates than unsent", lambda o: o.propose_candidates("s", N + 1)),
        ("candidates", lambda o: o.propose_candidates("s", N - 1)),
        ("candidates again", lambda o: o.propose_candidates("s", 1)),
        ("close", lambda o: o.close_session("s")),
        ("close again", lambda o: o.close_session("s")),
        # The rounds session.
        ("bid before embedding", lambda o: o.bid("t", 1, g, 0)),
        ("count under rounds terms", lambda o: o.noisy_relevant_count("t", 0.0)),
        ("rounds embedding", lambda o: o.set_validation_embedding("t", g)),
        ("candidates under rounds terms", lambda o: o.propose_candidates("t", 1)),
        ("wrong round", lambda o: o.bid("t", 2, g, 0)),
        ("negative summary size", lambda o: o.bid("t", 1, g, -1)),
        ("summary embedding with inf", lambda o: o.bid("t", 1, np.full(D_RFF, np.inf), 0)),
        ("release before a bid", lambda o: o.release_point("t", 1)),
        ("another embedding after a bid", embed_after_bid),
        ("release another round", lambda o: o.release_point("t", 2)),
        ("release", lambda o: o.release_point("t", 1)),
        ("release twice", lambda o: o.release_point("t", 1)),
        ("second round", lambda o: o.bid("t", 2, g, 1)),
        ("beyond the terms' rounds", lambda o: o.bid("t", 3, g, 1)),
        ("close the rounds", lambda o: o.close_session("t")),
        # The uniform session.
        ("open uniform", lambda o: o.open_session("u", rff, 0, terms=uniform)),
        ("embedding under uniform terms", lambda o: o.set_validation_embedding("u", g)),
        ("bid under uniform terms", lambda o: o.bid("u", 1, g, 0)),
        ("more samples than the points", lambda o: o.sample_uniform("u", N + 1)),
        ("sample", lambda o: o.sample_uniform("u", N - 1)),
        ("sample again", lambda o: o.sample_uniform("u", 1)),
        ("close uniform", lambda o: o.close_session("u")),
    ]
    outcomes = _same_outcomes(_owner, script)
    refused = [name for (name, _), (kind, _) in zip(script, outcomes, strict=True) if kind != "ok"]
    assert len(refused) >= 38, refused  # the script walks the error paths, not only successes
    assert outcomes[[n for n, _ in script].index("more samples than the points")] == (
        "InvalidArgumentError",
        f"count {N + 1} exceeds the {N} points not yet sent",
    )
    data = Owner("no-data", None)
    assert _outcome(lambda: data.open_session("s", rff, 0, terms=uniform)) == (
        "FailedPreconditionError",
        "owner no-data holds no point set to summarize",
    )


# ---------------------------------------------------------------------------------------- CAPE
def _table(seed: int) -> Table:
    """Body mass index, age, a 1/2-coded ``sex`` and a 0/1 ``spam`` declared 0/1. Owner 0's
    values lie in the requests' bounds; owner 1's lie far outside them."""
    rng = np.random.default_rng(seed)
    shift = 0.0 if seed == 0 else 500.0
    values = np.column_stack(
        [
            rng.uniform(15, 40, N) + shift,
            rng.uniform(20, 80, N) - shift,
            rng.integers(1, 3, N).astype(np.float64),
            rng.integers(0, 2, N).astype(np.float64),
        ]
    )
    return Table(COLUMNS, values, "owner", binary=("spam",))


#: The owner's signing key and the other site's (the plan's row counts are signed).
KEYS = {name: ec.generate_private_key(ec.SECP256R1()) for name in ("a-other", "owner")}


def _site(seed: int) -> CapeSite:
    trusted = {name: key.public_key() for name, key in KEYS.items()}
    identity = SiteIdentity("owner", KEYS["owner"], b"", None).trusting(trusted)
    return CapeSite("owner", _table(seed), max_jobs=3, identity=identity)


def _plan(
    site: CapeSite,
    job: str,
    spec: Any,
    sites: list[str],
    sizes: list[int],
    *,
    curator: str = CURATOR,
    first_iteration: int = 0,
) -> Any:
    """Plan ``job`` with every site's row count signed by that site's key (S_C = 1, the
    owners' default floor), as a curator relays them."""
    attestations = {}
    for name, rows in zip(sites, sizes, strict=True):
        statement = plan_statement(job, spec, sites, 1, first_iteration, name, rows)
        signer = EcdsaSigner(KEYS.get(name, KEYS["a-other"]))
        attestations[name] = SizeAttestation(name, rows, signer.sign(statement))
    return site.plan(
        job, sites, 1, attestations, {}, curator=curator, first_iteration=first_iteration
    )


BOUNDS = (("bmi", 10.0, 60.0), ("age", 0.0, 100.0))
MEAN = CapeMeanSpec(BOUNDS, 1.0, 1e-6)
PROBE = CapeMeanSpec((("bmi", 1000.0, 2000.0),), 1.0, 1e-6)
LINEAR = CapeJobSpec("linear", BOUNDS, ("sex", 0.0, 1.0), 1.0, 1e-6)
LOGISTIC = CapeJobSpec("logistic", BOUNDS, ("spam", 0.0, 1.0), 1.0, 1e-6)
LOGISTIC_SEX = CapeJobSpec("logistic", BOUNDS, ("sex", 0.0, 1.0), 1.0, 1e-6)
TRAIN_SEX = CapeTrainingSpec(BOUNDS, "sex", 1.0, 1e-5, 3, 1.0, 2, 1.0)
MISSING = CapeMeanSpec((("weight", 0.0, 1.0),), 1.0, 1e-6)


def _open(spec: Any, job: str = "j") -> Callable[[CapeSite], Any]:
    return lambda s: s.open(job, spec, 1, curator=CURATOR, consumer=CONSUMER)


def test_every_cape_refusal_is_the_same_whatever_the_owner_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``sex`` holds 1 and 2: a logistic regression or a training on it is refused because the
    owner did not declare it 0/1 (at both owners, with the same text, naming no row or value);
    the bounds probe and every job with values outside its bounds open (clamped); the plan and
    release refusals depend on the request and the public row count only."""
    params = RoundParams.create(["a-other", "owner"], 2, 2, FixedPoint(1.0, 20, 2), colluders=1)
    bad_sites = RoundParams.create(["owner", "z-other"], 2, 2, FixedPoint(1.0, 20, 2), colluders=1)
    total = np.zeros(2)

    script: list[tuple[str, Callable[[CapeSite], Any]]] = [
        ("empty job id", lambda s: s.open("", MEAN, 1, curator=CURATOR, consumer=CONSUMER)),
        ("missing column", _open(MISSING)),
        ("logistic on an undeclared target", _open(LOGISTIC_SEX)),
        ("training on an undeclared target", _open(TRAIN_SEX)),
        ("bounds probe opens", _open(PROBE, "probe")),
        ("linear opens, clamped", _open(LINEAR, "linear")),
        ("logistic on a declared target", _open(LOGISTIC, "logistic")),
        ("beyond max jobs", _open(MEAN, "one-more")),
        ("probe again", _open(PROBE, "probe")),
        ("unknown job", lambda s: _plan(s, "nope", PROBE, ["owner", "z"], [N, N])),
        (
            "another curator's",
            lambda s: _plan(s, "probe", PROBE, ["owner", "z"], [N, N], curator="c:x"),
        ),
        ("not a site", lambda s: _plan(s, "probe", PROBE, ["a", "z"], [N, N])),
        ("unsorted", lambda s: _plan(s, "probe", PROBE, ["z", "owner"], [N, N])),
        (
            "wrong size (aborts that job)",
            lambda s: _plan(s, "linear", LINEAR, ["a-other", "owner"], [N, N + 1]),
        ),
        (
            "first iteration of a statistic",
            lambda s: _plan(s, "probe", PROBE, ["a-other", "owner"], [N, N], first_iteration=1),
        ),
        ("release before a plan", lambda s: s.release("probe", b"r", total[:1], curator=CURATOR)),
        ("input before a plan", lambda s: s.noise_input("probe", params)),
        ("plan", lambda s: _plan(s, "probe", PROBE, ["a-other", "owner"], [N, N])),
        ("input of another round's sites", lambda s: s.noise_input("probe", bad_sites)),
        (
            "release of a round never drawn",
            lambda s: s.release("probe", b"r", total[:1], curator=CURATOR),
        ),
        (
            "gradient of a statistic",
            lambda s: s.release_gradient("probe", b"r", 0, total, total, curator=CURATOR),
        ),
        ("close", lambda s: s.close("probe", curator=CURATOR)),
        ("close again", lambda s: s.close("probe", curator=CURATOR)),
    ]
    with caplog.at_level("INFO", logger="dpmarket.owner.cape"):
        outcomes = _same_outcomes(_site, script)
    names = [n for n, _ in script]
    assert outcomes[names.index("logistic on an undeclared target")] == (
        "InvalidArgumentError",
        "column 'sex' is not a 0/1 column of owner owner: a logistic regression needs a target "
        "its owners declare 0/1 when they start (owner serve --binary-column); this owner "
        "declares ['spam']",
    )
    for name in ("bounds probe opens", "linear opens, clamped", "logistic on a declared target"):
        assert outcomes[names.index(name)] == ("ok", ""), name
    refused = [n for n, (kind, _) in zip(names, outcomes, strict=True) if kind != "ok"]
    assert len(refused) >= 16, refused
    # Only the owner's own log says what was clamped: all 30 bmi values of owner 1 for the probe.
    assert "'bmi' 30 of 30 rows" in caplog.text


def test_a_probe_with_chosen_bounds_changes_only_the_charged_release(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The bounds-probing mean against an owner whose values all lie below the bounds: the owner
    releases the mean of its values clamped to the bounds (here exactly 1000 before noise) and
    the same for any data below them; the count of clamped rows is in its log only."""
    releases = []
    with caplog.at_level("INFO", logger="dpmarket.owner.cape"):
        for seed in (0, 1):
            site = _site(seed)
            site.open("probe", PROBE, 1, curator=CURATOR, consumer=CONSUMER)
            plan = _plan(site, "probe", PROBE, ["a-other", "owner"], [N, N])
            params = RoundParams.create(
                ["a-other", "owner"], 2, plan.size, FixedPoint(1e6, 20, 2), colluders=1
            )
            site.noise_input("probe", params)
            site.round_finished("probe", params.round_id, ["a-other", "owner"])
            releases.append(
                site.release("probe", params.round_id, np.zeros(plan.size), curator=CURATOR)
            )
    # The same seed draws the same noise: the releases are equal whatever the values below 1000.
    np.testing.assert_array_equal(releases[0], releases[1])
    assert caplog.text.count("'bmi' 30 of 30 rows") == 2


# ------------------------------------------------------------------------- secure aggregation
SITES = ("site-a", "site-b", "site-c")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    init_ca(directory)
    issue_all(directory, [Identity("owner", s) for s in SITES])
    return directory


def _rounds(pki: Path, inputs: dict[str, np.ndarray]) -> Iterator[tuple[str, SiteRounds]]:
    for i, site in enumerate(SITES):
        ca, cert, key = identity_files(pki, Identity("owner", site))
        identity = SiteIdentity.from_pem(
            site, key.read_bytes(), cert.read_bytes(), ca.read_bytes(), peers=owner_pins(pki)
        )
        yield (
            site,
            SiteRounds(
                identity,
                lambda job, params, s=site: inputs[s],  # type: ignore[misc]
                lambda job, i=i: np.random.default_rng(100 + i),  # type: ignore[misc]
            ),
        )


def test_an_input_outside_the_rounds_range_is_refused_without_naming_it(
    pki: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A curator that sets the fixed-point range below a site's input (its secret noise draw)
    learns that the site dropped and the range it set, never the value: two draws give the same
    text; the value is in the site's own log."""
    params = RoundParams.create(SITES, 2, 4, FixedPoint(clip=1.0, resolution_bits=20, sites=3))
    reasons = []
    with caplog.at_level("WARNING", logger="dpmarket.owner.secagg"):
        for secret in (1.7319, -42.5):
            inputs = {s: np.full(4, 0.25) for s in SITES}
            inputs["site-c"] = np.array([0.0, secret, 0.0, 0.0])
            endpoints = {s: LocalSecureAggregationEndpoint(s, r) for s, r in _rounds(pki, inputs)}
            outcome = asyncio.run(aggregate(endpoints, f"job-{secret}", params))
            assert outcome.survivors == ("site-a", "site-b")
            reasons.append(outcome.dropped["site-c"])
    assert reasons[0] == reasons[1]
    assert "does not fit the round's fixed-point range [-1, 1]" in reasons[0]
    assert "1.7319" not in reasons[0] and "1.7319" in caplog.text
