"""``python -m bench.xfer`` end to end on a tiny state (smoke), on loopback and on emulated
hosts (:mod:`bench.hostlinks`), and the sweep's line fit."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from bench.hostlinks import HostLinks
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


def _leftovers(links: HostLinks) -> list[str]:
    names = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found = [links.bridge] if links.bridge in names else []
    return found + [ns for ns in (links.namespace(k) for k in range(2)) if ns in spaces]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sources_on_emulated_hosts_send_through_their_capped_links_and_leave_nothing():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("emulated hosts need root and iproute2")
    # 1 MB through 8 Mbit/s takes at least ~1 s whatever the load; on loopback, milliseconds.
    with HostLinks(2, mbit=8) as links:
        result = measure(1.0, sources=2, repeats=1, timeout_s=240, links=links)
    assert _leftovers(links) == []
    assert result["sources"] == 2 and len(result["seconds"]["prepared"]) == 1
    assert result["broadcast_median_s"] >= 0.8 * result["bytes"] / (8e6 / 8)
