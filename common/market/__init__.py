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
