"""The owner's own privacy and data-release policy, read from a TOML file.

An owner trusts no other party (docs/how-it-works.md, Trust model): whatever the curator asks, it
releases only what its policy allows, and its :class:`~dpmarket.owner.ledger.OwnerLedger` charges
every release against this policy before it happens.

File layout (every key optional; the defaults are those of :class:`OwnerPolicy`; an example with
comments is ``deploy/policies/owner.toml``)::

    [budget]      # over the window, summed over every session (basic composition)
    epsilon = 10.0
    delta = 1e-5
    window_days = 0     # 0: the owner's lifetime; > 0: a rolling window of that many days
    points = 20000      # raw points released
    [session]     # to one session
    epsilon = 2.0
    delta = 1e-6
    points = 1000
    points_fraction = 0.25   # and at most this fraction of the owner's table (rounded down)
    rounds_per_point = 1     # Bid rounds a session may ask per raw point it may receive
    [access]
    curators = ["curator"]      # names of the curator certificates this owner serves
    allow_non_private = false   # whether exact (epsilon = inf) releases may be served at all
    allow_exact_bids = false    # whether per-round methods (exact bids to the curator) are served
    allow_steered_selection = false  # whether the candidates methods (rows picked along the
                                     # curator's embedding) are served
    allow_reward_disclosure = false  # whether sessions with a consumer's reward are served (its
                                     # statement tells each owner its count in the summary)
    [limits]
    max_sessions = 8
    session_idle_timeout_seconds = 600
    max_rff_dimension = 4096
    session_memory_mib = 4096   # the most memory one session's work may need (estimated)
    step_seconds = 3600         # the longest one step (a pass over the table) may take (estimated)
    [sketches]    # private sketches published to a curator's catalogue (dpmarket owner publish)
    publish = true      # whether this owner publishes sketches at all
    epsilon = 1.0       # the most epsilon one sketch may spend
    [cape]        # CAPE jobs (joint estimates with zero-sum noise) and their secure aggregation
    min_colluders = 1   # the fewest colluding owners (S_C) a job must defend against
    [peers]       # the owners accepted as CAPE / secure-aggregation peers, with their key pins
    owner-1 = "3f0c…"   # 64 hex digits: SHA-256 of the owner's public key (dpmarket pki show)
    [prices]      # what a session pays this owner, in credits (decimal strings); default 0: free
    per_point_read = "0.01"       # per raw point the curator reads
    per_point_delivered = "0.05"  # per point of this owner's in the delivered summary
    per_epsilon = "2"             # per unit of epsilon charged to this ledger
    minimum = "1"                 # the least a session pays (the components topped up)

Unknown sections or keys are refused (a misspelt key would otherwise leave a default in force
silently); ``[peers]`` is the one section whose keys are names (owner names, each a DNS label).
``[prices]`` holds amounts of credits as decimal strings (a float is refused: its binary value
is rarely the decimal written), read by
:meth:`~dpmarket.common.market.pricing.OwnerPrices.from_table`.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from fractions import Fraction
from pathlib import Path
from typing import Any

from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.runtime.identity import Identity, normalize_fingerprint

__all__ = [
    "DEFAULT_MIN_COLLUDERS",
    "DEFAULT_POINTS_FRACTION",
    "OwnerPolicy",
    "load_owner_policy",
]

#: The default floor on the colluders ``S_C`` a CAPE job must defend against
#: (``cape.min_colluders``): one other owner sharing everything it holds with the curator.
DEFAULT_MIN_COLLUDERS = 1
#: The default share of an owner's table one session may receive (``session.points_fraction``).
#: The default method (candidates) reads at most ``3p`` raw points in all, split over the K
#: owners (``3p / K`` each when split evenly): at a quarter, every owner serves an even share
#: of any summary up to a twelfth of the pooled rows (``p <= N / 12``, ``N = K n``), and an
#: allocation that leans on one owner takes the rest from the others, while no single session
#: reads more than a quarter of any owner's table.
DEFAULT_POINTS_FRACTION = 0.25

# (section, key) in the file -> field of OwnerPolicy, in file order.
_KEYS: dict[tuple[str, str], str] = {
    ("budget", "epsilon"): "epsilon_total",
    ("budget", "delta"): "delta_total",
    ("budget", "window_days"): "window_days",
    ("budget", "points"): "points_total",
    ("session", "epsilon"): "epsilon_per_session",
    ("session", "delta"): "delta_per_session",
    ("session", "points"): "points_per_session",
    ("session", "points_fraction"): "points_fraction_per_session",
    ("session", "rounds_per_point"): "rounds_per_point",
    ("access", "curators"): "curators",
    ("access", "allow_non_private"): "allow_non_private",
    ("access", "allow_exact_bids"): "allow_exact_bids",
    ("access", "allow_steered_selection"): "allow_steered_selection",
    ("access", "allow_reward_disclosure"): "allow_reward_disclosure",
    ("limits", "max_sessions"): "max_sessions",
    ("limits", "session_idle_timeout_seconds"): "session_idle_timeout_seconds",
    ("limits", "max_rff_dimension"): "max_rff_dimension",
    ("limits", "session_memory_mib"): "session_memory_mib",
    ("limits", "step_seconds"): "step_seconds",
    ("sketches", "publish"): "publish_sketches",
    ("sketches", "epsilon"): "epsilon_per_sketch",
    ("cape", "min_colluders"): "cape_min_colluders",
}
#: The ``[access]`` keys that are true or false.
_ACCESS_FLAGS = (
    "allow_non_private",
    "allow_exact_bids",
    "allow_steered_selection",
    "allow_reward_disclosure",
)
_KEY_OF_FIELD = {name: f"{section}.{key}" for (section, key), name in _KEYS.items()}
_SECTIONS = tuple(dict.fromkeys(section for section, _ in _KEYS))
_SECTION_COMMENTS = {
    "budget": "over the window, summed over every session (basic composition)",
    "session": "per session",
    "access": "who is served, and how",
    "limits": "resources of the owner service",
    "sketches": "private sketches published to a curator's catalogue",
    "cape": "CAPE jobs and their secure aggregation",
}
#: The section of pinned peers: ``name = "pin"`` lines rather than fixed keys.
_PEERS = "peers"
_PEERS_COMMENT = (
    "the owners accepted as CAPE / secure-aggregation peers: name = SHA-256 of its public key"
)
#: The section of the owner's prices (:class:`~dpmarket.common.market.pricing.OwnerPrices`).
_PRICES = "prices"
_PRICES_COMMENT = "what a session pays this owner, in credits"
#: The default prices: free (an owner that sets none charges nothing for any session).
_FREE = OwnerPrices()


def _key(name: str) -> str:
    return f"{_KEY_OF_FIELD[name]} ({name})"


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{_key(name)} must be a number, got {value!r}")
    return float(value)


def _integer(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{_key(name)} must be an integer >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{_key(name)} must be an integer >= 1, got {value}")
    return value


def _epsilon(value: Any, name: str) -> float:
    x = _number(value, name)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{_key(name)} must be finite and > 0, got {value!r}")
    return x


def _delta(value: Any, name: str) -> float:
    x = _number(value, name)
    if not 0.0 <= x < 1.0:
        raise ValueError(f"{_key(name)} must be in [0, 1), got {value!r}")
    return x


def _toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # shortest round-tripping form, valid TOML for finite floats
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_string(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def _peers(value: Any) -> tuple[tuple[str, str], ...]:
    """``peers`` as sorted ``(name, pin)`` pairs, each name an owner name and each pin
    normalized (:func:`dpmarket.runtime.identity.normalize_fingerprint`)."""
    items = value.items() if isinstance(value, Mapping) else value
    if isinstance(items, str) or not isinstance(items, Iterable):
        raise ValueError(f"[{_PEERS}] must map owner names to pins, got {value!r}")
    out: dict[str, str] = {}
    for item in items:
        if not (isinstance(item, tuple | list) and len(item) == 2):
            raise ValueError(f"[{_PEERS}] must map owner names to pins, got {value!r}")
        name, pin = item
        try:
            Identity("owner", name)
        except ValueError as exc:
            raise ValueError(f"[{_PEERS}]: {name!r} is not an owner name: {exc}") from None
        if name in out:
            raise ValueError(f"[{_PEERS}] lists {name!r} twice")
        try:
            out[name] = normalize_fingerprint(pin)
        except ValueError as exc:
            raise ValueError(f"[{_PEERS}] {name}: {exc}") from None
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class OwnerPolicy:
    """What one data owner agrees to release, whatever the curator asks.

    Every field is validated on construction; numbers given as ``int`` for a ``float`` field are
    converted, and ``curators`` given as a list becomes a tuple.

    Attributes
    ----------
    epsilon_total : float
        Epsilon the owner's data may lose over the window, summed over every session (basic
        composition); finite, > 0. File key ``budget.epsilon``.
    delta_total : float
        Delta over the window, summed likewise; in [0, 1). ``budget.delta``.
    window_days : float
        0: the budgets above cover the owner's whole lifetime; > 0: they cover every rolling
        window of that many days (a charge stops counting ``window_days`` after it was made).
        ``budget.window_days``.
    points_total : int
        Raw points released over the window, >= 1. ``budget.points``.
    epsilon_per_session : float
        Epsilon one session may spend; finite, > 0 and <= ``epsilon_total``.
        ``session.epsilon``.
    delta_per_session : float
        Delta one session may spend; in [0, 1) and <= ``delta_total``. ``session.delta``.
    points_per_session : int
        Raw points released to one session; >= 1 and <= ``points_total``.
        ``session.points``.
    points_fraction_per_session : float
        The most raw points one session may receive as a fraction of this owner's table, in
        (0, 1]: a session gets at most ``floor(fraction * rows)`` of them, and at most
        ``points_per_session`` (:meth:`session_points`). ``session.points_fraction``; default
        :data:`DEFAULT_POINTS_FRACTION`.
    rounds_per_point : int
        The most Bid rounds a per-round session (private, rounds, greedy) may ask for each raw
        point it may receive from this owner, >= 1: terms whose ``max_rounds`` exceeds
        ``rounds_per_point`` times the session's point allowance are refused when the session
        opens (:func:`dpmarket.owner.terms.check_terms`, which derives why).
        ``session.rounds_per_point``; default 1.
    allow_non_private : bool
        Whether non-private sessions (exact embeddings, epsilon = inf) may be served at all.
        ``access.allow_non_private``.
    allow_exact_bids : bool
        Whether the methods whose steps answer the curator with exact values computed from this
        owner's rows may be served: the per-round methods (private, rounds, greedy), whose
        ``Bid`` returns the exact score of the owner's best point for a direction the curator
        chooses. Their terms' epsilon pays for what the curator releases (to the owners and the
        consumer), not for the bids the curator itself sees: the paper's auction trusts the
        curator with exact bids. Off (the default), such terms are refused when the session
        opens (``FAILED_PRECONDITION`` naming this key) and nothing is charged; greedy needs
        ``allow_non_private`` too. ``access.allow_exact_bids``.
    allow_steered_selection : bool
        Whether the methods that pick the rows they send by their score along an embedding the
        curator chooses may be served: the candidates methods (``candidates-counts``,
        ``candidates-sketch``) and their hashes mode, whose proposals are the rows the owner's
        local greedy finds most relevant to the validation embedding (and h1's parameters) the
        curator sends. Each row is charged as a raw point, but which row is chosen tells the
        curator how it compares with every row not sent, and no epsilon charges that: a curator
        that steers the greedy (h1 monotone in one column, one point asked) receives the row
        with that column's largest value. At most ``session_points`` rows per session, so at
        most that many such comparisons. Off (the default), such terms are refused when the
        session opens (``FAILED_PRECONDITION`` naming this key), before anything is counted or
        picked, and nothing is charged; the uniform method is served either way.
        ``access.allow_steered_selection``.
    allow_reward_disclosure : bool
        Whether sessions whose terms carry a consumer's value-based reward (``request
        --reward``) may be served. With a reward, each owner's statement states exactly how
        many of its points the summary holds (the reward pays on that count), and that count
        is a function of the consumer's validation set and of every other owner's points, not
        a DP release (docs/how-it-works.md, "What a payout reveals"): this owner learns it of
        the others, and they of this owner. Every owner of a session receives the same
        settlement terms, reward included, so a session runs with a reward only among owners
        that all consented. Off (the default), terms with a reward are refused when the
        session opens (``FAILED_PRECONDITION`` naming this key), before anything is read or
        charged. ``access.allow_reward_disclosure``.
    curators : tuple of str
        Names (certificate names) of the curators this owner serves; at least one, no
        duplicates, none empty. ``access.curators``.
    max_sessions : int
        Sessions open at the same time, >= 1. ``limits.max_sessions``.
    session_idle_timeout_seconds : float
        Seconds after which an idle session is closed; finite, > 0.
        ``limits.session_idle_timeout_seconds``.
    max_rff_dimension : int
        Largest random-Fourier-feature dimension a session may ask for (memory and time of h1),
        >= 1. ``limits.max_rff_dimension``.
    session_memory_mib : float
        The most memory (MiB) one session's work may need, estimated from public sizes when it
        opens (:mod:`dpmarket.owner.limits`); finite, > 0. ``limits.session_memory_mib``.
    step_seconds : float
        The longest one step of a session (a pass over the table) may take, estimated likewise;
        finite, > 0. ``limits.step_seconds``.
    publish_sketches : bool
        Whether this owner publishes private sketches (:mod:`dpmarket.owner.sketches`).
        ``sketches.publish``.
    epsilon_per_sketch : float
        The most epsilon one published sketch may spend; finite, > 0. A sketch is also one
        session of the ledger, so ``epsilon_per_session`` and what is left of ``epsilon_total``
        bound it too. ``sketches.epsilon``.
    cape_min_colluders : int
        The fewest colluding owners ``S_C`` a CAPE job must defend against, >= 0 (public: the
        owner tells the curator when a job opens). A job whose consumer chose a smaller ``S_C``
        is refused when it opens (``FAILED_PRECONDITION`` naming this floor); a job left at the
        default ``ceil(S / 3) - 1`` is raised to it; a plan, or a secure-aggregation round (whose
        threshold must exceed ``(S + S_C) / 2``), below it is refused before anything is sent.
        ``cape.min_colluders``.
    peers : tuple of (str, str)
        The owners this owner accepts as peers of a CAPE job and of its secure-aggregation
        rounds, each with the pin of its public key
        (:func:`dpmarket.runtime.identity.key_fingerprint`: 64 hexadecimal digits), sorted by
        name; a mapping is accepted and sorted. A job whose sites include a name not listed is
        refused before this owner signs or sends anything
        (``FAILED_PRECONDITION`` naming the sites), and a certificate presented for a listed
        name whose key does not have the pinned fingerprint aborts the job or round
        (``ABORTED``): a party holding the deployment CA's key can mint a certificate under any
        name, but not for a key it does not hold. Empty (the default) accepts no peer, so a CAPE
        job is refused until the operator lists them (``dpmarket init`` writes them).
        Section ``[peers]``, one ``name = "pin"`` line per peer.
    prices : OwnerPrices
        What a session pays this owner (docs/reference.md, "[prices]"): per raw point read, per
        point delivered in the summary, per unit of epsilon charged to this ledger, and a minimum
        per session, in micro-credits; a mapping of credits (decimal strings) is accepted and
        read by :meth:`OwnerPrices.from_table`. Published to the curator with the owner's
        description (``GetOwnerInfo``); a session whose quoted charge for this owner is below
        them is refused when it opens. Default: free. Section ``[prices]``.

    Raises
    ------
    ValueError
        If a field has the wrong type (a bool is not a number) or is out of range; the message
        names the file key, the field and the allowed range.

    Notes
    -----
    The budgets are enforced by :class:`dpmarket.owner.ledger.OwnerLedger` (epsilon, delta and
    points; ``allow_non_private``); ``allow_exact_bids``, ``allow_steered_selection``,
    ``allow_reward_disclosure`` and ``rounds_per_point`` by the owner
    when a session opens (:func:`dpmarket.owner.terms.check_terms`); ``curators`` and the
    ``limits`` are enforced by the owner service; ``sketches`` by the owner's publisher
    (:class:`dpmarket.owner.sketches.SketchPublisher`), before the ledger is asked; ``cape`` by the
    owner's CAPE site (:class:`dpmarket.owner.cape.CapeSite`) and its secure-aggregation rounds
    (:class:`dpmarket.owner.secagg.SiteRounds`).
    """

    epsilon_total: float = 10.0
    delta_total: float = 1e-5
    window_days: float = 0.0
    points_total: int = 20000
    epsilon_per_session: float = 2.0
    delta_per_session: float = 1e-6
    points_per_session: int = 1000
    points_fraction_per_session: float = DEFAULT_POINTS_FRACTION
    rounds_per_point: int = 1
    allow_non_private: bool = False
    allow_exact_bids: bool = False
    allow_steered_selection: bool = False
    allow_reward_disclosure: bool = False
    curators: tuple[str, ...] = ("curator",)
    max_sessions: int = 8
    session_idle_timeout_seconds: float = 600.0
    max_rff_dimension: int = 4096
    session_memory_mib: float = 4096.0
    step_seconds: float = 3600.0
    publish_sketches: bool = True
    epsilon_per_sketch: float = 1.0
    cape_min_colluders: int = DEFAULT_MIN_COLLUDERS
    peers: tuple[tuple[str, str], ...] = ()
    prices: OwnerPrices = _FREE

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        put("epsilon_total", _epsilon(self.epsilon_total, "epsilon_total"))
        put("delta_total", _delta(self.delta_total, "delta_total"))
        window = _number(self.window_days, "window_days")
        if not (math.isfinite(window) and window >= 0):
            raise ValueError(
                f"{_key('window_days')} must be finite and >= 0 (0: lifetime), "
                f"got {self.window_days!r}"
            )
        put("window_days", window)
        put("points_total", _integer(self.points_total, "points_total"))
        for name, total, check in (
            ("epsilon_per_session", "epsilon_total", _epsilon),
            ("delta_per_session", "delta_total", _delta),
            ("points_per_session", "points_total", _integer),
        ):
            value = check(getattr(self, name), name)
            if value > getattr(self, total):
                raise ValueError(
                    f"{_key(name)} must be <= {_key(total)} = {getattr(self, total)!r}, "
                    f"got {value!r}"
                )
            put(name, value)
        fraction = _number(self.points_fraction_per_session, "points_fraction_per_session")
        if not (math.isfinite(fraction) and 0.0 < fraction <= 1.0):
            raise ValueError(
                f"{_key('points_fraction_per_session')} must be in (0, 1] (a share of the "
                f"owner's rows), got {self.points_fraction_per_session!r}"
            )
        put("points_fraction_per_session", fraction)
        put("rounds_per_point", _integer(self.rounds_per_point, "rounds_per_point"))
        for flag in _ACCESS_FLAGS:
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{_key(flag)} must be true or false, got {getattr(self, flag)!r}")
        curators = self.curators
        if isinstance(curators, str) or not isinstance(curators, list | tuple):
            raise ValueError(f"{_key('curators')} must be a list of names, got {curators!r}")
        if not curators:
            raise ValueError(f"{_key('curators')} must name at least one curator, got []")
        for j, name in enumerate(curators):
            if not isinstance(name, str) or not name:
                raise ValueError(
                    f"{_key('curators')}[{j}] must be a non-empty string, got {name!r}"
                )
        if len(set(curators)) != len(curators):
            raise ValueError(f"{_key('curators')} must not repeat a name, got {list(curators)}")
        put("curators", tuple(curators))
        put("max_sessions", _integer(self.max_sessions, "max_sessions"))
        timeout = _number(self.session_idle_timeout_seconds, "session_idle_timeout_seconds")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(
                f"{_key('session_idle_timeout_seconds')} must be finite and > 0 seconds, "
                f"got {self.session_idle_timeout_seconds!r}"
            )
        put("session_idle_timeout_seconds", timeout)
        put("max_rff_dimension", _integer(self.max_rff_dimension, "max_rff_dimension"))
        put("session_memory_mib", _epsilon(self.session_memory_mib, "session_memory_mib"))
        put("step_seconds", _epsilon(self.step_seconds, "step_seconds"))
        if not isinstance(self.publish_sketches, bool):
            raise ValueError(
                f"{_key('publish_sketches')} must be true or false, got {self.publish_sketches!r}"
            )
        put("epsilon_per_sketch", _epsilon(self.epsilon_per_sketch, "epsilon_per_sketch"))
        floor = self.cape_min_colluders
        if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
            raise ValueError(f"{_key('cape_min_colluders')} must be an integer >= 0, got {floor!r}")
        put("peers", _peers(self.peers))
        prices = self.prices
        if isinstance(prices, Mapping):
            prices = OwnerPrices.from_table(prices, where=f"[{_PRICES}]")
        if not isinstance(prices, OwnerPrices):
            raise ValueError(f"[{_PRICES}] must be a table of prices, got {prices!r}")
        put("prices", prices)

    @property
    def peer_pins(self) -> dict[str, str]:
        """``[peers]`` as a mapping: owner name -> the pin of its public key."""
        return dict(self.peers)

    def session_points(self, rows: int) -> int:
        """The most raw points one session may receive from a table of ``rows`` rows.

        Parameters
        ----------
        rows : int
            The owner's row count (its public ``num_points``), >= 0.

        Returns
        -------
        int
            ``min(points_per_session, floor(points_fraction_per_session * rows))``; the
            fraction is taken as the decimal written in the policy (``0.29`` of 100 rows is 29,
            not the 28 a binary product would round down to).
        """
        share = math.floor(Fraction(repr(self.points_fraction_per_session)) * max(int(rows), 0))
        return min(self.points_per_session, share)

    @property
    def window_seconds(self) -> float:
        """The window in seconds; ``math.inf`` for a lifetime budget (``window_days == 0``)."""
        return self.window_days * 86400.0 if self.window_days > 0 else math.inf

    @property
    def window_description(self) -> str:
        """``"the lifetime"`` or ``"the last N days"``, for messages."""
        if self.window_days == 0:
            return "the lifetime"
        return f"the last {self.window_days:g} day{'' if self.window_days == 1 else 's'}"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "owner policy") -> OwnerPolicy:
        """Build a policy from a parsed TOML document (sections of keys).

        Parameters
        ----------
        data : mapping
            ``{"budget": {...}, "session": {...}, "access": {...}, "limits": {...}}``; every
            section and key is optional.
        source : str
            Where ``data`` comes from (a file name), prefixed to every error message.

        Returns
        -------
        OwnerPolicy

        Raises
        ------
        ValueError
            If a section or key is unknown, a section is not a table, or a value has the wrong
            type or is out of range: ``"{source}: session.epsilon (epsilon_per_session) must
            be <= ..."``.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"{source}: a policy must be a table of sections, got {data!r}")
        kwargs: dict[str, Any] = {}
        for section, table in data.items():
            if section not in (*_SECTIONS, _PEERS, _PRICES):
                raise ValueError(
                    f"{source}: unknown section [{section}]; allowed: "
                    + ", ".join(f"[{s}]" for s in (*_SECTIONS, _PEERS, _PRICES))
                )
            if not isinstance(table, Mapping):
                raise ValueError(f"{source}: [{section}] must be a table, got {table!r}")
            if section == _PEERS:
                kwargs["peers"] = dict(table)
                continue
            if section == _PRICES:
                kwargs["prices"] = dict(table)
                continue
            for key, value in table.items():
                if (section, key) not in _KEYS:
                    allowed = [k for s, k in _KEYS if s == section]
                    raise ValueError(
                        f"{source}: unknown key {section}.{key}; allowed in [{section}]: "
                        + ", ".join(allowed)
                    )
                kwargs[_KEYS[section, key]] = value
        try:
            return cls(**kwargs)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from exc

    def to_toml(self, notes: Mapping[str, str] | None = None) -> str:
        """The policy as a TOML document in the file layout; :meth:`from_mapping` reads it back.

        Parameters
        ----------
        notes : mapping of str to str, optional
            Comments for a reader of the file, by field name (``"allow_steered_selection"``):
            each written as ``#`` lines above its key (a drafted policy says why a key is set
            as it is). They change nothing the file says.

        Returns
        -------
        str
            Every key written explicitly, so the text is a complete record of the policy
            (the ledger stores it); ``[prices]`` is written when a price is set (a ledger
            recorded before prices existed keeps its record of a free policy).

        Raises
        ------
        ValueError
            If ``notes`` names no field of the file layout.
        """
        notes = dict(notes or {})
        unknown = sorted(set(notes) - set(_KEY_OF_FIELD))
        if unknown:
            raise ValueError(f"notes for unknown policy fields: {unknown}")
        lines: list[str] = []
        for section in _SECTIONS:
            if lines:
                lines.append("")
            lines.append(f"[{section}]  # {_SECTION_COMMENTS[section]}")
            for (s, key), name in _KEYS.items():
                if s == section:
                    if name in notes:
                        lines += [f"# {line}".rstrip() for line in notes[name].splitlines()]
                    lines.append(f"{key} = {_toml_value(getattr(self, name))}")
        lines += ["", f"[{_PEERS}]  # {_PEERS_COMMENT}"]
        lines += [f"{name} = {_toml_string(pin)}" for name, pin in self.peers]
        if self.prices != _FREE:
            lines += ["", f"[{_PRICES}]  # {_PRICES_COMMENT}"]
            lines += [f"{k} = {_toml_string(v)}" for k, v in self.prices.as_table().items()]
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-serialisable dict (``curators`` as a list)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["curators"] = list(self.curators)
        out["peers"] = dict(self.peers)
        out["prices"] = self.prices.as_table()
        return out


