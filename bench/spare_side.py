"""``python -m bench.spare_side``: the spare side of a recovery (issue 15), in one run.

torchrelay jobs of the shared workload (``bench/workload.py``, 2 workers, 1 spare) run with and
without the node's template (``--no-template``: workers and spares start as fresh interpreters),
each failure-free and with 3 SIGKILLs, alternated in ``--pairs`` rounds so that both variants
see the same load. Per variant:

- **first step / median step**: for each recovery, the ledger's ``transfer_done ->
  first_step`` over the median gap between consecutive commits before the kill (rank 0's
  progress log), i.e. how much slower the first step after a recovery is than any other;
  **step ms** is that median gap itself;
- **refill CPU s**: the CPU seconds a refill spare (one started after the job's first failure)
  used until it reported ready (``spare_ready.cpu_seconds``, its own since fork or exec), plus,
  for a forked one, the template's CPU for the fork (``template.log``);
- **detect ms**: each kill -> the ledger's ``detected`` (the kernel's teardown of the killed
  process is most of it: ``bench.exit_floor``);
- **start s** and **job CPU s**, failure-free: the launcher's ``job_start`` -> rank 0's first
  commit, and the CPU seconds of the whole job (launcher, template, workers, spare: the bench's
  ``RUSAGE_CHILDREN``, which counts every descendant reaped below it);
- **end-to-end ratio**: launch-to-exit time with 3 kills over the failure-free job's, within
  the same round; and the same ratio of the **training span** (first to last commit), which
  leaves out the start-up (seconds of ``import torch`` that a loaded machine stretches at
  random, the same in both jobs).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import metrics
from bench.runner import kills_in, ledger_events, template_log
from bench.systems import RunSpec, TorchrelaySpare

VARIANTS = {"template": (), "no template": ("--no-template",)}


@dataclass
class VariantFigures:
    """What one variant measured, over all its rounds."""

    first_step_ratios: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    refill_cpu_s: list[float] = field(default_factory=list)
    end_to_end_ratios: list[float] = field(default_factory=list)
    span_ratios: list[float] = field(default_factory=list)
    detect_ms: list[float] = field(default_factory=list)
    start_s: list[float] = field(default_factory=list)
    job_cpu_s: list[float] = field(default_factory=list)
    forked_refills: int = 0


def first_step_ratios(
    events: Sequence[Mapping[str, Any]],
    commits: Sequence[metrics.Commit],
    kills: Sequence[metrics.Kill],
) -> list[float]:
    """``transfer_done -> first_step`` of each recovery over the median step before its kill."""
    done = [e for e in events if e.get("event") == "recovery_done"]
    ratios = []
    for event, kill in zip(done, kills, strict=False):
        timeline = event["timeline"]
        first = timeline["first_step"] - timeline["transfer_done"]
        ratios.append(first / metrics.normal_interval(commits, kill.t))
    return ratios


def detect_ms(events: Sequence[Mapping[str, Any]], kills: Sequence[metrics.Kill]) -> list[float]:
    """Each kill -> its recovery's ``detected``, in ms."""
    done = [e for e in events if e.get("event") == "recovery_done"]
    return [
        (e["timeline"]["detected"] - kill.t) * 1e3 for e, kill in zip(done, kills, strict=False)
    ]


def start_s(events: Sequence[Mapping[str, Any]], commits: Sequence[metrics.Commit]) -> float:
    """The launcher's ``job_start`` -> the first commit, in seconds."""
    return commits[0].t - next(e["t"] for e in events if e.get("event") == "job_start")


def span(commits: Sequence[metrics.Commit]) -> float:
    """Seconds from the first commit to the last."""
    return commits[-1].t - commits[0].t


def _run(variant: str, workdir: Path, args: argparse.Namespace, kills: tuple[int, ...]) -> dict:
    workdir.mkdir(parents=True)
    spec = RunSpec(args.model, args.steps, 2, kills, 1, workdir, timeout_s=300.0)
    before = _children_cpu()
    out = TorchrelaySpare(VARIANTS[variant]).run(spec)
    cpu_s = _children_cpu() - before
    if out.returncode != 0:
        raise RuntimeError(f"{variant}: exit code {out.returncode}; logs in {workdir}")
    return {
        "wall_s": out.wall_s,
        "cpu_s": cpu_s,
        "events": ledger_events(out.ledger),
        "commits": metrics.parse_progress(spec.progress_file.read_text()),
        "kills": kills_in(workdir),
        "template_log": template_log(out.ledger),
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(args: argparse.Namespace, root: Path) -> dict[str, VariantFigures]:
    """Runs ``args.pairs`` rounds of every variant (failure-free, then 3 kills)."""
    figures = {variant: VariantFigures() for variant in VARIANTS}
    for round_ in range(args.pairs):
        for variant, found in figures.items():
            tag = variant.replace(" ", "_")
            free = _run(variant, root / f"{tag}{round_}-free", args, ())
            killed = _run(variant, root / f"{tag}{round_}-kills", args, tuple(args.kills))
            found.end_to_end_ratios.append(killed["wall_s"] / free["wall_s"])
            found.span_ratios.append(span(killed["commits"]) / span(free["commits"]))
            found.step_ms += [
                metrics.normal_interval(killed["commits"], kill.t) * 1e3 for kill in killed["kills"]
            ]
            found.first_step_ratios += first_step_ratios(
                killed["events"], killed["commits"], killed["kills"]
            )
            found.detect_ms += detect_ms(killed["events"], killed["kills"])
            found.start_s.append(start_s(free["events"], free["commits"]))
            found.job_cpu_s.append(free["cpu_s"])
            refills = metrics.refill_cpu(killed["events"], killed["template_log"])
            found.refill_cpu_s += [cpu for cpu, _ in refills]
            found.forked_refills += sum(forked for _, forked in refills)
            print(f"round {round_} {variant}: {json.dumps(summary(found))}", flush=True)
    return figures


def _cell(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    median = statistics.median(values)
    return f"{median:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def summary(found: VariantFigures) -> dict[str, str | int]:
    return {
        "first step / median step": _cell(found.first_step_ratios, 2),
        "step ms": _cell(found.step_ms, 1),
        "refill CPU s": _cell(found.refill_cpu_s, 3),
        "detect ms": _cell(found.detect_ms, 1),
        "start s": _cell(found.start_s, 2),
        "job CPU s, no failure": _cell(found.job_cpu_s, 1),
        "end-to-end ratio, 3 kills": _cell(found.end_to_end_ratios, 3),
        "training span ratio, 3 kills": _cell(found.span_ratios, 3),
        "refills (forked)": f"{len(found.refill_cpu_s)} ({found.forked_refills})",
    }


def render(figures: Mapping[str, VariantFigures]) -> str:
    """A markdown table: median (min-max) per variant."""
    heads = list(summary(next(iter(figures.values()))))
    lines = ["| variant | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for variant, found in figures.items():
        lines.append(f"| {variant} | " + " | ".join(map(str, summary(found).values())) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=540)
    parser.add_argument("--kills", type=int, nargs=3, default=[125, 275, 425])
    parser.add_argument("--model", default="small")
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-spare-") as tmp:
        figures = measure(args, Path(tmp))
    if args.json is not None:
        args.json.write_text(json.dumps({k: asdict(v) for k, v in figures.items()}, indent=1))
    print(render(figures))


if __name__ == "__main__":
    main()
