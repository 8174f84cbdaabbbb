"""Figures for ``python -m bench.control``: a process's CPU and memory, latency summaries, and
the table it prints (and docs/benchmarks.md shows)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.control_plane import percentile
from bench.procs import resident_mib

TICK = os.sysconf("SC_CLK_TCK")


def usage(pid: int) -> tuple[float, float]:
    """CPU seconds and RSS (MiB) of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK
    return cpu, resident_mib(pid)


def summary(values: list[float]) -> dict[str, float] | None:
    """p50/p99/max in milliseconds (None for no values)."""
    if not values:
        return None
    ms = [1000 * v for v in values]
    return {"p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99), "max": max(ms)}


def _ms(figures: dict[str, float] | None, key: str) -> str:
    return "-" if figures is None else f"{figures[key]:,.0f}"


def table(results: list[dict[str, Any]]) -> str:
    """The sweep as a markdown table (one row per scale)."""
    lines = [
        "| ranks (nodes) | setup | heartbeats/s offered / handled | heartbeat p50 / p99 | "
        "controller cores (steady), CPU per heartbeat | RSS (per rank) | failures | "
        "report -> plan p50 / p99 | controller failure -> planned p50 | controller CPU per "
        "failure | load | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        hb, ctl, fl = r.get("heartbeats"), r.get("controller", {}), r.get("failures")
        lat = hb["rank_latency_ms"] if hb else None
        plan = fl["report_to_plan_ms"] if fl else None
        own = fl["controller_failure_to_planned_ms"] if fl else None
        lines.append(
            f"| {r['ranks']:,} ({r['nodes']:,}) | {r.get('setup_s', 0):.0f} s | "
            + (f"{hb['offered_per_s']:,.0f} / {hb['handled_per_s']:,.0f} | " if hb else "- | ")
            + f"{_ms(lat, 'p50')} / {_ms(lat, 'p99')} ms | "
            + (
                f"{ctl['steady_cores']:.2f}, {ctl['cpu_ms_per_heartbeat']:.2f} ms | "
                if "steady_cores" in ctl
                else "- | "
            )
            + (
                f"{ctl['rss_mib']:.0f} MiB ({ctl['rss_kib_per_rank']:.0f} KiB) | "
                if "rss_mib" in ctl
                else "- | "
            )
            + f"{fl['count'] if fl else 0} | {_ms(plan, 'p50')} / {_ms(plan, 'p99')} ms | "
            + f"{_ms(own, 'p50')} ms | "
            + (f"{fl['controller_cpu_s_per_failure']:.1f} s | " if fl and fl["count"] else "- | ")
            + " -> ".join(f"{v:.1f}" for v in r["loadavg_1min"])
            + f" | {r['status']} |"
        )
    return "\n".join(lines)
