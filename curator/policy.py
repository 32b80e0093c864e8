"""The curator's policy: what a requester may ask for, and how much work and state it may cause.

Every requester parameter has an allowed range; a request outside it is refused with
``INVALID_ARGUMENT`` naming the range, before anything is released or charged. Noise parameters are
derived from the range-checked epsilon and delta only. The session's total spend of the owners'
privacy (:func:`dpmarket.common.summarization.terms.owner_terms`) is bounded too, and each owner
checks it against its own policy again.

The policy file is TOML (parsed with :mod:`tomllib`); every key is optional::

    [requests]                          # [low, high], both inclusive
    summary_size = [1, 5000]
    rff_dimension = [8, 2048]
    epsilon_validation_total = [0.01, 10.0]
    epsilon_owners_total = [0.01, 4.0]
    delta = [1e-12, 1e-5]
    # ... any method's parameter (dpmarket.common.summarization.methods; see DEFAULT_RANGES)
    payout_epsilon = [0.01, 4.0]        # a reward's payout release epsilon
    owners_epsilon = [0.0, 4.0]         # the session's epsilon on the owners' data, all releases
    owners_delta = [0.0, 1e-3]          # and its delta (the printed PrivAuction's ~0.1 is refused)
    validation_points = [1, 100000]     # m
    validation_values = [1, 2097152]    # (m + n0) x n: the values of the validation and seed sets
    methods = ["candidates", "private", "rounds", "uniform"]   # "greedy" is non-private
    cape_columns = [1, 1000]            # columns of a CAPE job (features, or those averaged)
    train_iterations = [1, 1000]        # CAPE gradient descent: T
    train_learning_rate = [1e-4, 10.0]
    train_hidden_units = [1, 256]
    train_clip_norm = [1e-3, 100.0]
    train_work = [1, 1000000]           # T x P, P = H (D + 2) + 1 parameters
    sketch_columns = [1, 64]            # d of a sketch spec's domain
    sketch_rff_frequencies = [1, 4096]  # m' of an RFF spec (m = 2 m')
    sketch_race_hashes = [1, 256]       # R of a RACE spec
    sketch_race_buckets = [2, 1024]     # W of a RACE spec
    sketch_hist_bins = [2, 1000]        # bins per column of a HIST spec
    sketch_dimension = [1, 65536]       # m of any spec (R W for RACE, the bins' sum for HIST)
    sketch_epsilon = [0.01, 4.0]        # every spec's epsilon range, and every published epsilon
    sketch_delta = [1e-12, 1e-5]        # delta of a Gaussian spec

    [sessions]
    max_running = 4                     # concurrent sessions (RESOURCE_EXHAUSTED beyond)
    per_consumer_per_minute = 10        # CreateSession calls per consumer (RESOURCE_EXHAUSTED)
    result_ttl_seconds = 3600           # a finished session's summary is kept this long
    fetched_result_ttl_seconds = 60     # ... or this long after its consumer fetched it

    [access]
    consumers = []                      # consumer names served; empty: any the CA certified
    allow_seeded_sessions = false       # honour a request's seed (reproducible runs only)

    [sketches]
    per_owner = 16                      # sketches the catalogue accepts from one owner
"""

from __future__ import annotations

import collections
import math
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from dpmarket.common.cape.spec import AnyCapeSpec, CapeTrainingSpec
from dpmarket.common.errors import InvalidArgumentError, ResourceExhaustedError
from dpmarket.common.market.statement import SettlementTerms
from dpmarket.common.market.terms import owner_payout_epsilon
from dpmarket.common.sketches.marginals import marginals_map
from dpmarket.common.sketches.spec import DEFAULT_DELTA, SketchDeclaration
from dpmarket.common.summarization.kernels import GAMMA_RANGE
from dpmarket.common.summarization.methods import METHODS, H2Fields, Method, SummarizationConfig
from dpmarket.common.summarization.terms import OwnerTerms

