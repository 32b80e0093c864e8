"""One round of Flower's SecAgg+ (flwr 1.42), in one process: the anchor of ``bench.secagg``.

Runs under a Python that has ``flwr`` (``bench.secagg`` makes ``out/.venv-flower`` for it, so
that Flower's grpcio and protobuf pins never touch the project's environment); imports nothing
of the project. Prints one JSON record per (S, D) on stdout.

What runs is Flower's own code for both sides of the protocol: the server's
``SecAggPlusWorkflow`` (its four stages: setup, share keys, collect masked vectors, unmask, and
the strategy's ``aggregate_fit``) and every client's ``secaggplus_mod`` (key generation, Shamir
sharing, encryption of the shares, quantization, masking, unmasking shares), with the ClientApp
under the mod returning the client's vector as its fit result. Flower's simulation engine, its
SuperLink and its transport are replaced by :class:`InProcessGrid`, whose ``send_and_receive``
hands a copy of each message (as the wire would) to the destination client's mod and collects the
replies, one client after another; so the seconds are the total work of all S clients and the
server on one core, as ``bench.secagg``'s in-process rounds are. Every client lives through the
round (no dropout).

The neighbourhood: Flower's server shuffles the clients onto a ring and each one shares with and
masks with ``num_shares - 1`` ring neighbours (``num_shares = S``: the complete graph), with the
given ``reconstruction_threshold``. Flower's SecAgg+ is the semi-honest protocol: no signed keys,
no consistency check, a server-chosen graph, and masks from NumPy's Mersenne Twister seeded with
32 bits folded from the shared key.

Each round's sum is checked against the plain average of the clients' vectors (Flower's FedAvg
returns the weighted average; every client weighs 1).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import time
from collections.abc import Iterable, Sequence

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.client.mod.secure_aggregation.secaggplus_mod import secaggplus_mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_manager import SimpleClientManager
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import FedAvg
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import SecAggPlusWorkflow
from flwr.serverapp.grid import Grid
from flwr.supercore.task_identity import TaskIdentity

CLIP = 1.0


class InProcessGrid(Grid):
    """A Grid whose clients are in this process: each message goes to its client's
    ``secaggplus_mod`` above a ClientApp that answers with the client's vector."""

    def __init__(self, vectors: dict[int, np.ndarray]) -> None:
        self.vectors = vectors
        self.contexts = {
            nid: Context(run_id=1, node_id=nid, node_config={}, state=RecordDict(), run_config={})
            for nid in vectors
        }

    def set_run(self, run: object) -> None:  # the abstract interface; unused here
        raise NotImplementedError

    @property
    def run(self) -> object:
        raise NotImplementedError

    def create_message(self, *args: object, **kwargs: object) -> Message:
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return list(self.vectors)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError

    def _fit(self, msg: Message, ctxt: Context) -> Message:
        vector = self.vectors[msg.metadata.dst_node_id]
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([vector]), 1, {})
        return Message(compat.fitres_to_recorddict(fitres, False), reply_to=msg)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        # Each client gets its own copy, as it would over the wire (the mod consumes fields of
        # the content, and the workflow sends one content object to every client).
        return [
            secaggplus_mod(copy.deepcopy(msg), self.contexts[msg.metadata.dst_node_id], self._fit)
            for msg in messages
        ]


def one_round(sites: int, length: int, num_shares: int, threshold: int, seed: int) -> dict:
    """Time one SecAgg+ round of ``sites`` clients with vectors of ``length``; check the sum."""
    # What Flower's ServerApp runtime sets before a workflow runs (run, node and task ids).
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    rng = np.random.default_rng(seed)
    vectors = {nid: rng.uniform(-CLIP, CLIP, length) for nid in range(1, sites + 1)}
    grid = InProcessGrid(vectors)
    manager = SimpleClientManager()
    for nid in vectors:
        manager.register(GridClientProxy(nid, grid, 1))
    strategy = FedAvg(
        fraction_fit=1.0, min_fit_clients=sites, min_available_clients=sites, fraction_evaluate=0
    )
    context = LegacyContext(
        Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}),
        strategy=strategy,
        client_manager=manager,
    )
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: 1})
    context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        ndarrays_to_parameters([np.zeros(length)]), True
    )
    workflow = SecAggPlusWorkflow(
        num_shares=num_shares,
        reconstruction_threshold=threshold,
        max_weight=1.0,  # every client weighs 1: the weight costs no precision
        clipping_range=CLIP,
        quantization_range=2**22,
        modulus_range=2**32,
    )
    wall, cpu = time.perf_counter(), time.process_time()
    workflow(grid, context)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    params = compat.arrayrecord_to_parameters(
        context.state.array_records[MAIN_PARAMS_RECORD], keep_input=True
    )
    (average,) = parameters_to_ndarrays(params)
    expected = np.mean(list(vectors.values()), axis=0)
    error = float(np.max(np.abs(average - expected)))
    # 2^22 levels over [-1, 1]: one step 4.8e-7 per client, averaged.
    if not error < 1e-5:
        raise AssertionError(f"Flower's SecAgg+ average is off by {error}")
    return {"wall": wall, "cpu": cpu, "max_abs_error": error}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.flower_secaggplus", description=__doc__)
    parser.add_argument("--sites", type=int, nargs="+", required=True)
    parser.add_argument("--lengths", type=int, nargs="+", required=True)
    parser.add_argument(
        "--num-shares",
        type=int,
        nargs="+",
        help="per S, Flower's num_shares (default S: the complete graph)",
    )
    parser.add_argument(
        "--thresholds",
        type=int,
        nargs="+",
        help="per S, Flower's reconstruction_threshold (default floor(num_shares / 2) + 1)",
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    import flwr

    logging.getLogger("flwr").setLevel(logging.ERROR)  # no per-round INFO lines in the timing

    for i, sites in enumerate(args.sites):
        shares = args.num_shares[i] if args.num_shares else sites
        threshold = args.thresholds[i] if args.thresholds else shares // 2 + 1
        for length in args.lengths:
            runs = [
                one_round(sites, length, shares, threshold, run) for run in range(args.repeat + 1)
            ][1:]  # the first is a warm-up
            print(
                json.dumps(
                    {
                        "sites": sites,
                        "vector_length": length,
                        "num_shares": shares,
                        "reconstruction_threshold": threshold,
                        "flwr_version": flwr.__version__,
                        "runs_seconds": [r["wall"] for r in runs],
                        "runs_cpu_seconds": [r["cpu"] for r in runs],
                        "median_seconds": float(np.median([r["wall"] for r in runs])),
                        "median_cpu_seconds": float(np.median([r["cpu"] for r in runs])),
                        "max_abs_error": max(r["max_abs_error"] for r in runs),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
