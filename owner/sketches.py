"""An owner's private sketches: check, compute, charge and store, then hand over.

An owner publishes a differentially private sketch of its table once per spec of a curator's
catalogue (M2M paper, Section 2.3); every consumer of the catalogue then computes what it likes
from it at no further cost to the owner. :class:`SketchPublisher` is the owner's side as a plain
state object over its own ledger (no network: ``dpmarket owner publish`` fetches the spec and
sends the result, :mod:`dpmarket.consumer.cli`):

1. **Check** the spec against the owner's policy (``[sketches]``: whether it publishes at all,
   the most epsilon per sketch) and the epsilon against the spec's range; select the spec's columns
   from the table by name and project every record onto the public domain
   (:meth:`dpmarket.common.sketches.domain.Domain.clamp`, as OpenDP clamps: how many values moved
   goes to the owner's log only, so whether the rows fit a domain the curator chose never decides
   what the owner publishes); ask the ledger whether the charge would be accepted (per-publication
   and total budgets, basic composition with everything else the owner has released). A refusal
   computes and releases nothing, and depends on public inputs only (the spec, the policy, the
   budget, the table's column names).
2. **Compute** the sketch: the noise scales come from the map's sensitivities and the owner's
   epsilon, never from the curator (a curator cannot make the owner add less noise, whatever
   parameters it draws: the sensitivities do not depend on them); noise from OpenDP in
   production. A marginals sketch also carries the graphical model and bootstrap fitted to its
   measurements (:mod:`dpmarket.common.sketches.marginals_fit`: post-processing of the release,
   computed from it alone, so every consumer's first answer skips the fit).
3. **Charge and store** in one ledger transaction: the charge and the sketch become durable
   together, before any byte leaves (charge, then release).
4. **Hand over**: the caller sends the stored sketch and records the delivery.

A release is identified by its spec's key (map parameters, domain, noise): publishing under a key
already released returns the stored sketch and charges nothing, whichever curator or spec name
asks (sending the same released values again costs no privacy), unless the caller names an
epsilon other than the stored sketch's: that is refused (:class:`AnotherEpsilonError`), since
handing back a sketch at another epsilon than asked would mislead the caller about what it
holds. The ledger entry of a sketch:
session ``sketch:<spec>:<key[:16]>`` (one publication: the per-session limits bound it),
consumer ``catalogue:<spec>`` (the release goes to a catalogue whose consumers are not known in
advance), curator the catalogue's curator identity, mechanism e.g. ``private sketch (RFF,
Laplace)``, epsilon and delta of the release, 0 raw points.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    on_private_data,
)
from dpmarket.common.privacy.noise import NoiseSource, OpenDPNoise
from dpmarket.common.privacy.rng import production_rng
from dpmarket.common.sketches.endpoints import CatalogEndpoint
from dpmarket.common.sketches.marginals import MarginalsMechanism
from dpmarket.common.sketches.marginals_fit import publishable_fit
from dpmarket.common.sketches.spec import AnyMechanism, AnySketch, PublishedSketch, SketchSpec
from dpmarket.owner.ledger import LedgerEntry, OwnerLedger
from dpmarket.owner.partitioned import PartitionedTable
from dpmarket.runtime.sketch_messages import sketch_bytes, sketch_from_bytes
from dpmarket.runtime.tables import Table

__all__ = [
    "SKETCH_SESSION_PREFIX",
    "AnotherEpsilonError",
    "Delivery",
    "Publication",
    "SketchPublisher",
    "check_stored_epsilon",
    "data_digest",
    "ledger_session",
    "publish_to",
    "spec_records",
]

logger = logging.getLogger(__name__)


#: How the ledger session of a publication starts (:func:`ledger_session`): never a curator's id
#: (:func:`dpmarket.owner.ids.check_curator_id`).
SKETCH_SESSION_PREFIX = "sketch:"


class AnotherEpsilonError(AlreadyExistsError):
    """A publication asks an epsilon other than the one this owner released its sketch under
    the same map at (``ALREADY_EXISTS``): nothing is charged, computed or sent.

    A map is published once per owner (its key, :attr:`SketchSpec.key`); a repeat sends the
    stored release, which is free, and the caller who named another epsilon would otherwise
    hold a sketch of an epsilon it did not ask for. The decision depends on public inputs
    only: the epsilon asked and the stored sketch's, which its catalogue entry shows.
    """


def ledger_session(spec: SketchSpec) -> str:
    """The ledger session of a publication under ``spec``: ``sketch:<name>:<key[:16]>``."""
    return f"{SKETCH_SESSION_PREFIX}{spec.name}:{spec.key[:16]}"


def check_stored_epsilon(stored: Publication, spec: SketchSpec, epsilon: float | None) -> None:
    """Refuse a named ``epsilon`` other than the one ``stored`` was released at.

    Parameters
    ----------
    stored : Publication
        This owner's release under ``spec``'s key.
    spec : SketchSpec
        The spec asked for (its name may differ from the one the release was first made under).
    epsilon : float or None
        The epsilon the caller named (``None``: the spec's default, which asks for no
        particular epsilon: the stored sketch is sent again).

    Raises
    ------
    AnotherEpsilonError
        Naming the stored sketch's epsilon, its spec and ledger entry, and what to do instead.
    """
    released = stored.sketch.mechanism.epsilon
    if epsilon is None or float(epsilon) == released:
        return
    first = "" if stored.spec == spec.name else f" (first under {stored.spec})"
    raise AnotherEpsilonError(
        f"{spec.name}: this owner released its sketch of this map at epsilon {released:g}"
        f"{first}, ledger entry {stored.charge.id}; a map is published once, so epsilon "
        f"{float(epsilon):g} is refused: nothing charged, nothing sent. Publish it without "
        f"--epsilon (or with --epsilon {released:g}) to send the stored sketch again at no "
        f"cost; a sketch at epsilon {float(epsilon):g} needs a spec of another map (other map "
        "parameters, columns or noise), which the curator declares in its catalogue "
        "(curator serve --sketch-spec)"
    )


def data_digest(values: NDArray[np.float64]) -> str:
    """SHA-256 (hex) of the sketched values (float64, C order, little-endian): tells whether the
    data changed since a sketch was published."""
    arr = np.ascontiguousarray(values, dtype="<f8")
    return hashlib.sha256(f"{arr.shape}".encode() + arr.tobytes()).hexdigest()


@dataclass(frozen=True, eq=False)
class Publication:
    """A sketch this owner released (now, or before).

    Attributes
    ----------
    spec : str
        The spec it was first published under.
    key : str
        The spec's key.
    sketch : PrivateSketch or MarginalsSketch
    charge : LedgerEntry
        Its ledger entry (the only one: republishing charges nothing).
    charged_now : bool
        Whether this call charged it (``False``: it was stored already).
    data_digest : str
        Digest of the values sketched (:func:`data_digest`).
    delivered_to : tuple of str
        The curators whose catalogue accepted it (as recorded so far).
    """

    spec: str
    key: str
    sketch: AnySketch
    charge: LedgerEntry
    charged_now: bool
    data_digest: str
    delivered_to: tuple[str, ...]


def spec_records(spec: SketchSpec, table: Table) -> NDArray[np.float64]:
    """The spec's columns of ``table``, in the domain's order, projected onto the domain
    (values outside clamped to its bounds, discrete values moved to their nearest level; how
    many moved is logged here, never returned): exactly the records an owner's sketch under
    ``spec`` describes, whether released by the owner service or in process.

    Raises
    ------
    InvalidArgumentError
        If the spec names no column or a column is missing (names only).
    """
    names = list(spec.domain.names)
    if not names:
        raise InvalidArgumentError(f"spec {spec.name} names no columns")
    try:
        values = table.select(names)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None
    with on_private_data(f"{spec.name}: reading the records"):
        records, moved = spec.domain.clamp(values, f"table {table.name!r}")
    _log_moved(spec.name, names, moved, records.shape[0])
    return records


def _log_moved(spec: str, names: list[str], moved: NDArray[np.int64], rows: int) -> None:
    """Log how many values the domain moved, per column (the owner's log only), whether or not
    any moved: a step that logged only when some did would take longer for some tables before
    anything is charged, which a curator could time."""
    logger.info(
        "%s: values projected onto the spec's domain (this log only): %s of %d rows",
        spec,
        ", ".join(f"{names[j]!r} {int(m)}" for j, m in enumerate(moved)),
        rows,
    )


class SketchPublisher:
    """One owner's sketch publications over its ledger (and the sketches stored beside it).

    Parameters
    ----------
    ledger : OwnerLedger
        The owner's own ledger, under its policy; published sketches are stored in its database.
    noise : NoiseSource, optional
        Where the sketches' noise comes from: OpenDP (the default) in production; a
        ``SeededNoise`` only in tests and explicitly seeded runs.
    rng : numpy.random.Generator, optional
        The marginals sketch's selections (Gumbel draws): CSPRNG-seeded by default
        (:func:`dpmarket.common.privacy.rng.production_rng`); seeded only in tests and seeded runs.
    clock : callable
        Unix time, seconds.
    fit : bool
        Attach to each new marginals sketch the graphical model and bootstrap a consumer would
        fit to it (:func:`dpmarket.common.sketches.marginals_fit.publishable_fit`: post-processing
        of the release, no privacy cost), so that no consumer pays the fit before its first
        answer; False: publish the release alone (consumers fit it).
    """

    def __init__(
        self,
        ledger: OwnerLedger,
        *,
        noise: NoiseSource | None = None,
        rng: np.random.Generator | None = None,
        clock: Callable[[], float] = time.time,
        fit: bool = True,
    ) -> None:
        self.ledger = ledger
        self.noise: NoiseSource = noise if noise is not None else OpenDPNoise()
        self.rng = rng if rng is not None else production_rng()
        self.clock = clock
        self.fit = bool(fit)

    # ---------------------------------------------------------------------------- reading
    def stored(self, spec: SketchSpec) -> Publication | None:
        """The sketch released under ``spec``'s key, or ``None``."""

        def query(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
            row = conn.execute(
                "SELECT id, spec, key, data_digest, sketch, charge FROM sketches WHERE key = ?",
                (spec.key,),
            ).fetchone()
            if row is None:
                return None
            curators = conn.execute(
                "SELECT DISTINCT curator FROM sketch_deliveries WHERE sketch = ? ORDER BY curator",
                (row[0],),
            ).fetchall()
            return (*row, tuple(c[0] for c in curators))

        found = self.ledger.read(query)
        if found is None:
            return None
        _, name, key, digest, blob, charge_id, curators = found
        return Publication(
            spec=name,
            key=key,
            sketch=sketch_from_bytes(blob),
            charge=self.ledger.entry(charge_id),
            charged_now=False,
            data_digest=digest,
            delivered_to=curators,
        )

    def stored_epsilons(self, specs: Iterable[SketchSpec]) -> dict[str, float]:
        """The epsilon of this owner's stored release under each spec's map (by its key), for
        the specs that have one: ``{spec name: epsilon}``. A spec listed here is sent again
        free, and refused under another epsilon (:func:`check_stored_epsilon`)."""
        out = {}
        for spec in specs:
            release = self.stored(spec)
            if release is not None:
                out[spec.name] = float(release.sketch.mechanism.epsilon)
        return out

    def published(self) -> list[tuple[str, str, float, tuple[str, ...]]]:
        """Every stored sketch: ``(spec, key, epsilon, curators it was delivered to)``."""

        def query(conn: sqlite3.Connection) -> list[tuple[str, str, float, tuple[str, ...]]]:
            rows = conn.execute(
                "SELECT s.id, s.spec, s.key, c.epsilon FROM sketches s "
                "JOIN charges c ON c.id = s.charge ORDER BY s.id"
            ).fetchall()
            out = []
            for sid, spec, key, epsilon in rows:
                curators = conn.execute(
                    "SELECT DISTINCT curator FROM sketch_deliveries WHERE sketch = ? "
                    "ORDER BY curator",
                    (sid,),
                ).fetchall()
                out.append((spec, key, float(epsilon), tuple(c[0] for c in curators)))
            return out

        return self.ledger.read(query)

    # ---------------------------------------------------------------------------- release
    def records(self, spec: SketchSpec, table: Table) -> NDArray[np.float64]:
        """The records this owner releases under ``spec``: :func:`spec_records`."""
        return spec_records(spec, table)

    def publish(
        self,
        spec: SketchSpec,
        table: Table | PartitionedTable,
        *,
        curator: str,
        epsilon: float | None = None,
    ) -> Publication:
        """Release a sketch of ``table`` under ``spec``: check, compute, charge and store.

        Parameters
        ----------
        spec : SketchSpec
            As the catalogue served it (validated on receipt).
        table : Table
            The owner's table; the spec's columns are selected by name.
        curator : str
            The catalogue's curator identity (``"curator:NAME"``), for the ledger.
        epsilon : float, optional
            The owner's choice (default: the spec's), within the spec's range and the policy's
            ``sketches.epsilon``.

        Returns
        -------
        Publication
            The stored sketch, ``charged_now`` telling whether this call charged it. A key
            released before returns the stored sketch when ``epsilon`` is ``None`` or its
            epsilon (a warning is logged when the spec's default differs from it, or when the
            data changed since).

        Raises
        ------
        AnotherEpsilonError
            If the key was released before at an epsilon other than ``epsilon`` (given): the
            message names the stored sketch's epsilon and how to publish another. Nothing is
            read, computed, stored or charged.
        FailedPreconditionError
            If the policy does not publish sketches, the epsilon exceeds the policy's limit per
            sketch, or the ledger refuses the charge
            (:class:`~dpmarket.owner.ledger.OwnerBudgetError`, naming what is spent and left).
            Nothing is computed, stored or charged.
        InvalidArgumentError
            If the epsilon is outside the spec's range, a column is missing, or a marginals
            spec is asked of a partitioned table. Nothing is charged. (Values outside the
            domain are clamped to it, never refused.)
        """
        if isinstance(table, PartitionedTable) and spec.kind == "marginals":
            raise InvalidArgumentError(
                f"spec {spec.name}: a marginals sketch is computed from a table held in memory; "
                "this table is partitioned (raise --in-memory-values to hold it, or publish the "
                "catalogue's linear sketches)"
            )
        stored = self.stored(spec)
        if stored is not None:
            check_stored_epsilon(stored, spec, epsilon)  # before any row is read
        if stored is not None and isinstance(table, PartitionedTable):
            return stored  # a pass over the whole table only to compare digests is not worth it
        if isinstance(table, PartitionedTable):
            records = None
            count, total, digest = self._partitioned_sum(spec, table)
        else:
            records = self.records(spec, table)
            digest = data_digest(records)
        if stored is not None:
            self._warn_if_asked_again_differently(stored, spec, epsilon, digest)
            return stored
        mechanism = self._mechanism_within_policy(spec, epsilon)
        charge: dict[str, Any] = {
            "session": ledger_session(spec),
            "consumer": f"catalogue:{spec.name}",
            "curator": curator,
            "mechanism": spec.mechanism_label,
            "epsilon": mechanism.epsilon,
            "delta": mechanism.delta,
            "points": 0,
        }
        self.ledger.check(**charge)  # refuse before computing anything
        if records is None:
            assert not isinstance(mechanism, MarginalsMechanism)  # refused above
            with on_private_data(f"{spec.name}: the sketch"):
                sketch: AnySketch = mechanism.release_sum(total, count, self.noise)
        else:
            sketch = self._release(spec, mechanism, records)
        blob = sketch_bytes(sketch)

        def store(conn: sqlite3.Connection, charge_id: int) -> None:
            conn.execute(
                "INSERT INTO sketches (charge, key, spec, data_digest, sketch) "
                "VALUES (?, ?, ?, ?, ?)",
                (charge_id, spec.key, spec.name, digest, blob),
            )

        entry = self.ledger.charge(**charge, record=store)
        logger.info(
            "%s: sketch released and charged (epsilon %g, delta %g), stored in %s",
            spec.name,
            mechanism.epsilon,
            mechanism.delta,
            self.ledger.path,
        )
        return Publication(spec.name, spec.key, sketch, entry, True, digest, ())

    @staticmethod
    def _warn_if_asked_again_differently(
        stored: Publication, spec: SketchSpec, epsilon: float | None, digest: str
    ) -> None:
        """Log (the owner's log only) when a key released before is asked at the spec's
        default epsilon and that differs from the stored sketch's (an epsilon named is checked
        first: :func:`check_stored_epsilon`), or its data changed since: the stored sketch is
        returned either way.

        The digest warning is a branch on the rows that no epsilon charges, so it must stay
        with the owner's operator, and it does: a publication is made by the owner's own
        process (``dpmarket owner publish``, :func:`dpmarket.client.publish`; no RPC of a
        curator or consumer starts one), this log is that process's, and what is sent is the
        stored sketch and its public fields whether or not the data changed (the curator's
        ``already_in_catalogue`` is decided by the curator). The rows are read and digested on
        every repeat, changed or not, so the one data-dependent difference is this log line.
        Any change that sent the warning, a status or a count to the curator would have to
        make it independent of the data first (say that a repeat returns the stored release,
        always).
        """
        asked = spec.epsilon if epsilon is None else float(epsilon)
        if asked != stored.sketch.mechanism.epsilon:
            logger.warning(
                "%s: released before at epsilon %g (this call asked %g); returning the "
                "stored sketch, nothing charged",
                spec.name,
                stored.sketch.mechanism.epsilon,
                asked,
            )
        if digest != stored.data_digest:
            logger.warning(
                "%s: the table changed since the sketch was released; the stored sketch "
                "describes the data as it was (a spec is published once)",
                spec.name,
            )

    def _mechanism_within_policy(self, spec: SketchSpec, epsilon: float | None) -> AnyMechanism:
        """``spec``'s mechanism at ``epsilon`` (default: the spec's), or a refusal.

        Raises
        ------
        FailedPreconditionError
            If the policy publishes no sketch, or the epsilon exceeds its limit per sketch.
        InvalidArgumentError
            If the epsilon is outside the spec's range.
        """
        policy = self.ledger.policy
        if not policy.publish_sketches:
            raise FailedPreconditionError(
                "this owner's policy publishes no sketch (sketches.publish = false)"
            )
        eps = spec.check_epsilon(spec.epsilon if epsilon is None else epsilon)
        if eps > policy.epsilon_per_sketch:
            raise FailedPreconditionError(
                f"epsilon = {eps:g} exceeds this owner's limit per sketch, sketches.epsilon = "
                f"{policy.epsilon_per_sketch:g}"
            )
        return spec.mechanism(eps)

    def _release(
        self, spec: SketchSpec, mechanism: AnyMechanism, records: NDArray[np.float64]
    ) -> AnySketch:
        """The sketch of ``records`` (of shape ``(n, len(spec.domain.names))``) under
        ``mechanism``: for marginals, with the consumers' fit attached when :attr:`fit`."""
        if not isinstance(mechanism, MarginalsMechanism):
            return mechanism.release(records, self.noise)
        sketch = mechanism.release(records, self.noise, rng=self.rng)
        if self.fit:  # post-processing of the release alone, before it is charged and stored
            started = time.perf_counter()
            sketch = sketch.with_fit(publishable_fit(sketch))
            logger.info(
                "%s: graphical model and bootstrap fitted for consumers in %.1f s",
                spec.name,
                time.perf_counter() - started,
            )
        return sketch

    def _partitioned_sum(
        self, spec: SketchSpec, table: PartitionedTable
    ) -> tuple[int, NDArray[np.float64], str]:
        """The exact feature sum and count of a partitioned table's records, partition by
        partition (each projected onto the domain as :meth:`records` does), and the digest of
        the partitions' digests. Progress goes to this owner's log."""
        names = list(spec.domain.names)
        if not names:
            raise InvalidArgumentError(f"spec {spec.name} names no columns")
        try:
            table.check_columns(names)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        total_parts = len(table.data.partitions)
        step = max(1, total_parts // 10)
        start = time.monotonic()

        def progress(done: int, total: int) -> None:
            if done % step == 0 or done == total:
                logger.info(
                    "%s: %d of %d partitions summed (%.0f s)",
                    spec.name,
                    done,
                    total,
                    time.monotonic() - start,
                )

        with on_private_data(f"{spec.name}: the feature sum"):
            found = table.data.statistic(
                names, functools.partial(_sketch_part, spec), progress=progress
            )
            count = sum(n for n, _, _, _ in found)
            total = np.zeros(spec.feature_map.dimension)
            moved = np.zeros(len(names), dtype=np.int64)
            for _, part_sum, part_moved, _ in found:
                total += part_sum
                moved += part_moved
        _log_moved(spec.name, names, moved, count)
        digest = hashlib.sha256("".join(d for _, _, _, d in found).encode()).hexdigest()
        return count, total, digest

    def delivered(self, publication: Publication, *, curator: str, spec: str) -> None:
        """Record that ``curator``'s catalogue accepted the sketch under the spec name ``spec``."""

        def insert(conn: sqlite3.Connection) -> None:
            (sid,) = conn.execute(
                "SELECT id FROM sketches WHERE key = ?", (publication.key,)
            ).fetchone()
            conn.execute(
                "INSERT OR IGNORE INTO sketch_deliveries (sketch, curator, spec, at) "
                "VALUES (?, ?, ?, ?)",
                (sid, curator, spec, float(self.clock())),
            )

        self.ledger.write(insert)


@dataclass(frozen=True, eq=False)
class Delivery:
    """One spec's publication, handed over to a catalogue.

    Attributes
    ----------
    spec : str
        The spec's name in that catalogue.
    publication : Publication
        What the owner released (``charged_now`` tells whether this run charged it).
    entry : PublishedSketch
        The catalogue's entry.
    already_in_catalogue : bool
        Whether the catalogue held this sketch already.
    """

    spec: str
    publication: Publication
    entry: PublishedSketch
    already_in_catalogue: bool


def publish_to(
    catalog: CatalogEndpoint,
    publisher: SketchPublisher,
    table: Table | PartitionedTable,
    specs: Sequence[str],
    *,
    epsilon: float | None = None,
) -> list[Delivery]:
    """Publish a sketch of ``table`` under each named spec of ``catalog``, in order.

    For each spec: fetch it, this owner's standing and the curator's held receipt of this owner;
    check the receipt against the ledger (:meth:`~dpmarket.owner.ledger.OwnerLedger.check_receipt`,
    as a session's open does); when nothing is stored for its key, refuse
    (before anything is computed) if the catalogue holds a sketch of this owner that this ledger
    does not (a data directory reset: a second release would spend budget for a sketch the
    catalogue refuses) or accepts no more from it; then :meth:`SketchPublisher.publish` (check,
    compute, charge and store; a stored release is returned as it is), hand it over with the
    ledger's receipt signed after the charge (the curator keeps it as this owner's last receipt)
    and record the delivery.

    Parameters
    ----------
    catalog : CatalogEndpoint
        A gRPC client (``dpmarket.owner.sketch_client.CatalogClient``) or an in-process adapter.
    publisher : SketchPublisher
    table : Table
    specs : sequence of str
        Spec names, at least one.
    epsilon : float, optional
        The owner's epsilon for new releases (default: each spec's). Given, every spec is
        fetched first and the run refused, before anything is charged, if one of them was
        released at another epsilon (one more ``GetSketchSpec`` per spec).

    Returns
    -------
    list of Delivery
        One per spec, in order.

    Raises
    ------
    AnotherEpsilonError
        ``epsilon`` is given and a spec's map was released at another: nothing of any spec
        is charged, released or sent.
    dpmarket.owner.ledger.LedgerRollbackError
        The ledger is behind the curator's held receipt of this owner (restored from an older
        copy, or replaced), or a rollback found earlier is not resolved: nothing charged or
        released for that spec (the rollback is recorded and logged).
    dpmarket.common.errors.DPMarketError
        The first refusal (this owner's policy or budget, the spec's range, the domain, the
        catalogue's); the specs before it are published and delivered, nothing of the failing
        one is released.
    """
    if not specs:
        raise InvalidArgumentError("name at least one spec to publish")
    if epsilon is not None:  # every spec's stored epsilon, before anything is charged
        for name in specs:
            spec = catalog.spec(name).spec
            stored = publisher.stored(spec)
            if stored is not None:
                check_stored_epsilon(stored, spec, epsilon)
    out = []
    for name in specs:
        status = catalog.spec(name)
        # The curator's held receipt first, as at a session's open: a ledger behind it (restored
        # from an older copy) is refused before it charges, and the rollback recorded.
        publisher.ledger.check_receipt(
            status.receipt, curator=catalog.curator, certificate=status.receipt_certificate
        )
        spec = status.spec
        if publisher.stored(spec) is None:
            if status.published:
                raise FailedPreconditionError(
                    f"the catalogue of {catalog.curator} holds a sketch of this owner under "
                    f"{name!r} that this ledger ({publisher.ledger.path}) did not record: "
                    "nothing released. Publish from the data directory that made it; if this "
                    "is that directory, its ledger lost the publication's charge (restored from "
                    "an older copy): restore its newest backup, or let the curator's receipt "
                    "stop the owner and run dpmarket owner ledger resolve (docs/howto-ledger.md)"
                )
            if status.publications_left <= 0:
                raise FailedPreconditionError(
                    f"the catalogue of {catalog.curator} accepts no more sketches from this "
                    f"owner: nothing released under {name!r}"
                )
        publication = publisher.publish(spec, table, curator=catalog.curator, epsilon=epsilon)
        # The ledger's receipt after the charge goes with the sketch: the curator presents it
        # at this owner's next session, so a ledger restored from a copy older than this
        # publication is found.
        receipt = publisher.ledger.close_receipt()
        entry, again = catalog.publish(name, publication.sketch, receipt)
        publisher.delivered(publication, curator=catalog.curator, spec=name)
        out.append(Delivery(name, publication, entry, again))
    return out


def _sketch_part(
    spec: SketchSpec, values: NDArray[np.float64]
) -> tuple[int, NDArray[np.float64], NDArray[np.int64], str]:
    """One partition's records projected onto the spec's domain: ``(rows, sum of their
    features, values moved per column, digest)``."""
    records, moved = spec.domain.clamp(values, "a partition")
    total = spec.feature_map.feature_sum(records)
    return int(records.shape[0]), total, np.asarray(moved, dtype=np.int64), data_digest(records)