#: Allowed [low, high] of every numeric requester parameter (both inclusive). The defaults admit
#: the documented defaults of every method and bound the work one request can cause.
DEFAULT_RANGES: dict[str, tuple[float, float]] = {
    "summary_size": (1, 5000),
    "rff_dimension": (8, 2048),
    "gamma": GAMMA_RANGE,
    "epsilon_validation": (1e-4, 1.0),
    "iterations_initial": (0, 5000),
    "iterations_subsequent": (1, 20),
    "epsilon_first_epoch": (1e-4, 1.0),
    "epsilon_summary": (1e-4, 4.0),
    "quantization_step": (0.0, 1.0),
    "epsilon_auction": (1e-3, 4.0),
    "delta_owners": (1e-12, 1e-3),
    "delta_validation": (1e-12, 0.05),
    "epsilon_validation_total": (0.01, 10.0),
    "epsilon_owners_total": (0.01, 4.0),
    "delta": (1e-12, 1e-5),
    "candidate_fraction": (0.05, 1.0),
    "candidate_multiple": (1.0, 10.0),
    "allocation_share": (0.05, 0.95),
    "shrinkage": (0.1, 10.0),
    "relevance_norm_weight": (0.0, 1.0),
    "relevance_threshold": (0.0, 2.0),
    "candidate_even_share": (0.0, 1.0),
    "read_cap": (0.0, 100.0),
    "mass_cap": (0.0, 100.0),
    "auction_share": (0.05, 1.0),
    # A consumer's reward: the payout release's epsilon (each of its charges, on the validation
    # set and on every owner with a delivered point, is at most this).
    "payout_epsilon": (0.01, 4.0),
    # Derived quantities of the whole request.
    "owners_epsilon": (0.0, 4.0),
    "owners_delta": (0.0, 1e-3),
    "validation_points": (1, 100_000),
    # (m + n0) x n float64 values of a request's validation and seed sets: 16 MiB, e.g. 100,000
    # points of 20 features. CreateSession's receive limit derives from it
    # (dpmarket.curator.service.curator_limits).
    "validation_values": (1, 1 << 21),
    # CAPE jobs: columns of any job, and the public hyper-parameters of gradient descent. The
    # work of a training is bounded through T x P: one noise round sums T x P values per site,
    # and the curator averages S vectors of P values T times.
    "cape_columns": (1, 1000),
    "train_iterations": (1, 1000),
    "train_learning_rate": (1e-4, 10.0),
    "train_hidden_units": (1, 256),
    "train_clip_norm": (1e-3, 100.0),
    "train_work": (1, 1_000_000),
    # The sketch catalogue: what a spec may ask of every owner (sizes bound the owners' work
    # and the messages), and the epsilon of any publication.
    "sketch_columns": (1, 64),
    "sketch_rff_frequencies": (1, 4096),
    "sketch_race_hashes": (1, 256),
    "sketch_race_buckets": (2, 1024),
    "sketch_hist_bins": (2, 1000),
    "sketch_dimension": (1, 65536),
    "sketch_epsilon": (0.01, 4.0),
    "sketch_delta": (1e-12, 1e-5),
}


def _shown(x: float) -> str:
    """A number for a message: whole numbers in full (2097152, not 2.09715e+06), others as %g."""
    if math.isfinite(x) and float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:g}"


_SESSION_KEYS = (
    "max_running",
    "per_consumer_per_minute",
    "result_ttl_seconds",
    "fetched_result_ttl_seconds",
)