def load_owner_policy(path: str | os.PathLike[str]) -> OwnerPolicy:
    """Read an owner's policy file.

    Parameters
    ----------
    path : str or path-like
        A TOML file in the layout of the module docstring.

    Returns
    -------
    OwnerPolicy

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist (the message names it).
    ValueError
        If the file is not valid TOML, or as :meth:`OwnerPolicy.from_mapping`; the message
        starts with the file name.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"owner policy file {path} does not exist") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: not a valid TOML file: {exc}") from exc
    return OwnerPolicy.from_mapping(data, source=str(path))


#: The owner's policy file in its data directory: every owner command reads it.
POLICY_FILE = "policy.toml"


def data_dir_policy(
    data_dir: str | os.PathLike[str], install: str | os.PathLike[str] | None = None
) -> tuple[OwnerPolicy, str]:
    """The owner's policy: ``<data_dir>/policy.toml``, which every owner command reads.

    Parameters
    ----------
    data_dir : path
        The owner's data directory (its ledger; created if needed when ``install`` is given).
    install : path, optional
        A policy file to install there: copied when the data directory holds none; when it
        holds one, the two must say the same, or the command is refused (so two commands of one
        owner never run under two policies).

    Returns
    -------
    policy : OwnerPolicy
    source : str
        Where it came from, for the start-up line: the file, or ``"the built-in defaults (no
        <data_dir>/policy.toml)"``.

    Raises
    ------
    FileNotFoundError
        If ``install`` does not exist.
    ValueError
        If a policy file is malformed, or ``install`` differs from the installed policy (the
        message names both files).
    """
    path = Path(data_dir) / POLICY_FILE
    installed = load_owner_policy(path) if path.is_file() else None
    if install is None:
        if installed is None:
            return OwnerPolicy(), f"the built-in defaults (no {path})"
        return installed, str(path)
    given = load_owner_policy(install)
    if installed is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{POLICY_FILE}.tmp")
        tmp.write_bytes(Path(install).read_bytes())
        os.replace(tmp, path)
        return given, f"{path} (installed from {install})"
    if installed != given:
        raise ValueError(
            f"--policy {install} differs from the owner's policy {path}: an owner's policy lives "
            f"in its data directory and every owner command reads it. Edit {path} (it applies "
            "from the next start), or leave out --policy"
        )
    return installed, str(path)
