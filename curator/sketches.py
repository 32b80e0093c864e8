"""The curator's catalogue of private sketches: the specs it serves and the sketches published.

:class:`SketchCatalog` is a plain object over the curator's SQLite store (no gRPC): the catalogue's
servicer (:mod:`dpmarket.curator.sketch_service`) is a thin adapter over it, and in-process code
(the summarizer's allocation, simulations, tests) uses it directly.

Specs come from declaration files (TOML, parsed with :mod:`tomllib`; the layout is documented in
:meth:`dpmarket.common.sketches.spec.SketchDeclaration.from_mapping` and
``deploy/sketches/flights.toml``) that ``dpmarket curator serve --sketch-spec FILE`` reads. The
first time a declaration is loaded the catalogue checks it against the curator's policy, draws its
random parameters (RFF frequencies, RACE projections and offsets) from a CSPRNG-seeded generator, or
from a seed only when one is given explicitly (``--sketch-seed``), and stores the specs, parameters
included: they never change afterwards, across restarts, so that every sketch ever published under a
spec stays comparable with every other. Loading a declaration again checks that it is the one stored
(a changed declaration needs a new name). Stored specs are served whether or not their file is given
again.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path

import numpy as np

from dpmarket.common.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from dpmarket.common.privacy.rng import make_rng
from dpmarket.common.sketches.endpoints import SpecStatus
from dpmarket.common.sketches.sketch import PrivateSketch
from dpmarket.common.sketches.spec import AnySketch, PublishedSketch, SketchDeclaration, SketchSpec
from dpmarket.curator.policy import CuratorPolicy
from dpmarket.curator.store import APPLICATION, DATABASE_FILE, MIGRATIONS
from dpmarket.runtime.database import open_database, snapshot, transaction
from dpmarket.runtime.files import read_toml
from dpmarket.runtime.schemas import load_schema
from dpmarket.runtime.sketch_messages import (
    sketch_bytes,
    sketch_from_bytes,
    spec_bytes,
    spec_from_bytes,
)
from dpmarket.v1 import privacy_pb2

__all__ = ["LocalCatalogEndpoint", "SketchCatalog", "load_declaration"]


def load_declaration(path: str | os.PathLike[str]) -> SketchDeclaration:
    """Read a sketch declaration file (TOML); its name defaults to the file's stem. A
    declaration that names a schema file (``schema = "schema.toml"``, relative to the
    declaration's folder) takes its columns from it.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If it is not valid TOML, or as :meth:`SketchDeclaration.from_mapping` (naming the file
        and the key).
    """
    p = Path(path)
    data = read_toml(p, "sketch spec file")
    schema = None
    if isinstance(data.get("schema"), str):
        schema = load_schema(p.parent / data["schema"])
        schema.check_confirmed(str(p.parent / data["schema"]))
    return SketchDeclaration.from_mapping(data, default_name=p.stem, source=str(p), schema=schema)


class SketchCatalog:
    """The curator's sketch catalogue, durable in ``<data_dir>/curator.sqlite3``.

    This is the interface in-process code uses (the summarizer's allocation included); the
    gRPC service only adapts it.

    * :meth:`spec` ``(name) -> SketchSpec``: one spec (``NotFoundError`` listing the names).
    * :meth:`specs` ``() -> list[SketchSpec]``: every spec, in the order first loaded.
    * :meth:`published` ``(owner_names, *, spec=None) -> dict[str, PrivateSketch]``: the RFF
      sketches published by those owners, validated, keyed by owner name; owners that published
      none are left out (possibly an empty dict). They all share one spec's map (the first RFF
      spec, or ``spec``), so they can be merged and compared with one embedding of a point set
      (:func:`dpmarket.common.sketches.sketch.sketch_mmd2`).
    * :meth:`sketches` ``(spec, owners=None) -> list[PublishedSketch]``: the catalogue entries of
      a spec.
    * :meth:`publish` ``(owner, spec, sketch)``: an owner's publication, checked;
      :meth:`endpoint` ``(owner)`` is the catalogue as that owner sees it in-process (what
      :func:`dpmarket.owner.sketches.publish_to` takes; over the network,
      ``dpmarket.owner.sketch_client``).

    Parameters
    ----------
    data_dir : path
        The curator's data directory (the store's database; created if needed).
    declarations : sequence of SketchDeclaration
        Declarations to load (checked against ``policy``; drawn and stored when new, compared
        with the stored one otherwise).
    policy : CuratorPolicy, optional
        Bounds on the specs and the publications (default: the built-in defaults).
    owners : collection of str, optional
        The owner names allowed to publish (the curator's configured owners); ``None``: any.
        (The gRPC service also refuses other owners before calling :meth:`publish`.)
    seed : int, optional
        Draw new specs' parameters from ``numpy.random.default_rng(seed)`` (reproducible runs;
        the parameters are public either way). Default: a CSPRNG-seeded generator.
    clock : callable
        Unix time, seconds.

    Raises
    ------
    InvalidArgumentError
        If a declaration is outside the policy, or differs from the one stored under its name.
    ValueError, RuntimeError
        If the directory holds another service's database or a newer schema.

    Notes
    -----
    One connection, guarded by a lock; the servicer calls it from worker threads. Sketches are
    stored as their serialized ``PrivateSketch`` messages and validated again when read (a
    consumer validates once more on receipt).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        declarations: Sequence[SketchDeclaration] = (),
        *,
        policy: CuratorPolicy | None = None,
        owners: Collection[str] | None = None,
        seed: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(data_dir) / DATABASE_FILE
        self.policy = policy if policy is not None else CuratorPolicy()
        self.owners = None if owners is None else frozenset(owners)
        self._clock = clock
        self._lock = threading.Lock()
        self._conn = open_database(self.path, MIGRATIONS, application=APPLICATION)
        try:
            rng = make_rng(seed)
            for declaration in declarations:
                self._load(declaration, rng)
            self._specs = self._read_specs()
        except BaseException:
            self._conn.close()
            raise

    @classmethod
    def from_files(
        cls,
        data_dir: str | os.PathLike[str],
        paths: Iterable[str | os.PathLike[str]] = (),
        **kwargs: object,
    ) -> SketchCatalog:
        """Open the catalogue, loading the declaration files ``paths`` (:func:`load_declaration`);
        ``kwargs`` as the constructor."""
        return cls(data_dir, [load_declaration(p) for p in paths], **kwargs)  # type: ignore[arg-type]

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SketchCatalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------ specs
    def _load(self, declaration: SketchDeclaration, rng: np.random.Generator) -> None:
        self.policy.check_sketch_declaration(declaration)
        text = json.dumps(declaration.as_dict(), sort_keys=True)
        with self._lock, transaction(self._conn) as conn:
            row = conn.execute(
                "SELECT declaration_json, created_at FROM sketch_declarations WHERE name = ?",
                (declaration.name,),
            ).fetchone()
            if row is not None:
                if row[0] != text:
                    raise InvalidArgumentError(
                        f"sketch spec {declaration.name!r} differs from the one this catalogue "
                        f"loaded at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(row[1]))} "
                        "UTC: sketches published under the stored one would no longer match it; "
                        "give the changed declaration a new name"
                    )
                return
            taken = [
                n
                for n in declaration.spec_names()
                if conn.execute("SELECT 1 FROM sketch_specs WHERE name = ?", (n,)).fetchone()
            ]
            if taken:
                raise InvalidArgumentError(f"sketch spec name(s) {taken} are taken")
            (position,) = conn.execute("SELECT COUNT(*) FROM sketch_specs").fetchone()
            conn.execute(
                "INSERT INTO sketch_declarations (name, declaration_json, created_at) "
                "VALUES (?, ?, ?)",
                (declaration.name, text, float(self._clock())),
            )
            for k, spec in enumerate(declaration.draw(rng)):
                conn.execute(
                    "INSERT INTO sketch_specs (name, declaration, position, spec) "
                    "VALUES (?, ?, ?, ?)",
                    (spec.name, declaration.name, position + k, spec_bytes(spec)),
                )

    def _read_specs(self) -> dict[str, SketchSpec]:
        with self._lock, snapshot(self._conn) as conn:
            rows = conn.execute("SELECT spec FROM sketch_specs ORDER BY position").fetchall()
        specs = [spec_from_bytes(r[0]) for r in rows]
        return {s.name: s for s in specs}

    def specs(self) -> list[SketchSpec]:
        """Every spec, in the order first loaded."""
        return list(self._specs.values())

    def spec(self, name: str) -> SketchSpec:
        """The spec called ``name``.

        Raises
        ------
        NotFoundError
            If there is none (the message lists the catalogue's specs).
        """
        spec = self._specs.get(name)
        if spec is None:
            known = ", ".join(self._specs) or "none"
            raise NotFoundError(f"no sketch spec {name!r} in this catalogue (specs: {known})")
        return spec

    # ------------------------------------------------------------------------- publishing
    def status(self, owner: str, spec: str) -> tuple[bool, int]:
        """Whether ``owner`` published under ``spec``, and how many more sketches it may publish.

        Raises
        ------
        NotFoundError
            For an unknown spec.
        """
        self.spec(spec)
        with self._lock, snapshot(self._conn) as conn:
            published = conn.execute(
                "SELECT 1 FROM sketches WHERE spec = ? AND owner = ?", (spec, owner)
            ).fetchone()
            (count,) = conn.execute(
                "SELECT COUNT(*) FROM sketches WHERE owner = ?", (owner,)
            ).fetchone()
        return published is not None, max(self.policy.sketches_per_owner - int(count), 0)

    def publish(self, owner: str, spec: str, sketch: AnySketch) -> tuple[PublishedSketch, bool]:
        """Accept ``owner``'s sketch under ``spec`` and store it durably.

        Parameters
        ----------
        owner : str
            The publisher's name, from its certificate.
        spec : str
        sketch : PrivateSketch or MarginalsSketch
            As received (validated on construction).

        Returns
        -------
        (PublishedSketch, bool)
            The catalogue entry, and whether the catalogue already held this very sketch (then
            nothing new is stored).

        Raises
        ------
        PermissionDeniedError
            If ``owner`` is not one of the configured owners.
        NotFoundError
            For an unknown spec.
        InvalidArgumentError
            If the sketch was not made under the spec (map, domain, noise, delta, split, epsilon
            range: :meth:`SketchSpec.check_sketch`) or its epsilon/delta is outside the policy.
        AlreadyExistsError
            If ``owner`` published another sketch under the spec.
        FailedPreconditionError
            If ``owner`` has published as many sketches as the policy accepts.
        """
        if self.owners is not None and owner not in self.owners:
            raise PermissionDeniedError(
                f"owner {owner!r} is not one of this curator's owners: it may not publish"
            )
        target = self.spec(spec)
        sketch.validate()
        target.check_sketch(sketch)
        self.policy.check_sketch_epsilon(sketch.mechanism.epsilon, sketch.mechanism.delta)
        blob = sketch_bytes(sketch)
        with self._lock, transaction(self._conn) as conn:
            row = conn.execute(
                "SELECT sketch, published_at FROM sketches WHERE spec = ? AND owner = ?",
                (spec, owner),
            ).fetchone()
            if row is not None:
                if row[0] != blob:
                    raise AlreadyExistsError(
                        f"owner {owner!r} already published another sketch under {spec!r}: a "
                        "spec takes one sketch per owner"
                    )
                return PublishedSketch(owner, spec, float(row[1]), sketch), True
            (count,) = conn.execute(
                "SELECT COUNT(*) FROM sketches WHERE owner = ?", (owner,)
            ).fetchone()
            if count >= self.policy.sketches_per_owner:
                raise FailedPreconditionError(
                    f"owner {owner!r} has published {count} sketches, the most this curator "
                    f"accepts from one owner (sketches.per_owner = "
                    f"{self.policy.sketches_per_owner})"
                )
            now = float(self._clock())
            conn.execute(
                "INSERT INTO sketches (spec, owner, published_at, sketch) VALUES (?, ?, ?, ?)",
                (spec, owner, now, blob),
            )
        return PublishedSketch(owner, spec, now, sketch), False

    def endpoint(self, owner: str, *, curator: str = "curator:local") -> LocalCatalogEndpoint:
        """The catalogue as ``owner`` sees it, in-process (no network, no certificate: the
        caller vouches for the name)."""
        return LocalCatalogEndpoint(self, owner, curator)

    # ---------------------------------------------------------------------------- reading
    def sketches(self, spec: str, owners: Iterable[str] | None = None) -> list[PublishedSketch]:
        """The entries of ``spec`` (every owner's, or those of ``owners``), by owner name, each
        validated.

        Raises
        ------
        NotFoundError
            For an unknown spec.
        """
        self.spec(spec)
        wanted = None if owners is None else set(owners)
        with self._lock, snapshot(self._conn) as conn:
            rows = conn.execute(
                "SELECT owner, published_at, sketch FROM sketches WHERE spec = ? ORDER BY owner",
                (spec,),
            ).fetchall()
        return [
            PublishedSketch(owner, spec, float(at), sketch_from_bytes(blob))
            for owner, at, blob in rows
            if wanted is None or owner in wanted
        ]

    def published(
        self, owner_names: Iterable[str], *, spec: str | None = None
    ) -> dict[str, PrivateSketch]:
        """The RFF sketches published by ``owner_names``, validated, keyed by owner name.

        Parameters
        ----------
        owner_names : iterable of str
        spec : str, optional
            An RFF spec's name; default the catalogue's first RFF spec.

        Returns
        -------
        dict of str to PrivateSketch
            Only the owners that published under the spec; empty when none did or the catalogue
            has no RFF spec. All share the spec's map and domain (column order:
            ``sketch.domain.names``).

        Raises
        ------
        NotFoundError
            For an unknown ``spec``.
        InvalidArgumentError
            If ``spec`` is not an RFF spec.
        """
        if spec is None:
            rff = [s.name for s in self._specs.values() if s.kind == "rff"]
            if not rff:
                return {}
            spec = rff[0]
        elif self.spec(spec).kind != "rff":
            raise InvalidArgumentError(f"{spec!r} is a {self.spec(spec).kind} spec, not an RFF one")
        return {
            e.owner: e.sketch
            for e in self.sketches(spec, list(owner_names))
            if isinstance(e.sketch, PrivateSketch)
        }


class LocalCatalogEndpoint:
    """A :class:`SketchCatalog` as one owner sees it, in-process
    (:class:`dpmarket.common.sketches.endpoints.CatalogEndpoint`)."""

    def __init__(self, catalog: SketchCatalog, owner: str, curator: str) -> None:
        self.catalog = catalog
        self.owner = owner
        self._curator = curator

    @property
    def curator(self) -> str:
        """The curator identity recorded in the owner's ledger."""
        return self._curator

    def spec(self, name: str) -> SpecStatus:
        """See :meth:`SketchCatalog.spec` and :meth:`SketchCatalog.status`."""
        published, left = self.catalog.status(self.owner, name)
        return SpecStatus(self.catalog.spec(name), published, left)

    def publish(
        self, spec: str, sketch: AnySketch, receipt: privacy_pb2.LedgerReceipt | None = None
    ) -> tuple[PublishedSketch, bool]:
        """See :meth:`SketchCatalog.publish` (in process: no curator keeps ``receipt``)."""
        return self.catalog.publish(self.owner, spec, sketch)
