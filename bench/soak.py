"""Soak efficiency: one job, many mixed failures, compared with the same job without failures.

``python -m bench.soak`` runs tests/scripts/mlp_train.py paced to a realistic step time (every
rank computes ``--pace`` seconds longer per step, replacements included), once without
failures and once with a seeded mix of failures (SIGKILL in forward/backward, SIGSTOP hangs,
stalled training threads, collectives that never return, deaths during a recovery). Training
efficiency = useful step time / wall time, where useful step time is the failure-free run's
training time for the same steps (both timed from the moment the last worker joined to the
end of the job). From the per-failure cost it also
extrapolates the efficiency at one failure every 60 s (torchft's published soak setting).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from torchrelay.chaos import random_schedule
from torchrelay.ledger import read_ledger

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "scripts" / "mlp_train.py"


def run(run_dir: Path, steps: int, pace: float, chaos: list[str]) -> float:
    """Run one job; returns its training seconds (first step committed to job end)."""
    command = [
        sys.executable,
        "-m",
        "torchrelay.cli.main",
        "run",
        "--nproc-per-node",
        "3",
        "--spares",
        "3",
        "--hang-floor",
        "2",
        "--quiet",
        "--run-dir",
        str(run_dir),
        *(f"--chaos={c}" for c in chaos),
        str(SCRIPT),
        "--steps",
        str(steps),
        "--compute-seconds",
        str(pace),
        "--out",
        str(run_dir / "final.pt"),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=1800)
    events = read_ledger(run_dir / "ledger.jsonl")
    start = [e["t"] for e in events if e["event"] == "process_join" and e["role"] == "worker"][-1]
    end = next(e["t"] for e in events if e["event"] == "job_end")
    return end - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--failures", type=int, default=30)
    parser.add_argument("--pace", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    mix = {"hangs": 3, "during_recovery": 3, "stalls": 2, "drops": 2}
    chaos = random_schedule(args.seed, args.failures, 3, 5, args.steps - 5, **mix)
    with tempfile.TemporaryDirectory() as tmp:
        clean = run(Path(tmp) / "clean", args.steps, args.pace, [])
        soak = run(Path(tmp) / "soak", args.steps, args.pace, chaos)
        events = read_ledger(Path(tmp) / "soak" / "ledger.jsonl")
    failures = sum(1 for e in events if e["event"] == "failure")
    recoveries = [e for e in events if e["event"] == "recovery_done"]
    lost = sum(e["lost_steps"] for e in recoveries)
    stalls = sum(e["stall_seconds"] for e in recoveries)
    per_failure = (soak - clean) / failures
    result = {
        "steps": args.steps,
        "failures": failures,
        "lost_steps": lost,
        "clean_seconds": round(clean, 2),
        "soak_seconds": round(soak, 2),
        "efficiency": round(clean / soak, 4),
        "failures_per_minute": round(60 * failures / soak, 2),
        "seconds_lost_per_failure": round(per_failure, 3),
        "hangs_detected": sum(1 for e in events if e["event"] == "hang_detected"),
        "recoveries": len(recoveries),
        "stall_seconds_total": round(stalls, 2),
        "efficiency_from_stalls": round(1 - stalls / soak, 4),
        "efficiency_at_one_failure_per_60s": round(1 - per_failure / 60, 4),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
