"""Secure aggregation (Bonawitz et al., CCS 2017): the sum of the sites' vectors, and nothing else.

Pure protocol kernels, no I/O: Shamir sharing over GF(2^521 - 1) (:mod:`.shamir`), unbiased
fixed-point encoding of reals into ``Z_{2^k}`` (:mod:`.fixedpoint`), the primitives from the
``cryptography`` package (:mod:`.crypto`: X25519 + HKDF-SHA256, AES-256-GCM, the AES-256-CTR mask
generator, ECDSA P-256 signatures) and the five rounds, consistency check included, as state
objects (:mod:`.protocol`), secure against an aggregator that lies and ``S_C`` colluding sites.
Used by CAPE (CAPE paper, Algorithm 1, step 3) to sum the sites' noise draws.
"""

from common.secagg.crypto import SecAggError, Signer, Verifier
from common.secagg.fixedpoint import FixedPoint, dequantize_sum, quantize
from common.secagg.protocol import (
    KeyAdvertisement,
    RoundParams,
    SecAggAggregator,
    SecAggSite,
    UnmaskResponse,
    run_in_process,
)
from common.secagg.shamir import Share, combine_shares, split_secret

__all__ = [
    "FixedPoint",
    "KeyAdvertisement",
    "RoundParams",
    "SecAggAggregator",
    "SecAggError",
    "SecAggSite",
    "Share",
    "Signer",
    "UnmaskResponse",
    "Verifier",
    "combine_shares",
    "dequantize_sum",
    "quantize",
    "run_in_process",
    "split_secret",
]
