"""``python -m bench.handover``: a planned handover's stall against the crash path's, same job.

Runs the same 3-rank job (tests/scripts/mlp_train.py, steps of ``--compute-seconds``, one hot
spare) ``--repeats`` times per mode, every rank held on a leash at step ``--at`` until the
fault is in: ``drain`` (``torchrelay drain --rank 1``: a planned handover) and ``kill``
(``torchrelay chaos kill --rank 1``, sent once the job runs free again: SIGKILL mid-step, the
crash path). From each job's ledger:

- drain: ``handover_done.stall_seconds`` (every rank halted right after committing the
  boundary -> the first commit after: one step's compute included), steps recomputed;
- kill: the largest ``survivor_gap_seconds`` of ``recovery_done`` (a survivor's last commit
  before the failure -> its first after: detection, the dropped step and its redoing
  included), steps recomputed.

Both are the time training made no progress because of the move. Prints a markdown section.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from tests.jobs import await_event, await_status, cli, ledger_events, move_leash, start_job

MODES = ("drain", "kill")


def one_job(where: Path, mode: str, steps: int, at: int, compute: float) -> dict[str, float]:
    run_dir, leash = where / "run", where / "leash"
    move_leash(leash, at)
    pace = ("--leash", str(leash), "--compute-seconds", str(compute))
    proc = start_job(run_dir, nproc=3, spares=1, steps=steps, script_args=pace)
    await_status(run_dir, lambda s: s["steps_committed"] >= at and len(s["spares"]) == 1)
    if mode == "drain":
        done = cli("drain", "--run-dir", str(run_dir), "--rank", "1")
        await_event(run_dir, "handover_start")  # its boundary lies past the leash
        move_leash(leash, steps)
    else:
        # Running free when the kill lands (mid-step, as a crash does): a survivor's gap is
        # then the stall a crash costs, not the time the leash held it.
        move_leash(leash, steps)
        done = cli("chaos", "--run-dir", str(run_dir), "kill", "--rank", "1")
    assert done.returncode == 0, done.stderr
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    events = ledger_events(run_dir)
    if mode == "drain":
        (moved,) = [e for e in events if e["event"] == "handover_done"]
        return {"stall": moved["stall_seconds"], "recomputed": moved["recomputed_steps"]}
    (cured,) = [e for e in events if e["event"] == "recovery_done"]
    gap = max(cured["survivor_gap_seconds"].values())
    return {"stall": gap, "recomputed": cured["recomputed_steps"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--at", type=int, default=20, help="the step the fault comes at")
    parser.add_argument("--compute-seconds", type=float, default=0.05)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for mode in MODES:
                where = Path(tmp) / f"{mode}{repeat}"
                where.mkdir()
                one = one_job(where, mode, args.steps, args.at, args.compute_seconds)
                results[mode].append(one)
                print(f"{mode} #{repeat}: {one}", file=sys.stderr, flush=True)
    print("| move | stall p50 (s) | stall max (s) | steps recomputed |")
    print("|---|---|---|---|")
    for mode, label in zip(
        MODES, ("planned handover (drain)", "crash path (SIGKILL)"), strict=True
    ):
        stalls = [r["stall"] for r in results[mode]]
        recomputed = sorted({int(r["recomputed"]) for r in results[mode]})
        print(
            f"| {label} | {statistics.median(stalls):.3f} | {max(stalls):.3f} | "
            f"{', '.join(map(str, recomputed))} |"
        )
    ratio = statistics.median(r["stall"] for r in results["drain"]) / statistics.median(
        r["stall"] for r in results["kill"]
    )
    print(f"\nhandover stall / crash stall (medians, same run): {ratio:.2f}")


if __name__ == "__main__":
    main()
