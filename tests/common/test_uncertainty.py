"""The shared rules of :mod:`dpmarket.common.uncertainty`: an interval printed rounded outwards."""

from __future__ import annotations

import numpy as np

from dpmarket.common.uncertainty import interval_text, outward


def test_a_printed_interval_is_rounded_outwards_and_holds_the_stated_one() -> None:
    """Issue 28 (D2). Control: to the nearest (``:.0f``, what the CLI and the console printed)
    ``[47.9, 99.3]`` was ``[48, 99]``, inside the stated interval. Deterministic: 1,000 seeded
    intervals at 0, 1 and 2 decimals each hold theirs, and no end moves by a whole decimal."""
    assert interval_text(47.9, 99.3) == "[47, 100]"
    assert f"[{47.9:.0f}, {99.3:.0f}]" == "[48, 99]"  # the control
    assert interval_text(249.0, 317.0) == "[249, 317]"  # whole numbers stay
    assert interval_text(0.3, 0.7, 1) == "[0.3, 0.7]"  # floating error is not rounding
    assert interval_text(151.84, 232.41, 1) == "[151.8, 232.5]"
    rng = np.random.default_rng(28)
    for low, high in np.sort(rng.uniform(-500, 500, (1000, 2)), axis=1):
        for decimals in (0, 1, 2):
            lo, hi = outward(float(low), float(high), decimals)
            step = 10.0**-decimals
            assert lo <= low and hi >= high
            assert low - lo < step and hi - high < step
