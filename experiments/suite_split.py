"""The scenario suite's split into a design half and a held-out half, drawn once and recorded.

Issue 27: "Split it once, at random and recorded, into a design half and a held-out half;
choose every constant on the design half; report the held-out half." The split was drawn once
by :func:`draw_split` with the seed recorded beside it and written to ``suite_split.toml`` (next
to this module) by :func:`write_split`; from then on it is *read*, never redrawn: adding a
scenario means adding it to one half of the file by hand (a test fails until every scenario is
in exactly one half, and checks that the recorded halves of the original scenarios are what the
recorded seed draws).

The draw is stratified by family (:data:`dpmarket.experiments.suite_tables.FAMILIES`): within
each family, in the order of ``FAMILIES``, the sorted names are permuted by
``numpy.random.default_rng(seed)`` and the first half go to the design half (rounded up for
the 1st, 3rd and 5th family, down for the others), so that both halves hold every pattern.

Whatever chooses a constant of the method (``dpmarket lab evaluate --suite --loso``,
:func:`dpmarket.experiments.suite_eval.leave_one_scenario_out`) calls :func:`require_design`
first, which refuses a held-out scenario.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from dpmarket.experiments.suite_tables import FAMILIES, SuiteEntry

__all__ = [
    "HALVES",
    "SPLIT_FILE",
    "Half",
    "HeldOutScenarioError",
    "SuiteSplit",
    "draw_split",
    "load_split",
    "require_design",
    "write_split",
]

Half = Literal["design", "held-out"]
#: The two halves, as ``dpmarket lab evaluate --suite --half`` names them.
HALVES: tuple[Half, ...] = ("design", "held-out")
#: Where the split is recorded (shipped with the package).
SPLIT_FILE = Path(__file__).with_name("suite_split.toml")


class HeldOutScenarioError(ValueError):
    """A constant would be chosen with a held-out scenario among the data."""


@dataclass(frozen=True)
class SuiteSplit:
    """The recorded split.

    Attributes
    ----------
    seed : int
        The seed :func:`draw_split` drew it with.
    design, held_out : tuple of str
        Scenario names, sorted; disjoint.
    """

    seed: int
    design: tuple[str, ...]
    held_out: tuple[str, ...]

    def names(self, half: Half) -> tuple[str, ...]:
        """The scenarios of one half (sorted).

        Raises
        ------
        ValueError
            If ``half`` is not one of :data:`HALVES`.
        """
        if half == "design":
            return self.design
        if half == "held-out":
            return self.held_out
        raise ValueError(f"half must be one of {HALVES}, got {half!r}")

    def half_of(self, name: str) -> Half:
        """Which half a scenario is in.

        Raises
        ------
        ValueError
            If the split does not hold ``name``.
        """
        if name in self.design:
            return "design"
        if name in self.held_out:
            return "held-out"
        raise ValueError(
            f"scenario {name!r} is in neither half of {SPLIT_FILE.name}: add it to one half "
            "by hand (the split is drawn once)"
        )


def draw_split(entries: Sequence[SuiteEntry], seed: int) -> SuiteSplit:
    """Draw the split (once: the result is recorded by :func:`write_split`).

    Parameters
    ----------
    entries : sequence of SuiteEntry
        The suite.
    seed : int
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    SuiteSplit
        Within each family (in the order of ``FAMILIES``), the sorted names permuted and the
        first ``ceil(n / 2)`` (families 1, 3, 5) or ``floor(n / 2)`` (families 2, 4) put in the
        design half.

    Raises
    ------
    ValueError
        If an entry's family is unknown or a name repeats.
    """
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"scenario names must be unique, got {names}")
    unknown = sorted({e.family for e in entries} - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown families {unknown}; known: {FAMILIES}")
    rng = np.random.default_rng(seed)
    design: list[str] = []
    held_out: list[str] = []
    for index, family in enumerate(FAMILIES):
        members = sorted(e.name for e in entries if e.family == family)
        order = rng.permutation(len(members))
        half = len(members) / 2
        take = math.ceil(half) if index % 2 == 0 else math.floor(half)
        design += [members[j] for j in order[:take]]
        held_out += [members[j] for j in order[take:]]
    return SuiteSplit(int(seed), tuple(sorted(design)), tuple(sorted(held_out)))


def write_split(split: SuiteSplit, path: Path = SPLIT_FILE) -> None:
    """Record the split as TOML (done once; the file is then edited only to add a scenario)."""
    lines = [
        "# The scenario suite's split into a design half and a held-out half (issue 27).",
        "# Drawn once by dpmarket.experiments.suite_split.draw_split(SUITE, seed), stratified",
        "# by family. Choose every constant on the design half; report the held-out half.",
        "# Never move a scenario from one half to the other; add a new scenario to one by hand.",
        f"seed = {split.seed}",
        "design = [",
        *[f'    "{n}",' for n in split.design],
        "]",
        "held_out = [",
        *[f'    "{n}",' for n in split.held_out],
        "]",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def load_split(path: Path = SPLIT_FILE) -> SuiteSplit:
    """Read the recorded split.

    Raises
    ------
    ValueError
        If the file lacks a key or a scenario is in both halves.
    OSError
        If the file cannot be read.
    """
    with path.open("rb") as handle:
        raw = tomllib.load(handle)
    try:
        split = SuiteSplit(
            int(raw["seed"]), tuple(sorted(raw["design"])), tuple(sorted(raw["held_out"]))
        )
    except KeyError as exc:
        raise ValueError(f"{path} lacks the key {exc.args[0]!r}") from exc
    both = sorted(set(split.design) & set(split.held_out))
    if both:
        raise ValueError(f"{path}: {both} are in both halves")
    return split


def require_design(names: Iterable[str], what: str, split: SuiteSplit | None = None) -> None:
    """Refuse to choose a constant with a held-out scenario among the data.

    Parameters
    ----------
    names : iterable of str
        The scenarios ``what`` would read.
    what : str
        What is being chosen, for the message (e.g. "leave-one-scenario-out").
    split : SuiteSplit, optional
        Default: the recorded split (:func:`load_split`).

    Raises
    ------
    HeldOutScenarioError
        If one of ``names`` is in the held-out half (or in neither half).
    """
    split = split or load_split()
    bad = sorted(n for n in names if n not in split.design)
    if bad:
        raise HeldOutScenarioError(
            f"{what} chooses constants, and {', '.join(bad)} "
            f"{'is' if len(bad) == 1 else 'are'} not in the design half of {SPLIT_FILE.name}: "
            "choose constants on the design half only (--half design) and report the held-out "
            "half with the constants fixed"
        )
