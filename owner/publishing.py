"""An owner publishes its private sketches to a curator's catalogue: read the table, open the
ledger, charge, then send.

:func:`publish_sketches` is the one home of ``dpmarket owner publish`` and
:func:`dpmarket.client.publish`: the owner's data read as its service reads it, its own ledger
opened (bound to its certificate), each spec's sketch checked against its policy and charged
together with the sketch before anything is sent (:func:`dpmarket.owner.sketches.publish_to`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.privacy.noise import NoiseSource, OpenDPNoise, SeededNoise
from dpmarket.owner.engine import Engine
from dpmarket.owner.ledger import OwnerLedger, Remaining
from dpmarket.owner.ledger_chain import LedgerOwner
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.sketches import Delivery
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.transport import TransportSecurity

__all__ = ["Publishing", "open_owner_ledger", "publish_sketches"]

logger = logging.getLogger("dpmarket")

#: Chooses the specs to publish when none are named: ``choose(client, catalogue, allocation
#: spec or None, epsilon, stored)`` -> spec names (empty: publish nothing). ``stored`` maps the
#: name of each catalogue spec whose map this owner has released to the release's epsilon
#: (from its ledger): such a spec is sent again free, or refused under another ``epsilon``
#: (:func:`dpmarket.owner.sketches.check_stored_epsilon`).
Chooser = Callable[[Any, list[Any], str | None, float | None, Mapping[str, float]], list[str]]


@dataclass(frozen=True)
class Publishing:
    """What one publication run did.

    Attributes
    ----------
    owner : str
        The publisher (its certificate's name).
    deliveries : tuple of Delivery
        Every spec's publication, in order (``publication.charged_now``: charged by this run,
        or sent again as stored).
    left : Remaining
        What is left of the owner's budgets over its window afterwards.
    """

    owner: str
    deliveries: tuple[Delivery, ...]
    left: Remaining

    def to_json(self, curator: str) -> dict[str, Any]:
        """What ``dpmarket owner publish --json`` prints (``curator``: ``NAME@HOST:PORT``)."""
        rows = []
        for d in self.deliveries:
            mech = d.publication.sketch.mechanism
            rows.append(
                {
                    "spec": d.spec,
                    "key": d.publication.key,
                    "epsilon": mech.epsilon,
                    "delta": mech.delta,
                    "charged_now": d.publication.charged_now,
                    "noisy_count": d.publication.sketch.noisy_count,
                    "already_in_catalogue": d.already_in_catalogue,
                    "ledger_entry": d.publication.charge.id,
                }
            )
        left = self.left
        return {
            "owner": self.owner,
            "curator": curator,
            "sketches": rows,
            "left": {"epsilon": left.epsilon, "delta": left.delta, "window": left.window},
        }


def open_owner_ledger(
    data_dir: Path, policy: OwnerPolicy | None, name: str, security: TransportSecurity
) -> OwnerLedger:
    """Open the owner ``name``'s ledger for a command that charges it (owner serve, owner
    publish), bound to its certificate; log an unresolved rollback (every session and job is
    refused until it is resolved).

    Raises
    ------
    dpmarket.owner.ledger.LedgerMissingError
        If the directory holds no ledger (``dpmarket owner ledger init`` creates it).
    sqlite3.DatabaseError
        If the ledger is not readable (restore it from its latest backup).
    OSError, ValueError, RuntimeError
        If it belongs to another owner or deployment, or cannot be opened.
    """
    ledger = OwnerLedger(data_dir, policy, owner=LedgerOwner.from_security(name, security))
    if any(resolved is None for *_, resolved in ledger.rollbacks()):
        logger.error(
            "%s is behind a receipt this owner signed and the rollback is not resolved: "
            "every session and job is refused until a newer backup is restored or "
            "dpmarket owner ledger resolve --data-dir %s runs (docs/howto-ledger.md)",
            ledger.path,
            data_dir,
        )
    return ledger


def publish_sketches(
    curator: str,
    security: TransportSecurity,
    *,
    table_path: str | Path,
    data_dir: str | Path,
    specs: Sequence[str] = (),
    choose: Chooser | None = None,
    epsilon: float | None = None,
    seed: int | None = None,
    schema_path: str | None = None,
    policy_path: str | None = None,
    curator_name: str = "curator",
    engine: Callable[[], Engine] | None = None,
    in_memory_values: int | None = None,
) -> Publishing:
    """Publish this owner's sketches under ``specs`` (or, with none, every spec of the
    catalogue, or those ``choose`` picks) to the catalogue of the curator at ``curator``.

    Parameters
    ----------
    curator : str
        ``HOST:PORT`` of the curator.
    security : TransportSecurity
        The owner's mTLS credentials (the catalogue names the publisher by its certificate).
    table_path, data_dir : path
        The owner's table and data directory (its ledger and policy; the ledger opened as
        :func:`open_owner_ledger` opens it).
    specs : sequence of str
        The specs to publish; empty: ``choose``'s, or every spec of the catalogue.
    choose : callable, optional
        Picks the specs when none are named (``dpmarket owner publish`` asks a person), told
        the epsilon of each spec this owner's ledger holds a release of (``Chooser``).
    epsilon : float, optional
        Each sketch's epsilon (default: its spec's), within the spec's range.
    seed : int, optional
        Seeds the sketches' noise (reproducible by whoever knows it; default: OpenDP's
        samplers).
    schema_path, policy_path : str, optional
        The owner's confirmed schema, and its policy (default: the data directory's).
    curator_name : str
        The name the curator's certificate must carry.
    engine : callable, optional
        Starts a Dask engine for a large table (:func:`dpmarket.owner.cli.engine_starter`).
    in_memory_values : int, optional
        Tables with more values are read partition by partition.

    Returns
    -------
    Publishing

    Raises
    ------
    InvalidArgumentError
        If the credentials carry no certificate.
    OSError, ValueError
        If the table, the schema or the policy cannot be read.
    dpmarket.common.errors.DPMarketError
        From the catalogue or the ledger (a spec's charge refused by the policy, a catalogue
        that holds a sketch this ledger did not record).
    sqlite3.DatabaseError, RuntimeError
        As :func:`open_owner_ledger`.
    """
    from dpmarket.owner.data import load_owner_data
    from dpmarket.owner.policy import data_dir_policy
    from dpmarket.owner.sketch_client import CatalogClient
    from dpmarket.owner.sketches import SketchPublisher, publish_to
    from dpmarket.runtime.schemas import load_schema

    if security.identity is None:
        raise InvalidArgumentError(
            "publishing needs the owner's certificate: the catalogue names the publisher by it"
        )
    name = security.identity.name
    state = Path(data_dir)
    policy, _ = data_dir_policy(state, policy_path)
    schema = None
    if schema_path is not None:
        schema = load_schema(schema_path)
        schema.check_confirmed(schema_path)
    options: dict[str, Any] = {}
    if in_memory_values is not None:
        options["in_memory_values"] = in_memory_values
    noise: NoiseSource = OpenDPNoise() if seed is None else SeededNoise(np.random.default_rng(seed))
    if seed is not None:
        logger.warning("--seed: the sketches' noise is reproducible by whoever knows the seed")
    ledger = open_owner_ledger(state, policy, name, security)
    found = None
    try:
        with CatalogClient(curator, security, curator=Identity("curator", curator_name)) as client:
            publisher = SketchPublisher(
                ledger,
                noise=noise,
                rng=None if seed is None else np.random.default_rng(seed + 1),
            )
            names = list(specs)
            if not names:
                catalogue, allocation = client.catalogue()
                names = [s.name for s in catalogue]
                if choose is not None:
                    stored = publisher.stored_epsilons(catalogue)
                    names = choose(client, catalogue, allocation, epsilon, stored)
            deliveries: list[Delivery] = []
            if names:  # the table is read only when there is something to publish
                found = load_owner_data(
                    str(table_path), schema=schema, points=False, name=name, engine=engine,
                    **options,
                )  # fmt: skip
                table = found.table
                assert table is not None
                deliveries = publish_to(client, publisher, table, names, epsilon=epsilon)
        left = ledger.remaining()
    finally:
        ledger.close()
        if found is not None and found.engine is not None:
            found.engine.close()
    return Publishing(name, tuple(deliveries), left)
