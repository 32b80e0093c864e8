"""What an aggregator that lies about the survivors, with colluding sites, can compute.

The attack (an aggregator telling some sites that a victim survived and others that
it dropped, with a colluding site handing over its shares): with ``t`` shares of the victim's
self-mask seed and ``t`` of its pairwise-mask key, the aggregator removes every mask from the
victim's masked vector and reads its input. :func:`recover_input` does that removal; the tests
use it against in-process rounds and against owner processes over gRPC, and it recovers the
input exactly (to the quantization step) whenever it is given both secrets, so a test that finds
the attacker without them is not vacuous.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.secagg import shamir
from dpmarket.common.secagg.crypto import (
    KEY_BYTES,
    MaskAccumulator,
    private_key_from_bytes,
    public_key_bytes,
    shared_key,
)
from dpmarket.common.secagg.fixedpoint import dequantize_sum
from dpmarket.common.secagg.protocol import _MASK_KEY_LABEL, RoundParams, _pair_info
from dpmarket.common.secagg.shamir import Share


def distinct(shares: Iterable[Share]) -> list[Share]:
    """One share per x coordinate (the attacker may hear the same share twice)."""
    out: dict[int, Share] = {}
    for share in shares:
        out.setdefault(share.x, share)
    return [out[x] for x in sorted(out)]


def recover_input(
    params: RoundParams,
    victim: str,
    u2: Sequence[str],
    s_publics: Mapping[str, bytes],
    masked: NDArray[np.uint64],
    seed_shares: Sequence[Share],
    key_shares: Sequence[Share],
    *,
    threshold: int | None = None,
) -> NDArray[np.float64] | None:
    """The victim's input from its masked vector and ``t`` shares of each of its secrets.

    Parameters
    ----------
    params : RoundParams
    victim : str
    u2 : sequence of str
        The sites that completed key sharing (the victim's pairwise masks run over them).
    s_publics : mapping of str to bytes
        Every site's advertised pairwise-mask public key.
    masked : ndarray of shape (D,), uint64
        The victim's masked input.
    seed_shares, key_shares : sequence of Share
        Shares of the victim's self-mask seed and of its pairwise-mask private key.
    threshold : int, optional
        The victim's threshold: ``params.threshold`` by default (a sparse round's is the
        victim's own ``t_v``).

    Returns
    -------
    ndarray of shape (D,), float64, or None
        The victim's input (within one quantization step), or ``None`` when fewer than ``t``
        distinct shares of either secret are given.
    """
    t = params.threshold if threshold is None else threshold
    seeds, keys = distinct(seed_shares), distinct(key_shares)
    if len(seeds) < t or len(keys) < t:
        return None
    seed = shamir.combine_shares(seeds[:t], KEY_BYTES)
    s_private = private_key_from_bytes(shamir.combine_shares(keys[:t], KEY_BYTES))
    if public_key_bytes(s_private) != s_publics[victim]:
        raise AssertionError("the reconstructed key is not the victim's")
    y = np.array(masked, dtype=np.uint64)
    masks = MaskAccumulator(params.vector_length)
    masks.subtract(y, seed)
    for peer in u2:
        if peer == victim:
            continue
        key = shared_key(
            s_private,
            s_publics[peer],
            info=_pair_info(_MASK_KEY_LABEL, params.round_id, victim, peer),
        )
        # The victim added PRG(s) for peers before it and subtracted it for those after.
        if peer < victim:
            masks.subtract(y, key)
        else:
            masks.add(y, key)
    y &= np.uint64(params.fixed_point.modulus - 1)
    return dequantize_sum(y, params.fixed_point, 1)
