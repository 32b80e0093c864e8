"""The documented client (:mod:`dpmarket.client`) as a program sees it: one unit for every cost
cap, documented keyword parameters, errors inside the contract."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpmarket.client import Consumer, ledger
from dpmarket.common.errors import DPMarketError, InvalidArgumentError, NotFoundError
from dpmarket.common.market.money import credits_cap, parse_credits
from dpmarket.consumer.cli import CREDITS

CAPE_METHODS = (Consumer.cape_mean, Consumer.cape_fit, Consumer.cape_train)


@pytest.mark.parametrize("method", CAPE_METHODS, ids=lambda m: m.__name__)
def test_the_cape_methods_document_every_keyword(method: object) -> None:
    """No ``**kw`` passed through unseen: the keywords are named, and the docstring says what
    they return and raise."""
    parameters = inspect.signature(method).parameters  # type: ignore[arg-type]
    assert not [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    expected = {"seed", "request_id", "timeout", "schema", "min_owners", "max_cost"}
    assert expected <= set(parameters)
    doc = inspect.getdoc(method) or ""
    assert "Returns\n-------" in doc and "Raises\n------" in doc
    assert "credits" in doc


def test_max_cost_has_one_unit_everywhere() -> None:
    """``summarize``'s convention (credits, as text or an int) for the CAPE jobs and the
    command line alike: 5 is five credits, never five micro-credits."""
    for amount in ("12.5", 5, "0.000001"):
        assert credits_cap(amount) == parse_credits(amount) == CREDITS.convert(amount, None, None)
    assert CREDITS.convert(5, None, None) == 5_000_000  # a configuration file's integer
    assert credits_cap(None) is None
    with pytest.raises(ValueError, match="decimal string"):
        credits_cap(12.5)  # type: ignore[arg-type]
    signature = inspect.signature(Consumer.summarize)
    for method in CAPE_METHODS:
        cap = inspect.signature(method).parameters["max_cost"]
        assert cap.annotation == signature.parameters["max_cost"].annotation


def test_importing_the_client_loads_neither_scikit_learn_nor_pandas() -> None:
    """A program that imports :mod:`dpmarket.client` pays for what it calls: the market's package
    exports its names on first use, the kernels, tables and evaluation import their libraries
    when they run. The market's names still resolve, and a kernel still computes (the control:
    then scikit-learn, and pandas with it, load)."""
    probe = (
        "import sys, dpmarket.client\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'sklearn', 'pandas'}))\n"
        "from dpmarket.common.market import paper_rule, quote\n"
        "from dpmarket.common.summarization.kernels import rbf_kernel\n"
        "print(callable(paper_rule) and callable(quote), rbf_kernel([[0.0]], [[0.0]], 1.0))\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'sklearn', 'pandas'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.splitlines() == ["[]", "True [[1.]]", "['pandas', 'sklearn']"]


def test_a_missing_ledger_is_an_error_of_the_client_s_contract(tmp_path: Path) -> None:
    """``ledger`` raises a DPMarketError (NotFoundError) for a directory without a ledger, and a
    FileNotFoundError as it always did, so callers of either kind catch it."""
    with pytest.raises(NotFoundError, match="no owner ledger") as info:
        ledger(tmp_path / "nope")
    assert isinstance(info.value, DPMarketError) and isinstance(info.value, FileNotFoundError)


def test_a_summary_of_a_dict_says_what_to_pass() -> None:
    """A dict of options instead of a configuration: InvalidArgumentError naming both, before
    anything is sent (the connection below is never made: no curator listens)."""
    consumer = Consumer.__new__(Consumer)  # no connection: the check comes first
    with pytest.raises(
        InvalidArgumentError, match=r"got dict \{'summary_size': 5\}.*CandidatesConfig"
    ):
        consumer.summarize({"summary_size": 5}, np.zeros((3, 2)))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="SummarizationConfig"):
        consumer.quote({"summary_size": 5}, np.zeros((3, 2)))  # type: ignore[arg-type]
