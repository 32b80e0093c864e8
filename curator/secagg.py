"""The curator as secure-aggregation aggregator: drives one round across the sites' endpoints.

Each round is the five steps of Bonawitz et al. (2017, Figure 4, the variant against an actively
lying server) with the curator routing every message
(:class:`dpmarket.common.secagg.protocol.SecAggAggregator` holds the aggregator's state), or, for a
sparse round (``params.neighbours > 0``), the six of SecAgg+ (Bell et al. 2020;
:class:`dpmarket.common.secagg.sparse.SparseSecAggAggregator`): the sites also reveal their graph
nonces, and the curator routes the pairwise tags (acknowledgements, attestations) to their
addressees. Every stage calls every site concurrently. A site whose call fails (unavailable, too
slow, or refusing) is a dropout at that stage: before its masks are fixed (advertise, share) it is
simply left out; after masking its pairwise masks are removed from the others' shares; a survivor
that does not sign the survivor list (or then does not unmask) still has its input in the sum. Fewer
than ``threshold`` sites at any stage (sparse: more than the allowance lost in a neighbourhood)
abort the round and nothing is released; so does, in a sparse round, a site lost before it revealed
its nonce (:class:`SitesLostError`: the caller may start a round without it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import AbortedError, DPMarketError
from dpmarket.common.ids import short_id
from dpmarket.common.secagg.crypto import SecAggError
from dpmarket.common.secagg.endpoints import SecureAggregationEndpoint
from dpmarket.common.secagg.protocol import KeyAdvertisement, RoundParams, SecAggAggregator
from dpmarket.common.secagg.sparse import SparseSecAggAggregator
from dpmarket.curator.disclosure import public_text

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class AggregationOutcome:
    """The result of a round.

    Attributes
    ----------
    total : ndarray of shape (vector_length,), float64
        The sum of the survivors' inputs (within quantization error).
    survivors : tuple of str
        The sites whose inputs are in the sum (U3).
    dropped : dict of str to str
        Sites lost during the round, with the stage and the reason.
    """

    total: NDArray[np.float64]
    survivors: tuple[str, ...]
    dropped: dict[str, str]


class SitesLostError(AbortedError):
    """A sparse round aborted because sites were lost before they revealed their graph nonce
    (the seed cannot leave them out); ``lost`` names them. Nothing was released: a new round
    without them may run.

    Attributes
    ----------
    lost : tuple of str
    dropped : dict of str to str
        Every site lost in the round, with the stage and the reason.
    """

    def __init__(self, message: str, lost: Sequence[str], dropped: Mapping[str, str]) -> None:
        super().__init__(message)
        self.lost = tuple(lost)
        self.dropped = dict(dropped)


async def _call_each(
    sites: Sequence[str],
    call: Callable[[str], Awaitable[T]],
    timeout: float | None,
    dropped: dict[str, str],
    stage: str,
) -> dict[str, T]:
    """Call every site concurrently; record failures as dropouts at ``stage``."""

    async def one(site: str) -> T:
        if timeout is None:
            return await call(site)
        try:
            return await asyncio.wait_for(call(site), timeout)
        except TimeoutError as exc:
            raise AbortedError(f"no answer within {timeout} s") from exc

    answers = await asyncio.gather(*(one(s) for s in sites), return_exceptions=True)
    out: dict[str, T] = {}
    for site, answer in zip(sites, answers, strict=True):
        if isinstance(answer, DPMarketError | ValueError):
            dropped[site] = f"{stage}: {public_text(answer)}"  # in the consumer's report
            logger.warning("site %s dropped at %s: %s", site, stage, answer)
        elif isinstance(answer, BaseException):
            raise answer
        else:
            out[site] = answer
    return out


async def aggregate(
    endpoints: Mapping[str, SecureAggregationEndpoint],
    job_id: str,
    params: RoundParams,
    *,
    timeout: float | None = None,
    phase_seconds: dict[str, float] | None = None,
) -> AggregationOutcome:
    """Run one secure-aggregation round of ``job_id`` across ``endpoints``.

    Parameters
    ----------
    endpoints : mapping of str to SecureAggregationEndpoint
        Every site of ``params.sites``.
    job_id : str
        The job whose input the sites sum.
    params : RoundParams
        The round's public parameters (fresh ``round_id``).
    timeout : float, optional
        Seconds after which a site that has not answered a call is a dropout.
    phase_seconds : dict, optional
        If given, filled with the wall-clock seconds of each phase as the curator sees it (the
        names of :func:`dpmarket.common.secagg.protocol.run_in_process`): ``advertise_keys``,
        (sparse rounds) ``reveal_nonces``, ``share_keys``, ``masked_input``,
        ``consistency_check`` and ``unmask`` (the concurrent calls and the aggregator's
        collection of their answers), ``finish`` (reconstruction and unmasking).

    Returns
    -------
    AggregationOutcome

    Raises
    ------
    SitesLostError
        Sparse rounds: if a site was lost before revealing its graph nonce (nothing released).
    AbortedError
        If fewer than ``params.threshold`` sites remain at some stage (sparse: a neighbourhood
        lost more than the allowance), or a check fails (a tampered message, a bad signature or
        tag): nothing is released.
    """
    dropped: dict[str, str] = {}
    rid = params.round_id.hex()[:8]
    phases: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        phases[phase] = now - clock
        clock = now

    try:
        if params.sparse:
            total, survivors = await _sparse_round(endpoints, job_id, params, timeout, dropped, lap)
        else:
            total, survivors = await _complete_round(
                endpoints, job_id, params, timeout, dropped, lap
            )
    except SitesLostError:
        raise
    except SecAggError as exc:
        raise AbortedError(
            f"secure aggregation round {rid}… of job {short_id(job_id)} aborted: {exc}"
            + (f" (dropped: {dropped})" if dropped else "")
        ) from exc
    if phase_seconds is not None:
        phase_seconds.update(phases)
    return AggregationOutcome(total=total, survivors=tuple(survivors), dropped=dropped)


async def _advertise(
    endpoints: Mapping[str, SecureAggregationEndpoint],
    job_id: str,
    params: RoundParams,
    timeout: float | None,
    dropped: dict[str, str],
) -> dict[str, tuple[KeyAdvertisement, bytes]]:
    ads = await _call_each(
        params.sites,
        lambda s: endpoints[s].advertise_keys(job_id, params),
        timeout,
        dropped,
        "advertise keys",
    )
    for site, (ad, _) in list(ads.items()):
        if ad.site != site:  # the channel authenticated the site; the message must agree
            dropped[site] = f"advertise keys: advertised as {ad.site!r}"
            del ads[site]
    return ads


async def _complete_round(
    endpoints: Mapping[str, SecureAggregationEndpoint],
    job_id: str,
    params: RoundParams,
    timeout: float | None,
    dropped: dict[str, str],
    lap: Callable[[str], None],
) -> tuple[NDArray[np.float64], tuple[str, ...]]:
    """Bonawitz et al.'s five rounds (:class:`dpmarket.common.secagg.protocol.SecAggAggregator`)."""
    aggregator = SecAggAggregator(params)
    ads = await _advertise(endpoints, job_id, params, timeout, dropped)
    advertisements = aggregator.collect_advertisements({s: a for s, (a, _) in ads.items()})
    certificates = {s: cert for s, (_, cert) in ads.items()}
    lap("advertise_keys")
    shared = await _call_each(
        sorted(advertisements),
        lambda s: endpoints[s].share_keys(job_id, params, advertisements, certificates),
        timeout,
        dropped,
        "share keys",
    )
    routed = aggregator.route_shares(shared)
    lap("share_keys")
    masked = await _call_each(
        sorted(routed),
        lambda s: endpoints[s].masked_input(job_id, params, routed[s]),
        timeout,
        dropped,
        "masked input",
    )
    survivors, lost = aggregator.collect_masked({s: m.vector for s, m in masked.items()})
    lap("masked_input")
    attested = await _call_each(
        list(survivors),
        lambda s: endpoints[s].consistency_check(job_id, params, survivors),
        timeout,
        dropped,
        "consistency check",
    )
    signed = aggregator.collect_signatures({s: a.signature for s, a in attested.items()})
    lap("consistency_check")
    responses = await _call_each(
        sorted(signed),
        lambda s: endpoints[s].unmask(job_id, params, survivors, lost, signed),
        timeout,
        dropped,
        "unmask",
    )
    lap("unmask")
    # Unmasking expands every self mask (and a lost site's pairwise masks) over the whole
    # vector: CPU work that must not hold up the event loop.
    total = await asyncio.to_thread(aggregator.finish, responses)
    lap("finish")
    return total, survivors


