"""The market (docs/how-it-works.md, "The market"; summarization paper, Section 2, "Incentives").

Pure kernels, numpy only, no I/O and no gRPC:

* :mod:`~dpmarket.common.market.attribution` -- what each owner's delivered points were worth
  against D_v: the paper's rule, exact and sampled Shapley values, leave-one-out;
* :mod:`~dpmarket.common.market.payouts` -- the private payout release (Laplace on each owner's
  Shapley value of the embedding game; sensitivities derived) and the reward rules;
* :mod:`~dpmarket.common.market.money` -- credits as integer micro-credits, epsilon and values
  as integers;
* :mod:`~dpmarket.common.market.pricing` -- owners' prices, charges, quotes and the consumer's
  cap;
* :mod:`~dpmarket.common.market.statement` -- settlement statements, their canonical bytes,
  signatures and the owner's check.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Each name this package exports -> its module, imported on first use (PEP 562): a program that
#: needs only :mod:`~dpmarket.common.market.money` (the client, every command's ``--help``) does
#: not pay for :mod:`~dpmarket.common.market.attribution`'s kernels (scikit-learn, scipy).
_EXPORTS = {
    "MAX_EXACT_OWNERS": "attribution",
    "Attribution": "attribution",
    "EmbeddingGame": "attribution",
    "ObjectiveGame": "attribution",
    "SummaryBlocks": "attribution",
    "SummaryGame": "attribution",
    "embedding_shapley": "attribution",
    "exact_shapley": "attribution",
    "leave_one_out": "attribution",
    "paper_rule": "attribution",
    "sampled_shapley": "attribution",
    "EPSILON_UNITS": "money",
    "MICRO_CREDITS": "money",
    "VALUE_UNITS": "money",
    "epsilon_units": "money",
    "format_credits": "money",
    "parse_credits": "money",
    "value_units": "money",
    "POINT_VALUE_MEAN": "payouts",
    "POINT_VALUE_SPREAD": "payouts",
    "PayoutRelease": "payouts",
    "PayoutSensitivity": "payouts",
    "ProportionalSplit": "payouts",
    "RewardRule": "payouts",
    "ValueReward": "payouts",
    "payout_noise_scale": "payouts",
    "payout_sensitivity": "payouts",
    "release_payouts": "payouts",
    "Charge": "pricing",
    "CostCapExceededError": "pricing",
    "OwnerLimits": "pricing",
    "OwnerPrices": "pricing",
    "Quote": "pricing",
    "QuoteLine": "pricing",
    "check_cap": "pricing",
    "owner_charge": "pricing",
    "quote": "pricing",
    "OwnerRecord": "statement",
    "OwnerStatement": "statement",
    "SessionRecord": "statement",
    "SettlementTerms": "statement",
    "Statement": "statement",
    "StatementError": "statement",
    "StatementHeader": "statement",
    "StatementLine": "statement",
    "StatementMismatchError": "statement",
    "check_statement": "statement",
    "decode_owner_statement": "statement",
    "decode_statement": "statement",
    "settle": "statement",
    "sign_statement": "statement",
    "verify_statement": "statement",
}

if TYPE_CHECKING:
    from dpmarket.common.market.attribution import (
        MAX_EXACT_OWNERS,
        Attribution,
        EmbeddingGame,
        ObjectiveGame,
        SummaryBlocks,
        SummaryGame,
        embedding_shapley,
        exact_shapley,
        leave_one_out,
        paper_rule,
        sampled_shapley,
    )
    from dpmarket.common.market.money import (
        EPSILON_UNITS,
        MICRO_CREDITS,
        VALUE_UNITS,
        epsilon_units,
        format_credits,
        parse_credits,
        value_units,
    )
    from dpmarket.common.market.payouts import (
        POINT_VALUE_MEAN,
        POINT_VALUE_SPREAD,
        PayoutRelease,
        PayoutSensitivity,
        ProportionalSplit,
        RewardRule,
        ValueReward,
        payout_noise_scale,
        payout_sensitivity,
        release_payouts,
    )
    from dpmarket.common.market.pricing import (
        Charge,
        CostCapExceededError,
        OwnerLimits,
        OwnerPrices,
        Quote,
        QuoteLine,
        check_cap,
        owner_charge,
        quote,
    )
    from dpmarket.common.market.statement import (
        OwnerRecord,
        OwnerStatement,
        SessionRecord,
        SettlementTerms,
        Statement,
        StatementError,
        StatementHeader,
        StatementLine,
        StatementMismatchError,
        check_statement,
        decode_owner_statement,
        decode_statement,
        settle,
        sign_statement,
        verify_statement,
    )


def __getattr__(name: str) -> Any:
    """The exported ``name``, its module imported now."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "EPSILON_UNITS",
    "MAX_EXACT_OWNERS",
    "MICRO_CREDITS",
    "POINT_VALUE_MEAN",
    "POINT_VALUE_SPREAD",
    "VALUE_UNITS",
    "Attribution",
    "Charge",
    "CostCapExceededError",
    "EmbeddingGame",
    "ObjectiveGame",
    "OwnerLimits",
    "OwnerPrices",
    "OwnerRecord",
    "OwnerStatement",
    "PayoutRelease",
    "PayoutSensitivity",
    "ProportionalSplit",
    "Quote",
    "QuoteLine",
    "RewardRule",
    "SessionRecord",
    "SettlementTerms",
    "Statement",
    "StatementError",
    "StatementHeader",
    "StatementLine",
    "StatementMismatchError",
    "SummaryBlocks",
    "SummaryGame",
    "ValueReward",
    "check_cap",
    "check_statement",
    "decode_owner_statement",
    "decode_statement",
    "embedding_shapley",
    "epsilon_units",
    "exact_shapley",
    "format_credits",
    "leave_one_out",
    "owner_charge",
    "paper_rule",
    "parse_credits",
    "payout_noise_scale",
    "payout_sensitivity",
    "quote",
    "release_payouts",
    "sampled_shapley",
    "settle",
    "sign_statement",
    "value_units",
    "verify_statement",
]
