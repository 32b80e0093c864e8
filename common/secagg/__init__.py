"""Secure aggregation (Bonawitz et al., CCS 2017): the sum of the sites' vectors, and nothing else.

Pure protocol kernels, no I/O: Shamir sharing over GF(2^521 - 1) (:mod:`.shamir`), unbiased
fixed-point encoding of reals into ``Z_{2^k}`` (:mod:`.fixedpoint`), the primitives from the
``cryptography`` package (:mod:`.crypto`: X25519 + HKDF-SHA256, AES-256-GCM, the AES-256
counter-mode mask generator, ECDSA P-256 signatures), the sites' long-lived pair keys
(:mod:`.pairkeys`: a static key per site bound once to its identity, per-round keys of each pair
derived with the round id) and the five rounds, consistency check
included, as state objects (:mod:`.protocol`), secure against an aggregator that lies and ``S_C``
colluding sites.
For many sites, SecAgg+ (Bell et al., CCS 2020): the same defences on a sparse random graph whose
seed the sites draw and whose degree grows like ``log S`` (:mod:`.graph`: the graph and the
derivation of its parameters; :mod:`.sparse`: the six stages). What the two share (a site's
key pairs, sharing and masking, the aggregator's unmasking, the stages) is written once in
:mod:`.base`, of which both are small subclasses. Used by CAPE (CAPE paper, Algorithm 1, step 3)
to sum the sites' noise draws.
"""

from collections.abc import Mapping

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.secagg import protocol, sparse
from dpmarket.common.secagg.crypto import RandomBytes, SecAggError, Signer, Verifier
from dpmarket.common.secagg.fixedpoint import FixedPoint, dequantize_sum, quantize
from dpmarket.common.secagg.pairkeys import PairKeyring
from dpmarket.common.secagg.protocol import (
    KeyAdvertisement,
    RoundParams,
    SecAggAggregator,
    SecAggSite,
    UnmaskResponse,
)
from dpmarket.common.secagg.shamir import Share, combine_shares, split_secret
from dpmarket.common.secagg.sparse import SparseSecAggAggregator, SparseSecAggSite

__all__ = [
    "FixedPoint",
    "KeyAdvertisement",
    "PairKeyring",
    "RoundParams",
    "SecAggAggregator",
    "SecAggError",
    "SecAggSite",
    "Share",
    "Signer",
    "SparseSecAggAggregator",
    "SparseSecAggSite",
    "UnmaskResponse",
    "Verifier",
    "combine_shares",
    "dequantize_sum",
    "quantize",
    "run_in_process",
    "split_secret",
]


def run_in_process(
    params: RoundParams,
    sites: Mapping[str, ArrayLike],
    *,
    drop_at: Mapping[str, protocol.DropStage] | None = None,
    signers: Mapping[str, Signer] | None = None,
    verifier: Verifier | None = None,
    random_bytes: RandomBytes | None = None,
    rng: np.random.Generator | None = None,
    phase_seconds: dict[str, float] | None = None,
    keyrings: Mapping[str, PairKeyring] | None = None,
) -> NDArray[np.float64]:
    """One round with every site and the aggregator in this process, complete graph or sparse.

    :func:`dpmarket.common.secagg.protocol.run_in_process` for a complete-graph round,
    :func:`dpmarket.common.secagg.sparse.run_sparse_in_process` for a sparse one (which also takes
    the stage ``"reveal"`` and reports the phase ``reveal_nonces``); same parameters, returns and
    errors. ``random_bytes`` defaults to ``os.urandom``.
    """
    run = sparse.run_sparse_in_process if params.sparse else protocol.run_in_process
    extra = {} if random_bytes is None else {"random_bytes": random_bytes}
    return run(
        params,
        sites,
        drop_at=drop_at,
        signers=signers,
        verifier=verifier,
        rng=rng,
        phase_seconds=phase_seconds,
        keyrings=keyrings,
        **extra,
    )
