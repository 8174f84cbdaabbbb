"""``python -m bench.xfer`` end to end on a tiny state (smoke), and the sweep's line fit."""

from __future__ import annotations

import pytest

from bench.xfer import measure
from bench.xfer_sweep import linear_fit


def test_the_line_fit_recovers_a_line():
    c, k = linear_fit([1.0, 2.0, 4.0], [3.5, 5.5, 9.5])
    assert c == pytest.approx(1.5) and k == pytest.approx(2.0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_tiny_transfer_is_measured_in_both_modes_against_the_floor():
    result = measure(1.0, sources=2, repeats=2, timeout_s=240)
    assert result["sources"] == 2 and 0.9e6 < result["bytes"] < 1.2e6
    for mode in ("baseline", "prepared", "broadcast"):
        assert len(result["seconds"][mode]) == 2 and all(s > 0 for s in result["seconds"][mode])
    assert result["prepared"]["efficiency"] > 0 and result["baseline"]["efficiency"] > 0
