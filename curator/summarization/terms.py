"""What a session states to the owners: its terms, and the opening that carries them.

Before anything is released, the curator derives what the whole session will spend of each owner's
privacy (:class:`~dpmarket.common.summarization.terms.OwnerTerms`, from the configuration alone, by
the event lists the session's ledgers charge) and opens the session at every owner with those terms
and h1's public parameters. Each owner checks the terms against its own policy and charges them to
its own ledger before its first release.
"""

from __future__ import annotations

import asyncio
import dataclasses

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.market.terms import MarketTerms
from dpmarket.common.summarization.rff import draw_rff_params
from dpmarket.common.summarization.terms import OwnerTerms, owner_terms
from dpmarket.curator.summarization.state import SessionState

__all__ = ["Offer"]


class Offer:
    """The session's offer to the owners: the terms and the opening of the session.

    Parameters
    ----------
    state : SessionState
    """

    def __init__(self, state: SessionState) -> None:
        self.state = state

    async def terms(self, *, sketch_allocation: bool = False) -> OwnerTerms:
        """The session's terms for every owner: its method's own
        (:func:`~dpmarket.common.summarization.terms.owner_terms`), under the candidates
        allocation the method chose (``sketch_allocation``)."""
        state = self.state
        return await asyncio.to_thread(
            owner_terms,
            state.config,
            len(state.slots),
            validation_size=int(state.validation.shape[0]),
            seed_set_size=int(state.seed_set.shape[0]),
            sketch_allocation=sketch_allocation,
        )

    async def open(self, terms: OwnerTerms) -> None:
        """Draw h1's parameters and open the session at every owner with ``terms``.

        h1's parameters are public randomness, and carry the session's feature scaling (the
        schema's public bounds, which every owner checks against its own declaration): nothing
        is released or charged. Records each
        owner's allowance of raw points for the session.

        Raises
        ------
        FailedPreconditionError
            If owners' policies refuse the terms and fewer owners remain than the session
            requires (every owner, unless ``min_owners`` says otherwise; the message names who
            was left out, "budget refused", never a budget figure), or the owners' policies
            allow fewer raw points than the summary size.
        UnavailableError
            If an owner cannot be reached and fewer remain than required, or every owner
            dropped out.
        """
        state = self.state
        cfg = state.config
        rff = draw_rff_params(
            state.validation.shape[1],
            cfg.rff_dimension,
            cfg.gamma,
            state.rng,
            scaling=state.scaling,
        )
        state.rff = rff
        seeds = state.rng.integers(0, 2**63 - 1, size=len(state.slots))

        def owner_terms(i: int) -> OwnerTerms:
            # Each owner gets its own line of the quote (never another owner's prices).
            if state.quote is None or state.settlement is None:
                return terms
            market = MarketTerms.of(state.quote, state.owner_name(i), state.settlement)
            return dataclasses.replace(terms, market=market)

        async def open_one(i: int) -> tuple[int, int]:
            state.slots[i].opened = True
            return await state.endpoint(i).open_session(
                state.owner_session_id,
                rff,
                int(seeds[i]),
                consumer=state.consumer,
                terms=owner_terms(i),
            )

        # An owner whose policy refuses the terms is left out, charged nothing; the session
        # then opens only if as many owners as it requires remain (every owner by default).
        opened = await state.gather(state.active(), open_one, refusals="leave_out", stage="open")
        for index, (_, max_points) in opened.items():
            state.slots[index].max_points = int(max_points)
        for index in range(len(state.slots)):
            if state.slots[index].left_out in ("budget refused", "refused the session"):
                state.slots[index].opened = False  # it refused: there is no session to close
        state.require_min_owners()
        allowed = sum(state.slots[i].max_points for i in state.active())
        if cfg.summary_size > allowed:
            # How many they allow follows from what is left of their budgets: not said here.
            raise FailedPreconditionError(
                f"the owners' policies allow this session fewer raw points than p = "
                f"{cfg.summary_size} (their per-session share of their tables, or what is left "
                "of their budgets): ask for a smaller summary"
            )
