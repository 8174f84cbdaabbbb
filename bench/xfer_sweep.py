"""``python -m bench.xfer_sweep``: transfer time against state size, and against source count.

Runs :func:`bench.xfer.measure` once per size (one size at a time: the largest hold several GB)
and once per source count at a fixed size, writes every figure to ``--json`` and plots
``--out`` (docs/img/transfer_sweep.png): left, transfer time against bytes for the baseline and
the prepared receive with the gloo broadcast floor on the same axes, each with its least-squares
line ``t = c + bytes / rate`` (the constant ``c`` and the rate in the legend); right, transfer
time against the number of sources.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless
import matplotlib.pyplot as plt

from bench.plot import save_figure
from bench.xfer import measure

SERIES = {"broadcast": "gloo broadcast (floor)", "baseline": "baseline", "prepared": "prepared"}
COLORS = {"broadcast": "tab:gray", "baseline": "tab:red", "prepared": "tab:blue"}


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = c + k x``; returns ``(c, k)``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    k = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - k * mx, k


def _series(runs: list[dict], name: str) -> tuple[list[float], list[list[float]]]:
    return [r["bytes"] / 1e6 for r in runs], [r["seconds"][name] for r in runs]


def plot(
    sizes: list[dict], stripes: list[dict], path: Path, fit_below_mb: float
) -> dict[str, tuple[float, float]]:
    """Draw the figure; returns each series' fit ``(constant s, MB/s)`` over the sizes under
    ``fit_below_mb`` (larger ones are drawn, hollow, but not fitted)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    fits = {}
    for name, label in SERIES.items():
        mbs, times = _series(sizes, name)
        medians = [statistics.median(t) for t in times]
        low = [m - min(t) for m, t in zip(medians, times, strict=True)]
        high = [max(t) - m for m, t in zip(medians, times, strict=True)]
        fitted = [(x, y) for x, y in zip(mbs, medians, strict=True) if x < fit_below_mb]
        c, k = linear_fit([x for x, _ in fitted], [y for _, y in fitted])
        fits[name] = (c, 1 / k)
        for inside in (True, False):
            keep = [i for i, x in enumerate(mbs) if (x < fit_below_mb) == inside]
            left.errorbar(
                [mbs[i] for i in keep],
                [medians[i] for i in keep],
                yerr=[[low[i] for i in keep], [high[i] for i in keep]],
                fmt="o",
                mfc=COLORS[name] if inside else "none",
                color=COLORS[name],
                capsize=3,
            )
        line = [c + k * x for x in (0, max(mbs))]
        text = f"{label}: {c * 1e3:+.1f} ms + MB / {1 / k:.0f} MB/s"
        left.plot([0, max(mbs)], line, color=COLORS[name], lw=1, label=text)
    left.set_xlabel("state moved (MB)")
    left.set_ylabel("seconds (median, min-max bars)")
    left.set_title(
        f"transfer time against state size (hollow: not fitted, > {fit_below_mb:.0f} MB)"
    )
    left.legend(fontsize=8)
    for name in ("prepared", "broadcast"):
        counts = [r["sources"] for r in stripes]
        medians = [statistics.median(r["seconds"][name]) for r in stripes]
        right.plot(counts, medians, "o-", color=COLORS[name], label=SERIES[name])
    if stripes:
        right.set_title(f"{stripes[0]['bytes'] / 1e6:.0f} MB against sources (1 receiver)")
    right.set_xlabel("sources (replicas striped over)")
    right.set_ylabel("seconds (median)")
    right.set_xticks([r["sources"] for r in stripes])
    right.legend(fontsize=8)
    save_figure(fig, path)
    return fits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="15,50,100,250,500,1000", help="MB, comma-separated")
    parser.add_argument("--stripes", default="1,2,3", help="source counts")
    parser.add_argument("--stripe-mb", type=float, default=100.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=Path("transfer_sweep.json"))
    parser.add_argument("--out", type=Path, default=Path("docs/img/transfer_sweep.png"))
    parser.add_argument("--plot-only", action="store_true", help="replot --json")
    parser.add_argument("--fit-below", type=float, default=1500.0, help="MB; larger: not fitted")
    a = parser.parse_args()
    if a.plot_only:
        data = json.loads(a.json.read_text())
    else:
        data = {"sizes": [], "stripes": []}
        for mb in (float(x) for x in a.sizes.split(",")):
            data["sizes"].append(measure(mb, 1, a.repeats))
            print(_line(data["sizes"][-1]), flush=True)
            a.json.write_text(json.dumps(data))
        for count in (int(x) for x in a.stripes.split(",")):
            data["stripes"].append(measure(a.stripe_mb, count, a.repeats))
            print(_line(data["stripes"][-1]), flush=True)
            a.json.write_text(json.dumps(data))
    fits = plot(data["sizes"], data["stripes"], a.out, a.fit_below)
    for name, (c, rate) in fits.items():
        print(f"fit {name}: {c * 1e3:+.1f} ms + MB / {rate:.0f} MB/s")


def _line(r: dict) -> str:
    medians = {k: statistics.median(v) * 1e3 for k, v in r["seconds"].items()}
    return (
        f"{r['bytes'] / 1e6:.0f} MB, {r['sources']} source(s): floor {medians['broadcast']:.1f} "
        f"ms, baseline {medians['baseline']:.1f} ms (eff {r['baseline']['efficiency']:.2f}), "
        f"prepared {medians['prepared']:.1f} ms (eff {r['prepared']['efficiency']:.2f})"
    )


if __name__ == "__main__":
    main()