async def _sparse_round(
    endpoints: Mapping[str, SecureAggregationEndpoint],
    job_id: str,
    params: RoundParams,
    timeout: float | None,
    dropped: dict[str, str],
    lap: Callable[[str], None],
) -> tuple[NDArray[np.float64], tuple[str, ...]]:
    """SecAgg+'s six stages (:class:`dpmarket.common.secagg.sparse.SparseSecAggAggregator`)."""
    aggregator = SparseSecAggAggregator(params)
    ads = await _advertise(endpoints, job_id, params, timeout, dropped)
    advertisements = aggregator.collect_advertisements({s: a for s, (a, _) in ads.items()})
    certificates = {s: cert for s, (_, cert) in ads.items()}
    lap("advertise_keys")
    revealed = await _call_each(
        sorted(advertisements),
        lambda s: endpoints[s].reveal_nonce(job_id, params, advertisements, certificates),
        timeout,
        dropped,
        "reveal nonce",
    )
    missing = sorted(set(advertisements) - set(revealed))
    if missing:
        raise SitesLostError(
            f"secure aggregation round {params.round_id.hex()[:8]}… of job {short_id(job_id)}: "
            f"sites lost before revealing their graph nonce: {missing} (dropped: {dropped})",
            missing,
            dropped,
        )
    nonces = aggregator.collect_nonces(revealed)
    lap("reveal_nonces")
    shared = await _call_each(
        sorted(nonces),
        lambda s: endpoints[s].share_keys(job_id, params, {}, {}, nonces),
        timeout,
        dropped,
        "share keys",
    )
    routed = aggregator.route_shares(shared)
    lap("share_keys")
    masked = await _call_each(
        sorted(routed),
        lambda s: endpoints[s].masked_input(job_id, params, routed[s]),
        timeout,
        dropped,
        "masked input",
    )
    survivors, lost = aggregator.collect_masked(
        {s: m.vector for s, m in masked.items()},
        {s: m.acknowledgements for s, m in masked.items()},
    )
    lap("masked_input")
    attested = await _call_each(
        list(survivors),
        lambda s: endpoints[s].consistency_check(job_id, params, survivors),
        timeout,
        dropped,
        "consistency check",
    )
    forwarded = aggregator.collect_attestations({s: a.tags for s, a in attested.items()})
    lap("consistency_check")
    responses = await _call_each(
        sorted(forwarded),
        lambda s: endpoints[s].unmask(job_id, params, survivors, lost, *forwarded[s]),
        timeout,
        dropped,
        "unmask",
    )
    lap("unmask")
    total = await asyncio.to_thread(aggregator.finish, responses)
    lap("finish")
    return total, survivors
