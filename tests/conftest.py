"""Shared fixtures and helpers: the bundled digits scenario, small and real; a new owner
ledger, as ``dpmarket owner ledger init`` creates one; an owner ledger whose lifetime budget is
spent; the bids a deviating curator steers to read a column; a sketch spec's mechanism, typed by
its kind. The suite's order, longest modules first, and its record (tests/scheduling.py)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from numpy.typing import NDArray

from dpmarket.common.sketches.marginals import MarginalsMechanism
from dpmarket.common.sketches.sketch import SketchMechanism
from dpmarket.common.sketches.spec import SketchSpec
from dpmarket.common.summarization.rff import RFFParams
from dpmarket.experiments.scenarios import Scenario, digits_scenario
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from tests import scheduling

#: CI (``.ci/run`` sets DPMARKET_CI) draws the same Hypothesis examples on every run, so a
#: submission lands or fails on its code, not on a draw; a run elsewhere draws afresh and may
#: find a case CI never tries (put it in the test as an ``@example`` when it does).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("DPMARKET_CI"):
    settings.load_profile("ci")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-module-seconds",
        metavar="PATH",
        help="write every module's seconds (setup, call, teardown) to PATH as JSON, longest "
        "first (the format of tests/module_seconds.json)",
    )


#: CI (``.ci/run``) keeps jax's compiled executables in this folder across its runs, as it keeps
#: mypy's cache: a marginals model's fit compiles about a hundred small XLA programs per model
#: structure, again after every :func:`~dpmarket.common.sketches.marginals.free_compiled`
#: (about 80 % of a small fit's CPU), and the suite fits the same few structures on every run.
#: Unset (the default, and the product's setting), nothing is kept on disk.
JAX_CACHE = "DPMARKET_JAX_CACHE"


def keep_compiled_executables(config: pytest.Config, directory: str) -> None:
    """Turn on jax's persistent compilation cache in ``directory`` for this process, every
    compilation kept whatever its time or size (the product turns the cache off: a long-lived
    owner would fill its disk). The executables are XLA's own, keyed by the program, the
    compile options, jax's version and the machine: a cached one is the one XLA would compile,
    so no test's outcome depends on whether it was read or compiled. ``jax_enable_x64`` and the
    other settings are the product's (:func:`~dpmarket.common.sketches.marginals._mbi` runs
    first, importing jax and mbi as the product does).

    jax writes an entry in place: the other xdist worker may read it half written, and then
    compiles the program itself after a warning, which is not the test's (the suite turns
    warnings into errors), so that warning and its twin on writing are ignored."""
    from dpmarket.common.sketches.marginals import _mbi

    _mbi()
    import jax

    for verb in ("reading", "writing"):
        config.addinivalue_line(
            "filterwarnings", f"ignore:Error {verb} persistent compilation cache entry"
        )
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    jax.config.update("jax_enable_compilation_cache", True)


def pytest_configure(config: pytest.Config) -> None:
    scheduling.register_recorder(config, config.getoption("--record-module-seconds"))
    if os.environ.get(JAX_CACHE):
        keep_compiled_executables(config, os.environ[JAX_CACHE])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest modules first (tests/scheduling.py), on every xdist worker alike."""
    scheduling.longest_modules_first(items, scheduling.recorded_seconds())


@pytest.fixture(scope="session")
def digits() -> Scenario:
    """The Appendix G split of scikit-learn's digits (five owners, task 3/4)."""
    return digits_scenario(seed=0)


def exhaust(ledger: OwnerLedger) -> None:
    """Spend the default lifetime budget (epsilon 10) on five earlier sessions of epsilon 2."""
    for j in range(5):
        ledger.charge(
            session=f"earlier-{j}",
            consumer="consumer:bob",
            curator="curator:curator",
            mechanism="Laplace relevance count",
            epsilon=2.0,
            delta=0.0,
            points=0,
        )


def new_ledger(data_dir: Path, policy: OwnerPolicy | None = None) -> Path:
    """Create an owner's ledger in ``data_dir`` (unbound: the first owner that serves it binds
    it), for an owner a test starts by hand; return ``data_dir``."""
    OwnerLedger.create(data_dir, policy or OwnerPolicy()).close()
    return data_dir


def sketch_mechanism(spec: SketchSpec, epsilon: float | None = None) -> SketchMechanism:
    """``spec.mechanism(epsilon)`` of a spec whose map is not the marginals map (typed so)."""
    mechanism = spec.mechanism(epsilon)
    assert isinstance(mechanism, SketchMechanism), f"spec {spec.name} is a marginals spec"
    return mechanism


def marginals_mechanism(spec: SketchSpec, epsilon: float | None = None) -> MarginalsMechanism:
    """``spec.mechanism(epsilon)`` of a marginals spec (typed so)."""
    mechanism = spec.mechanism(epsilon)
    assert isinstance(mechanism, MarginalsMechanism), f"spec {spec.name} is not marginals"
    return mechanism


class ColumnProbe:
    """How a deviating curator reads the largest and smallest values of columns of an owner's
    data, one Bid each (issue 25, attack 2).

    It draws h1's parameters itself, so it sends frequencies that make h1's coordinate ``k``
    ``sqrt(2/d) cos(x_c / scale + pi/2) = -sqrt(2/d) sin(x_c / scale)`` for the ``k``-th column
    ``c`` it reads, monotone in ``x_c`` while ``|x_c| < scale pi/2``, and every other coordinate
    0; then it steers the bid's direction (``gtilde - q/(q+1) g`` with gtilde 0 and q = 1) to
    ``-e_k`` (the owner's best point has the largest ``x_c``) or ``+e_k`` (the smallest), and
    inverts the sine.

    Parameters
    ----------
    n_features, d : int
        The owner's feature count and h1's dimension (``d >= len(columns)``).
    columns : tuple of int
        The columns read.
    scale : float
        Above twice the largest ``|x_c|`` (a public bound, e.g. from the schema), so that the
        sine is inverted where it is well conditioned.
    """

    def __init__(self, n_features: int, d: int, columns: tuple[int, ...], scale: float) -> None:
        omega = np.zeros((d, n_features))
        for k, column in enumerate(columns):
            omega[k, column] = 1.0 / scale
        self.rff = RFFParams(omega=omega, phase=np.full(d, math.pi / 2), gamma=1.0)
        self.d, self.scale = d, scale

    def summary_embedding(self, k: int, largest: bool) -> NDArray[np.float64]:
        """The ``g`` (with ``q = 1`` and gtilde 0) that steers the bid to the largest (or
        smallest) value of the ``k``-th column read."""
        g = np.zeros(self.d)
        g[k] = 2.0 if largest else -2.0  # the direction is -g/2
        return g

    def value(self, bid: float, largest: bool) -> float:
        """The column's value at the owner's best point, from its bid."""
        sine = bid / math.sqrt(2.0 / self.d)
        return self.scale * math.asin(sine if largest else -sine)
