"""The shared base of the summarization methods' strategies on the curator's side.

A :class:`Strategy` is one method: given the session's state (its request, owners, randomness and
ledgers) and its own configuration, it decides what the session offers the owners (with
:func:`~dpmarket.common.summarization.terms.owner_terms`, each method's own), runs the method's
stages and adds its part to the report. The session
(:class:`~dpmarket.curator.summarization.session.SummarizationSession`) prepares, opens and closes
the session the same way for every method and looks the strategy up by the configuration's type
(:data:`~dpmarket.curator.summarization.strategies.STRATEGIES`): there is no dispatch on a
method's name.
"""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

from dpmarket.common.summarization.methods import SummarizationConfig
from dpmarket.common.summarization.rff import RFFParams
from dpmarket.common.summarization.session_ledger import SessionLedger
from dpmarket.common.summarization.terms import OwnerTerms
from dpmarket.curator.summarization.state import SessionState, SummaryState

__all__ = ["Strategy"]

C = TypeVar("C", bound=SummarizationConfig)


class Strategy(Generic[C]):
    """One summarization method, run on a session's state.

    Parameters
    ----------
    state : SessionState
        The session's state; ``state.config`` is this strategy's configuration.
    config : SummarizationConfig
        The method's own configuration (``state.config``, typed).

    Attributes
    ----------
    one_round : bool
        Whether the method selects its summary in one round (progress counts 1 round, not p).
    """

    one_round: bool = False

    def __init__(self, state: SessionState, config: C) -> None:
        self.state = state
        self.config = config

    # ----------------------------------------------------------------------- preparation
    @property
    def allocation(self) -> Literal["sketch", "counts"]:
        """The candidates allocation in effect: ``"counts"`` for a method without one."""
        return "counts"

    def choose(self) -> None:
        """Decide what the session's terms depend on, once the owners have described
        themselves (the candidates method: its allocation). Nothing by default."""

    def points_bound(self, terms: OwnerTerms) -> int:
        """The most raw points the session may read from any one owner under ``terms``, before
        the owner's own size and policy cap it: one per Bid round for the per-round methods
        (``terms.max_rounds``), else p (the uniform sample's share). The quote charges each
        owner at ``min(this, its size)``, and the owner releases no more."""
        if terms.exact_bids:
            return terms.max_rounds
        return self.config.summary_size

    @property
    def sketch_allocation(self) -> bool:
        """Whether the terms are those of the sketch allocation
        (:func:`~dpmarket.common.summarization.terms.owner_terms`)."""
        return self.allocation == "sketch"

    # ----------------------------------------------------------------------------- running
    async def run(self, summary: SummaryState, rff: RFFParams) -> None:
        """Select the summary's points into ``summary``; every call to an owner, every release
        and every charge of the method happens here.

        Raises
        ------
        dpmarket.common.errors.DPMarketError
            ``UnavailableError`` when the owners dropped out, ``AbortedError`` when they ran
            out of points or broke the protocol.
        """
        raise NotImplementedError

    # ----------------------------------------------------------------------------- report
    def ledger(self, ledger: SessionLedger) -> SessionLedger:
        """``ledger`` with the method's own parts of the session's report (its allocation,
        its auction); unchanged by default."""
        return ledger

    def paper_bound(self) -> float:
        """Lemma 5's expected bound on the points the session reads (the auction's methods);
        0 for the others."""
        return 0.0