@dataclass(frozen=True)
class CuratorPolicy:
    """The curator's limits (see the module docstring for the file format).

    Attributes
    ----------
    ranges : dict of str to (float, float)
        Allowed ``[low, high]`` per requester parameter and derived quantity.
    methods : tuple of str
        Methods served. The default leaves out ``"greedy"``, whose exact embeddings are not
        private (owners must allow it too).
    max_running : int
        Sessions running at once.
    per_consumer_per_minute : int
        CreateSession calls one consumer may make in 60 seconds.
    result_ttl_seconds, fetched_result_ttl_seconds : float
        How long a finished session's summary is kept, and how long after its consumer fetched
        it (the ledger is kept for ever).
    consumers : tuple of str
        Consumer names served; empty for any consumer the CA certified.
    allow_seeded_sessions : bool
        Whether a request's seed is honoured (whoever knows the seed knows the noise).
    sketches_per_owner : int
        Sketches the catalogue accepts from one owner (``[sketches] per_owner``).
    """

    ranges: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_RANGES))
    methods: tuple[Method, ...] = ("candidates", "private", "rounds", "uniform")
    max_running: int = 4
    per_consumer_per_minute: int = 10
    result_ttl_seconds: float = 3600.0
    fetched_result_ttl_seconds: float = 60.0
    consumers: tuple[str, ...] = ()
    allow_seeded_sessions: bool = False
    sketches_per_owner: int = 16

    def __post_init__(self) -> None:
        for name, (low, high) in self.ranges.items():
            if name not in DEFAULT_RANGES:
                raise ValueError(f"unknown request parameter {name!r} in the policy's ranges")
            if not (math.isfinite(low) and math.isfinite(high) and low <= high):
                raise ValueError(f"range of {name} must be [low, high], got [{low}, {high}]")
        for method in self.methods:
            if method not in METHODS:
                raise ValueError(f"unknown method {method!r}; methods are {METHODS}")
        for name in ("max_running", "per_consumer_per_minute", "sketches_per_owner"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("result_ttl_seconds", "fetched_result_ttl_seconds"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")

    def with_overrides(self, **changes: Any) -> CuratorPolicy:
        """A copy with some attributes replaced (``ranges`` entries merge)."""
        if "ranges" in changes:
            changes["ranges"] = {**self.ranges, **changes["ranges"]}
        return replace(self, **changes)

    # ------------------------------------------------------------------------- checking
    def _check_range(self, name: str, value: float, what: str | None = None) -> None:
        low, high = self.ranges.get(name, DEFAULT_RANGES[name])
        if not (math.isfinite(value) and low <= value <= high):
            raise InvalidArgumentError(
                f"{what or name} = {_shown(value)} is outside this curator's allowed range "
                f"[{_shown(low)}, {_shown(high)}]"
            )

    def check_request(
        self,
        config: SummarizationConfig,
        validation_points: int,
        values: int | None = None,
        *,
        unread: Mapping[str, Any] | None = None,
    ) -> None:
        """Check every requester parameter of a session against its range: the method's, and
        ``unread``, those of other methods the request carried (which the session ignores).

        Parameters
        ----------
        config : SummarizationConfig
        validation_points : int
            ``m``, the validation set's points.
        values : int, optional
            ``(m + n0) x n``, the values of the validation and seed sets (not checked if None).
        unread : mapping of str to value, optional
            Parameters of other methods the request carried.

        Raises
        ------
        InvalidArgumentError
            Naming the first parameter out of range and the allowed range, or a method this
            curator does not serve.
        """
        if config.method not in self.methods:
            raise InvalidArgumentError(
                f"method {config.method!r} is not served by this curator (served: "
                f"{', '.join(self.methods)})"
            )
        self._check_range("validation_points", validation_points, "validation set size m")
        if values is not None:
            self._check_range(
                "validation_values", values, "values of the validation and seed sets (m + n0) x n"
            )
        parameters = {f.name: getattr(config, f.name) for f in fields(config)}
        for name, value in {**parameters, **(unread or {})}.items():
            if name in DEFAULT_RANGES and isinstance(value, int | float):
                if isinstance(value, bool):
                    continue
                if name == "candidate_fraction" and value == 0:
                    continue  # 0: unused (the budget is candidate_multiple * p)
                if name == "allocation_share" and value == 0:
                    continue  # 0: derived from m and K (within [0.05, 0.95])
                self._check_range(name, float(value))
        # Derived work limits: the MWEM iterations actually run.
        if isinstance(config, H2Fields):
            self._check_range("iterations_initial", config.t_init, "MWEM iterations T_init")

    def check_guarantee(self, epsilon: float, delta: float) -> None:
        """Check a job's guarantee to every owner (e.g. CAPE's per-site ``(epsilon, delta)``)
        against the ranges of the owners' spend.

        Raises
        ------
        InvalidArgumentError
            If epsilon or delta is outside ``owners_epsilon`` / ``owners_delta``.
        """
        self._check_range("owners_epsilon", epsilon, "epsilon on every owner's data")
        self._check_range("owners_delta", delta, "delta on every owner's data")

    def check_cape(self, spec: AnyCapeSpec) -> None:
        """Check a CAPE job's public parameters: the guarantee to every owner (a training's
        total over all iterations), the number of columns and, for gradient descent, every
        hyper-parameter and the work ``T x P``.

        Raises
        ------
        InvalidArgumentError
            Naming the first parameter out of range and the allowed range.
        """
        self.check_guarantee(spec.epsilon, spec.delta)
        self._check_range("cape_columns", len(spec.features), "number of columns")
        if isinstance(spec, CapeTrainingSpec):
            self._check_range("train_iterations", spec.iterations, "iterations")
            self._check_range("train_learning_rate", spec.learning_rate, "learning_rate")
            self._check_range("train_hidden_units", spec.hidden, "hidden_units")
            self._check_range("train_clip_norm", spec.clip, "clip_norm")
            self._check_range(
                "train_work",
                spec.iterations * spec.n_params,
                f"iterations x parameters ({spec.iterations} x {spec.n_params})",
            )

    def check_sketch_declaration(self, declaration: SketchDeclaration) -> None:
        """Check what a sketch spec asks of every owner: the number of columns, each map's sizes
        and dimension, the epsilon range and delta.

        Raises
        ------
        InvalidArgumentError
            Naming the declaration, the first parameter out of range and the allowed range.
        """
        where = f"sketch spec {declaration.name}"
        d = declaration.domain.n_attributes
        self._check_range("sketch_columns", d, f"{where}: number of columns")
        low, high = declaration.epsilon_range
        self._check_range("sketch_epsilon", low, f"{where}: lowest epsilon")
        self._check_range("sketch_epsilon", high, f"{where}: highest epsilon")
        if declaration.noise == "gaussian":
            self._check_range("sketch_delta", declaration.delta, f"{where}: delta")
        for kind, params in declaration.maps:
            if kind == "rff":
                m_prime = params["frequencies"]
                self._check_range("sketch_rff_frequencies", m_prime, f"{where}: RFF m'")
                dimension = 2 * m_prime
            elif kind == "race":
                self._check_range("sketch_race_hashes", params["hashes"], f"{where}: RACE R")
                self._check_range("sketch_race_buckets", params["buckets"], f"{where}: RACE W")
                dimension = params["hashes"] * params["buckets"]
            elif kind == "hist":
                bins = params["bins"]
                per_column = bins if isinstance(bins, list) else [bins] * d
                for b in per_column:
                    self._check_range("sketch_hist_bins", b, f"{where}: HIST bins")
                dimension = sum(per_column)
            else:
                # A marginals map: its cells per column are bounded as HIST bins are, its delta
                # as a Gaussian sketch's; its dimension is the number of 1-way cells.
                fmap = marginals_map(declaration.domain, params["bins"], cuts=params.get("cuts"))
                for b in fmap.block_sizes:
                    self._check_range("sketch_hist_bins", int(b), f"{where}: marginals cells")
                delta = params.get("delta", declaration.delta or DEFAULT_DELTA)
                self._check_range("sketch_delta", delta, f"{where}: marginals delta")
                dimension = fmap.dimension
            self._check_range("sketch_dimension", dimension, f"{where}: {kind} dimension m")

    def check_sketch_epsilon(self, epsilon: float, delta: float) -> None:
        """Check a published sketch's epsilon (and delta, when > 0) against the policy.

        Raises
        ------
        InvalidArgumentError
            If either is outside ``sketch_epsilon`` / ``sketch_delta``.
        """
        self._check_range("sketch_epsilon", epsilon, "the sketch's epsilon")
        if delta > 0:
            self._check_range("sketch_delta", delta, "the sketch's delta")

    def check_terms(self, terms: OwnerTerms, settlement: SettlementTerms | None = None) -> None:
        """Check the session's total spend of the owners' privacy against the policy, its
        payout release included: called when the session is quoted, before any owner is opened
        or charged.

        Parameters
        ----------
        terms : OwnerTerms
        settlement : SettlementTerms, optional
            The session's settlement terms; with a reward, the payout release's epsilon is
            checked against ``payout_epsilon`` (it bounds the release's charge on the
            consumer's validation set, ``epsilon_V <= epsilon``), and what the release charges
            each owner with a delivered point (``epsilon_O``,
            :func:`~dpmarket.common.market.terms.owner_payout_epsilon`) counts in the owners'
            epsilon, as each owner's own check counts it.

        Raises
        ------
        InvalidArgumentError
            If the payout epsilon, or the session's epsilon (its payout's included) or delta on
            the owners' data, is out of range (a non-private session is refused by
            :meth:`check_request` unless ``"greedy"`` is served).
        """
        payout = 0.0
        if settlement is not None and settlement.rule() is not None:
            self._check_range(
                "payout_epsilon", settlement.payout_epsilon, "the reward's payout epsilon"
            )
            payout = owner_payout_epsilon(settlement)
        if terms.non_private:
            return
        what = "the session's epsilon on owners' data"
        if payout > 0:
            what += f" (its terms' {terms.epsilon:g} and its payout release's {payout:g})"
        self._check_range("owners_epsilon", terms.epsilon + payout, what)
        self._check_range("owners_delta", terms.delta, "the session's delta on owners' data")


def policy_from_mapping(data: Mapping[str, Any], *, source: str = "policy") -> CuratorPolicy:
    """Build a :class:`CuratorPolicy` from parsed TOML.

    Raises
    ------
    ValueError
        For an unknown section or key, a wrong type or an out-of-range value, naming ``source``
        and the key.
    """
    known = {"requests", "sessions", "access", "sketches"}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"{source}: unknown section(s) {sorted(unknown)}; known: {sorted(known)}")
    changes: dict[str, Any] = {}
    ranges: dict[str, tuple[float, float]] = {}
    for key, value in dict(data.get("requests", {})).items():
        if key == "methods":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{source}: requests.methods must be a list of method names")
            changes["methods"] = tuple(value)
            continue
        if key not in DEFAULT_RANGES:
            raise ValueError(
                f"{source}: unknown key requests.{key}; known: methods, "
                + ", ".join(sorted(DEFAULT_RANGES))
            )
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        ):
            raise ValueError(f"{source}: requests.{key} must be [low, high], got {value!r}")
        ranges[key] = (float(value[0]), float(value[1]))
    sessions = dict(data.get("sessions", {}))
    for key, value in sessions.items():
        if key not in _SESSION_KEYS:
            raise ValueError(f"{source}: unknown key sessions.{key}; known: {_SESSION_KEYS}")
        changes[key] = value
    access = dict(data.get("access", {}))
    for key, value in access.items():
        if key == "consumers":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{source}: access.consumers must be a list of names")
            changes["consumers"] = tuple(value)
        elif key == "allow_seeded_sessions":
            if not isinstance(value, bool):
                raise ValueError(f"{source}: access.allow_seeded_sessions must be true or false")
            changes["allow_seeded_sessions"] = value
        else:
            raise ValueError(
                f"{source}: unknown key access.{key}; known: consumers, allow_seeded_sessions"
            )
    for key, value in dict(data.get("sketches", {})).items():
        if key != "per_owner":
            raise ValueError(f"{source}: unknown key sketches.{key}; known: per_owner")
        changes["sketches_per_owner"] = value
    try:
        return CuratorPolicy().with_overrides(ranges=ranges, **changes)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def load_curator_policy(path: str | Path) -> CuratorPolicy:
    """Read a curator policy file (TOML).

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If it is not valid TOML or holds an unknown key or a bad value (naming the file).
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"curator policy file {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{p}: not valid TOML: {exc}") from None
    return policy_from_mapping(data, source=str(p))


#: Window of the per-consumer request rate, seconds.
RATE_WINDOW_SECONDS = 60.0


class RequestRate:
    """Limits how many requests each consumer makes in a sliding 60-second window.

    Parameters
    ----------
    per_minute : int
        The most requests (session or job creations, failed ones included) per consumer.
    clock : callable
        Seconds (tests inject one).
    """

    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.time) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._attempts: dict[str, collections.deque[float]] = collections.defaultdict(
            collections.deque
        )

    def check(self, consumer: str) -> None:
        """Count a request of ``consumer``.

        Raises
        ------
        ResourceExhaustedError
            If it already made ``per_minute`` requests in the last 60 seconds (saying when to
            retry); the refused request is not counted.
        """
        now = self.clock()
        attempts = self._attempts[consumer]
        while attempts and attempts[0] <= now - RATE_WINDOW_SECONDS:
            attempts.popleft()
        if len(attempts) >= self.per_minute:
            wait = attempts[0] + RATE_WINDOW_SECONDS - now
            raise ResourceExhaustedError(
                f"{consumer} may create {self.per_minute} sessions per minute; retry in "
                f"{wait:.0f} s"
            )
        attempts.append(now)
