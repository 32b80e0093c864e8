"""Every summarization method's strategy, by the type of its configuration.

The registry the session looks a method up in (:func:`strategy_for`): adding a method is adding
its configuration class (:mod:`dpmarket.common.summarization.methods`), its terms
(:func:`~dpmarket.common.summarization.terms.owner_terms`) and its strategy here.
"""

from __future__ import annotations

from typing import Any

from dpmarket.common.summarization.methods import (
    CandidatesConfig,
    GreedyConfig,
    HashesConfig,
    PrivateConfig,
    RoundsConfig,
    SummarizationConfig,
    UniformConfig,
)
from dpmarket.curator.summarization.candidates import CandidatesStrategy, HashesStrategy
from dpmarket.curator.summarization.rounds import GreedyStrategy, PrivateStrategy, RoundsStrategy
from dpmarket.curator.summarization.state import SessionState
from dpmarket.curator.summarization.strategy import Strategy
from dpmarket.curator.summarization.uniform import UniformStrategy

__all__ = ["STRATEGIES", "strategy_for"]

#: Each method's strategy, by its configuration's class.
STRATEGIES: dict[type[SummarizationConfig], type[Strategy[Any]]] = {
    UniformConfig: UniformStrategy,
    GreedyConfig: GreedyStrategy,
    PrivateConfig: PrivateStrategy,
    RoundsConfig: RoundsStrategy,
    CandidatesConfig: CandidatesStrategy,
    HashesConfig: HashesStrategy,
}


def strategy_for(state: SessionState) -> Strategy[Any]:
    """The strategy of the session's method, on its state.

    Raises
    ------
    TypeError
        If the configuration is not a registered method's.
    """
    cls = STRATEGIES.get(type(state.config))
    if cls is None:
        raise TypeError(f"no strategy for {type(state.config).__name__}")
    return cls(state, state.config)
