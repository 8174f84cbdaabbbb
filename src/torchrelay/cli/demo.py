"""``torchrelay demo``: train the example GPT twice -- once with injected SIGKILLs, once
without -- and show that the final weights are bitwise identical, with the recovery timeline.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchrelay.chaos import parse_schedule
from torchrelay.config import JobConfig
from torchrelay.examples import GPT_SCRIPT
from torchrelay.report.summary import render_text, summarize

if TYPE_CHECKING:
    import torch
    from rich.table import Table


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="kill workers of a real training job and prove nothing was lost",
        description="Runs the example GPT (torchrelay/examples/train_gpt.py) on CPU with hot "
        "spares, SIGKILLs workers mid-step, runs the same job without failures, and compares "
        "the final weights.",
    )
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--spares", type=int, default=1)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument(
        "--chaos",
        action="append",
        default=None,
        metavar="SPEC",
        help="faults to inject (default: rank 2 mid-all-reduce at 40%% of the run, "
        "rank 0 in its forward pass at 70%%)",
    )
    p.add_argument("--run-dir", type=Path, default=None)
    p.add_argument("--script", type=Path, default=GPT_SCRIPT, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def _job(args: argparse.Namespace, run_dir: Path, chaos: list[str], stream: bool) -> JobConfig:
    return JobConfig(
        script=str(args.script),
        script_args=[
            "--steps",
            str(args.steps),
            "--out",
            str(run_dir / "final.pt"),
            "--log-every",
            str(max(1, args.steps // 6)),
        ],
        nproc_per_node=args.workers,
        spares=args.spares,
        run_dir=run_dir,
        chaos=parse_schedule(chaos, args.workers),
        console_ranks=None if stream else frozenset(),
        spare_timeout=120.0,
    )


def run(args: argparse.Namespace) -> int:
    # torch and rich load here, not when the parser is built (`torchrelay --help`).
    import torch
    from rich.console import Console

    from torchrelay.agent.launcher import launch
    from torchrelay.agent.native_build import ensure_native

    console = Console()
    if not args.script.is_file():
        raise SystemExit(f"torchrelay demo: example script not found at {args.script}")
    ensure_native()
    chaos = args.chaos or [
        f"kill:rank={min(2, args.workers - 1)}:step={int(args.steps * 0.4)}:phase=backward",
        f"kill:rank=0:step={int(args.steps * 0.7)}",
    ]
    root = args.run_dir or Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    console.rule(f"[bold]1/2  training with failures injected: {', '.join(chaos)}")
    failing = launch(_job(args, root / "with-failures", chaos, stream=True))
    console.rule("[bold]2/2  the same job without failures (reference)")
    with console.status("training the reference run ..."):
        reference = launch(_job(args, root / "reference", [], stream=False))
    for name, outcome in (("with failures", failing), ("reference", reference)):
        if outcome["status"] != "succeeded":
            console.print(f"[red]the {name} run failed: {outcome.get('reason')}")
            return 1

    console.rule("[bold]result")
    console.print(render_text(summarize(root / "with-failures")))
    ours = torch.load(root / "with-failures" / "final.pt", weights_only=True)
    ref = torch.load(root / "reference" / "final.pt", weights_only=True)
    identical, table = _compare(ours, ref)
    console.print(table)
    lines = verdict(summarize(root / "with-failures"), identical, len(ref))
    if lines is None:
        console.print("[bold red]the runs differ: this is a bug in torchrelay")
        return 1
    console.print(f"[bold green]{lines[0]}")
    for line in lines[1:]:
        console.print(line)
    console.print(f"run directories: {root}")
    return 0


def verdict(summary: dict[str, Any], identical: bool, tensors: int) -> list[str] | None:
    """The demo's closing lines when the run proves its point (every failure recovered, no
    committed step lost, the weights bitwise identical), else None.

    The workers killed are those the demo injected a fault into. A worker that failed as a
    consequence (a survivor whose collective the kill left stuck: README, Limits) was
    replaced too, and is named apart rather than counted as a kill."""
    failures = summary["failures"]
    lost = sum(f["lost_steps"] or 0 for f in failures)
    if not identical or summary["recovered"] != len(failures) or lost:
        return None
    others = [f for f in failures if not f["injected"]]
    lines = [
        f"{len(failures) - len(others)} worker(s) killed, 0 committed steps lost, final weights "
        f"bitwise identical to the failure-free run ({tensors} tensors)."
    ]
    if others:
        lines.append(
            f"{len(others)} more worker(s) failed after a kill and were replaced as well: "
            + "; ".join(f"rank {f['rank']}, {f['cause']} ({f['kind']})" for f in others)
        )
    return lines


def _compare(ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> tuple[bool, Table]:
    """Per-tensor bitwise comparison; the table lists the largest tensors and every mismatch."""
    import torch
    from rich.table import Table

    equal = {k: k in ours and torch.equal(ours[k], ref[k]) for k in ref}
    identical = ours.keys() == ref.keys() and all(equal.values())
    table = Table(
        title=f"final weights vs reference: {sum(equal.values())}/{len(ref)} tensors bitwise equal"
    )
    for column in ("tensor", "shape", "bitwise equal", "max |diff|"):
        table.add_column(column)
    largest = sorted(ref, key=lambda k: -ref[k].numel())[:5]
    for key in [k for k in ref if not equal[k] or k in largest]:
        diff = (ours[key] - ref[key]).abs().max().item() if key in ours else float("nan")
        table.add_row(
            key, str(tuple(ref[key].shape)), "yes" if equal[key] else "[red]NO", f"{diff:.3g}"
        )
    return identical, table
