"""The diagnosis laboratory: design half only, and every variant within the default's 3p reads,
none read twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpmarket.experiments.suite_diagnosis import NOISE_FREE_VARIANTS, Lab, _lab, run_diagnosis
from dpmarket.experiments.suite_split import HeldOutScenarioError, load_split


def test_the_diagnosis_refuses_a_held_out_scenario(tmp_path: Path) -> None:
    with pytest.raises(HeldOutScenarioError):
        run_diagnosis([load_split().held_out[0]], [0], tmp_path)
    assert not any(tmp_path.iterdir())


def test_every_variant_reads_at_most_3p(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    lab = _lab("penguins-3", 0, tmp_path)
    reads: list[int] = []
    rerank = Lab.rerank

    def counted(self: Lab, picks: Any, **kw: Any) -> Any:
        sizes = [np.unique(v).size for v in picks.values()]
        assert sizes == [v.size for v in picks.values()]  # no point read twice
        reads.append(sum(sizes))
        return rerank(self, picks, **kw)

    monkeypatch.setattr(Lab, "rerank", counted)
    for name, variant in NOISE_FREE_VARIANTS.items():
        if name.startswith("RFF greedy"):
            continue  # the reference reads every point
        reads.clear()
        value = variant(lab)
        assert np.isfinite(value) and value > 0, name
        assert max(reads) <= 3 * lab.p, name
    # The oracle allocation follows exact greedy: on penguins-3 the Gentoos are at Biscoe's.
    assert lab.exact_owner_counts.sum() == lab.p
    assert int(np.argmax(lab.exact_owner_counts)) == 0
