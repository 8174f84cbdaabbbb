"""``python -m bench.stall_sweep``: recovery stall against the memory a killed worker holds.

The kernel unmaps a killed process's memory before anyone can learn of its death (see
``bench.exit_floor``), so a worker's host memory is added to every recovery's detection: ~70 ms
per GiB on 4 KiB pages, about a tenth of that on the huge pages the node agent gives workers'
heaps (:mod:`torchrelay.heap`), next to nothing with torchrelay's exit holder
(:mod:`torchrelay.runtime.exit_holder`, opt-in). Each size runs torchrelay jobs of
``bench.config``'s small scenario (3 SIGKILLs each) whose workers hold that many GiB besides
their state (``bench.stall --resident-gib``), in each of the :data:`SETTINGS` in turn,
``--pairs`` times; prints one row per size and setting (ledger phases as ``bench.stall``
prints them) and plots stall and detection against the size (``--out``,
docs/img/stall_sweep.png), with the figures in ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless
import matplotlib.pyplot as plt

from bench import metrics
from bench.config import PRESETS
from bench.plot import save_figure
from bench.procs import environment
from bench.runner import run_job
from bench.stall import PHASES
from bench.systems import TorchrelaySpare
from bench.workload import RESIDENT_GIB
from torchrelay.heap import HUGEPAGES_SWITCH as HUGEPAGES
from torchrelay.runtime.exit_holder import SWITCH as HOLDER

# Each setting's environment, and its color in the plot.
SETTINGS = {
    "huge pages (the default)": {HUGEPAGES: "1", HOLDER: "0"},
    "huge pages and the exit holder": {HUGEPAGES: "1", HOLDER: "1"},
    "4 KiB pages (TORCHRELAY_HUGEPAGES=0)": {HUGEPAGES: "0", HOLDER: "0"},
}
COLORS = dict(zip(SETTINGS, ("tab:green", "tab:blue", "tab:red"), strict=True))


def _median_ms(values: list[float]) -> float:
    return 1e3 * metrics.spread(values).median


def measure(sizes: list[float], pairs: int) -> list[dict]:
    config = PRESETS["default"]
    scenario = next(s for s in config.scenarios if s.model == "small")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-stall-sweep-") as tmp:
        for gib in sizes:
            os.environ[RESIDENT_GIB] = str(gib)
            runs: dict[str, list] = {name: [] for name in SETTINGS}
            for pair in range(pairs):
                for index, (name, settings) in enumerate(SETTINGS.items()):
                    workdir = Path(tmp) / f"{gib}-{index}-{pair}"
                    with environment(settings):
                        job = run_job(TorchrelaySpare(), scenario, config, pair, True, workdir)
                    if job.error:
                        raise SystemExit(f"{gib} GiB, {name}: {job.error}")
                    runs[name].append(job)
            for name, jobs in runs.items():
                phases = [p for j in jobs for p in j.phases]
                row = {"gib": gib, "setting": name, "n": len(phases)}
                for phase in PHASES:
                    row[phase] = [getattr(p, phase) for p in phases]
                row["stall"] = [i.stall_s for j in jobs for i in j.impacts]
                rows.append(row)
                print(json.dumps({k: row[k] for k in ("gib", "setting", "stall")}), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    head = "| GiB | setting | " + " | ".join(f"{p} ms" for p in PHASES) + " | stall ms | n |"
    lines = [head, "|" + "---|" * (len(PHASES) + 4)]
    for row in rows:
        cells = [f"{_median_ms(row[p]):.1f}" for p in (*PHASES, "stall")]
        lines.append(f"| {row['gib']:g} | {row['setting']} | {' | '.join(cells)} | {row['n']} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.4))
    for name in SETTINGS:
        mine = [r for r in rows if r["setting"] == name]
        sizes = [r["gib"] for r in mine]
        for key, style, what in (("stall", "o-", "stall"), ("detect", "s--", "detection")):
            medians = [_median_ms(r[key]) for r in mine]
            ax.plot(sizes, medians, style, color=COLORS[name], label=f"{what}, {name}")
    ax.set_xlabel("host memory each worker holds besides its 15 MB of state (GiB)")
    ax.set_ylabel("ms per SIGKILL (median)")
    ax.set_title("Recovery stall against a killed worker's memory (small model, 2 cores)")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="0,1,2,4", help="GiB, comma-separated")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("docs/img/stall_sweep.png"))
    parser.add_argument("--json", type=Path, default=Path("docs/img/stall_sweep.json"))
    args = parser.parse_args()
    rows = measure([float(s) for s in args.sizes.split(",")], args.pairs)
    args.json.write_text(json.dumps(rows, indent=1) + "\n")
    plot(rows, args.out)
    print(table(rows))


if __name__ == "__main__":
    main()
