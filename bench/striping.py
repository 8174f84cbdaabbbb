"""``python -m bench.striping``: a recovery's transfer time against the number of replicas that
send it, each from its own emulated host.

Every surviving replica sends a different stripe of the state (``transfer.stripes``), so with
``n`` sources each link carries ``1/n`` of the bytes. On one machine's loopback that cannot show:
every source shares the receiver's socket copy and the same 2 cores. Here each source runs on an
emulated host of :mod:`bench.hostlinks`, behind its own link capped at ``--mbit``, as with one
NIC per host; the spare receives on an uncapped bridge. For each source count,
:func:`bench.xfer.measure` times the spare's whole receive (baseline and prepared, see
``bench/xfer.py``) and, in the same rounds, the floor: one source's gloo broadcast of the same
bytes over its one link. The ideal for ``n`` sources is that floor divided by ``n``.

Writes every figure to ``--json`` and plots ``--out`` (docs/img/striping.png). Needs root and
iproute2; about a minute per source count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless
import matplotlib.pyplot as plt

from bench.hostlinks import HostLinks, HostLinksError
from bench.xfer import measure


def sweep(counts: list[int], mb: float, mbit: float, repeats: int) -> list[dict]:
    """One :func:`bench.xfer.measure` per source count, each on fresh emulated hosts."""
    runs = []
    for count in counts:
        with HostLinks(count, mbit) as links:
            run = measure(mb, sources=count, repeats=repeats, links=links)
        runs.append({**run, "mbit": mbit})
        one = runs[0]["prepared"]["median_s"]
        print(
            f"{count} source(s): prepared {run['prepared']['median_s'] * 1e3:.0f} ms, "
            f"baseline {run['baseline']['median_s'] * 1e3:.0f} ms, one link's broadcast "
            f"{run['broadcast_median_s'] * 1e3:.0f} ms; speed-up over 1 source "
            f"{one / run['prepared']['median_s']:.2f}",
            flush=True,
        )
    return runs


def plot(runs: list[dict], out: Path) -> None:
    counts = [r["sources"] for r in runs]
    floor = statistics.median(r["broadcast_median_s"] for r in runs)
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, color in (("prepared", "tab:blue"), ("baseline", "tab:red")):
        ax.plot(counts, [r[mode]["median_s"] for r in runs], "o-", color=color, label=mode)
    ax.plot(counts, [floor / n for n in counts], "--", color="tab:gray", label="one link / n")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_xlabel("sources (each on its own capped link)")
    ax.set_ylabel("transfer time, s")
    size = runs[0]["bytes"] / 1e6
    ax.set_title(f"{size:.0f} MB to one spare, {runs[0]['mbit']:.0f} Mbit/s per source")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", default="1,2,4,8", help="source counts, comma-separated")
    parser.add_argument("--mb", type=float, default=64.0, help="state size, MB")
    parser.add_argument("--mbit", type=float, default=400.0, help="each source's link, Mbit/s")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("docs/img/striping.json"))
    parser.add_argument("--out", type=Path, default=Path("docs/img/striping.png"))
    a = parser.parse_args()
    try:
        counts = sorted({int(n) for n in a.sources.split(",")})
    except ValueError:
        sys.exit(f"bench.striping: --sources takes counts like 1,2,4,8, not {a.sources!r}")
    if counts[0] < 1:
        sys.exit("bench.striping: every source count must be at least 1")
    try:
        runs = sweep(counts, a.mb, a.mbit, a.repeats)
    except HostLinksError as exc:
        sys.exit(f"bench.striping: {exc}")
    a.json.write_text(json.dumps(runs, indent=1))
    plot(runs, a.out)
    print(f"wrote {a.json} and {a.out}")


if __name__ == "__main__":
    main()
