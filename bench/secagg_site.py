"""One owner process of the secure-aggregation benchmark: the real site service over mTLS.

``python -m bench.secagg_site --pki-dir DIR --name owner-00 --lengths 1000 100000 --port-file F``
serves what an owner serves for secure aggregation (``SecureAggregationService`` through
:class:`dpmarket.owner.cape_service.SecureAggregationServicer`, rounds in
:class:`dpmarket.owner.secagg.SiteRounds`, key advertisements signed with the owner's certificate
key by :class:`dpmarket.owner.secagg.SiteIdentity`, health and reflection, the owner's
authorization), with its certificate from ``deploy/pki.py``. Only the jobs differ: instead of CAPE
jobs, the site holds :class:`SyntheticJobs`, one job per vector length, opened for the curator named
on the command line, whose input is a fixed synthetic vector. As in production the site decides what
it sums, not the curator's messages: a round of a job must have the job's vector length, and the
input comes from the site's own seed, which the benchmark uses to check the sum.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import grpc
import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import FailedPreconditionError, NotFoundError
from dpmarket.common.privacy.rng import production_rng
from dpmarket.common.secagg.protocol import RoundParams
from dpmarket.deploy.pki import owner_pins
from dpmarket.owner.cape_service import SecureAggregationServicer
from dpmarket.owner.secagg import SiteRounds
from dpmarket.owner.service import owner_authorizer, site_identity
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.serving import serve_until_signalled, start_server, write_port
from dpmarket.runtime.transport import TransportSecurity
from dpmarket.v1 import secure_aggregation_pb2, secure_aggregation_pb2_grpc

logger = logging.getLogger(__name__)


def job_id(length: int) -> str:
    """The benchmark job whose rounds sum vectors of ``length`` entries."""
    return f"bench-secagg-d{length}"


def synthetic_input(site: str, length: int, seed: int, clip: float) -> NDArray[np.float64]:
    """The input of ``site`` in the job of ``length``: uniform on ``[-clip, clip]``.

    Returns
    -------
    ndarray of shape (length,), float64
        A function of ``(site, length, seed)`` only, so the benchmark can recompute every
        site's input and check the networked sum.
    """
    site_key = int.from_bytes(hashlib.sha256(site.encode()).digest()[:8], "little")
    return np.random.default_rng([seed, length, site_key]).uniform(-clip, clip, length)


class SyntheticJobs:
    """A site's benchmark jobs: the :class:`dpmarket.owner.secagg.RoundJobs` of the site service,
    and
    its input source.

    Parameters
    ----------
    name : str
        The site (owner) name, its certificate's.
    curator : Identity
        The curator the jobs are open to (as CAPE jobs are open to the curator that opened them).
    lengths : iterable of int
        One job per vector length (:func:`job_id`).
    seed : int
        Seed of the synthetic inputs (:func:`synthetic_input`).
    clip : float
        Inputs lie in ``[-clip, clip]``.

    Notes
    -----
    The vectors are drawn once, at start-up, so a round times secure aggregation, not the
    drawing of its input (a CAPE job draws its noise share per round, Algorithm 1, step 2).
    """

    def __init__(
        self, name: str, curator: Identity, lengths: Iterable[int], seed: int, clip: float
    ) -> None:
        self.name = name
        self._curator = str(curator)
        self._inputs = {job_id(d): synthetic_input(name, d, seed, clip) for d in lengths}
        self._rng = production_rng()

    def check_curator(self, job_id: str, curator: str) -> None:
        """Raise :class:`NotFoundError` unless ``job_id`` is a job of this site and ``curator``
        the one it is open to."""
        if job_id not in self._inputs or curator != self._curator:
            raise NotFoundError(f"no benchmark job {job_id!r} for {curator}")

    def input(self, job_id: str, params: RoundParams) -> NDArray[np.float64]:
        """The input source of :class:`dpmarket.owner.secagg.SiteRounds`: the job's vector.

        Raises
        ------
        NotFoundError
            For an unknown job.
        FailedPreconditionError
            If the round's vector length is not the job's.
        """
        vector = self._inputs.get(job_id)
        if vector is None:
            raise NotFoundError(f"no benchmark job {job_id!r}")
        if params.vector_length != vector.shape[0]:
            raise FailedPreconditionError(
                f"job {job_id!r} sums {vector.shape[0]} values, the round asks for "
                f"{params.vector_length}"
            )
        return vector

    def rng_for(self, job_id: str) -> np.random.Generator:
        """Coins of the stochastic rounding (CSPRNG-seeded, as in production)."""
        return self._rng


async def serve(
    pki_dir: Path,
    name: str,
    curator: str,
    lengths: Sequence[int],
    seed: int,
    clip: float,
    port: int,
    port_file: str,
) -> None:
    """Serve the site on ``127.0.0.1:port`` until SIGTERM; write the bound port to a file."""
    security = TransportSecurity.from_files(*identity_files(pki_dir, Identity("owner", name)))
    jobs = SyntheticJobs(name, Identity("curator", curator), lengths, seed, clip)
    # The roster: every owner certificate the benchmark issued into the PKI folder.
    rounds = SiteRounds(
        site_identity(name, security, owner_pins(pki_dir)), jobs.input, jobs.rng_for
    )
    authorizer = owner_authorizer((curator,), security)

    servicer = SecureAggregationServicer(rounds, jobs, authorizer)

    def register(server: grpc.aio.Server) -> None:
        secure_aggregation_pb2_grpc.add_SecureAggregationServiceServicer_to_server(servicer, server)

    service = secure_aggregation_pb2.DESCRIPTOR.services_by_name["SecureAggregationService"]
    server, bound, _ = await start_server(
        register, [service.full_name], f"127.0.0.1:{port}", security
    )
    logger.info("benchmark site %s serving on port %d", name, bound)
    write_port(port_file, bound)
    await serve_until_signalled(server)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.secagg_site", description=__doc__)
    parser.add_argument("--pki-dir", type=Path, required=True, help="holds ca.crt and the keys")
    parser.add_argument("--name", required=True, help="the owner name of the certificate")
    parser.add_argument("--curator", default="curator", help="the curator name served")
    parser.add_argument("--lengths", type=int, nargs="+", required=True, help="one job per D")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic inputs")
    parser.add_argument("--clip", type=float, default=1.0, help="inputs in [-clip, clip]")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(
        serve(
            args.pki_dir,
            args.name,
            args.curator,
            args.lengths,
            args.seed,
            args.clip,
            args.port,
            args.port_file,
        )
    )


if __name__ == "__main__":
    main()
