"""``python -m bench.pool``: a borrowed replacement's stall against a hot spare's, and the
lender's throughput while it is shrunk (issue 13, item 5).

Both runs use tests/scripts/mlp_train.py, 2-rank jobs, steps of ``--compute-seconds``:

- ``spare``: job H alone with one hot spare (``--spares 1``); rank 1 is SIGKILLed
  (``torchrelay chaos kill``) once H runs free past step ``--at``;
- ``borrow``: a ``torchrelay pool`` of 4 slots, job L (priority 0, ``--elastic``, 2 ranks)
  and job H (priority 10, ``--spares 0``); the same kill. H's replacement is the slot L
  releases at its next step boundary; when H ends, L grows back onto it.

H's stall is the largest ``survivor_gap_seconds`` of its ``recovery_done`` (a survivor's last
commit before the kill -> its first after: detection, the wait for a slot, the spare's start
and the state transfer included). L's throughput is sampled from its controller's status
(steps committed, processes) every ``--sample`` seconds: steps per second while it runs 2
processes and while it runs 1 (hosting the lent rank). Prints a markdown section.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

from tests.jobs import await_status, cli, ledger_events, start_job
from tests.pool_jobs import start_pool
from torchrelay.cli.operator import job_status


def _stall(run_dir: Path) -> float:
    (cured,) = [e for e in ledger_events(run_dir) if e["event"] == "recovery_done"]
    return max(cured["survivor_gap_seconds"].values())


def _kill_when_free(run_dir: Path, at: int) -> None:
    await_status(run_dir, lambda s: s["steps_committed"] >= at, timeout=300)
    done = cli("chaos", "--run-dir", str(run_dir), "kill", "--rank", "1")
    assert done.returncode == 0, done.stderr


def spare(where: Path, steps: int, at: int, pace: tuple[str, ...]) -> float:
    run_dir = where / "H"
    proc = start_job(run_dir, nproc=2, spares=1, steps=steps, script_args=pace)
    await_status(run_dir, lambda s: len(s["spares"]) == 1, timeout=300)
    _kill_when_free(run_dir, at)
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output
    return _stall(run_dir)


def borrow(
    where: Path, steps: int, at: int, pace: tuple[str, ...], sample: float
) -> dict[str, float]:
    pool = start_pool(where)
    try:
        attach = pool.attach()
        low = start_job(
            where / "L",
            nproc=2,
            spares=0,
            steps=steps * 2,
            launcher_args=(*attach, "--priority", "0", "--job-name", "L", "--elastic"),
            script_args=pace,
        )
        await_status(where / "L", lambda s: s["steps_committed"] >= at, timeout=300)
        high = start_job(
            where / "H",
            nproc=2,
            spares=0,
            steps=steps,
            launcher_args=(*attach, "--priority", "10", "--job-name", "H"),
            script_args=pace,
        )
        _kill_when_free(where / "H", at)
        samples = []
        while low.poll() is None:
            try:
                status = job_status(where / "L")
                samples.append((time.time(), status["steps_committed"], len(status["slots"])))
            except (SystemExit, Exception):  # the job ended between two samples
                pass
            time.sleep(sample)
        assert low.returncode == 0 and high.wait(timeout=60) == 0
    finally:
        pool.stop()
    rates: dict[int, list[float]] = {1: [0.0, 0.0], 2: [0.0, 0.0]}
    for (t0, s0, p0), (t1, s1, p1) in itertools.pairwise(samples):
        if p0 == p1 and p0 in rates:  # an interval with no resize in it
            rates[p0][0] += s1 - s0
            rates[p0][1] += t1 - t0
    (release,) = [
        e for e in ledger_events(where / "L") if e["event"] == "handover_done" and e["retired"]
    ]
    high_events = {e["event"]: e["t"] for e in ledger_events(where / "H") if "t" in e}
    return {
        "stall": _stall(where / "H"),
        "to_grant": high_events["pool_granted"] - high_events["failure"],
        "spare_start": high_events["spare_ready"] - high_events["pool_granted"],
        "full_rate": rates[2][0] / max(rates[2][1], 1e-9),
        "shrunk_rate": rates[1][0] / max(rates[1][1], 1e-9),
        "shrunk_seconds": rates[1][1],
        "release_stall": release["stall_seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="H's; L runs twice as many")
    parser.add_argument("--at", type=int, default=20)
    parser.add_argument("--compute-seconds", type=float, default=0.05)
    parser.add_argument("--sample", type=float, default=0.5)
    args = parser.parse_args()
    pace = ("--compute-seconds", str(args.compute_seconds))
    with tempfile.TemporaryDirectory() as tmp:
        hot = spare(Path(tmp) / "spare", args.steps, args.at, pace)
        print(f"hot spare: H's stall {hot:.2f} s", flush=True)
        lent = borrow(Path(tmp) / "borrow", args.steps, args.at, pace, args.sample)
    ratio = lent["shrunk_rate"] / lent["full_rate"]
    print("| H's stall, hot spare | H's stall, borrowed | ratio | L full | L shrunk | ratio |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {hot:.2f} s | {lent['stall']:.2f} s | {lent['stall'] / hot:.2f} | "
        f"{lent['full_rate']:.1f} steps/s | {lent['shrunk_rate']:.1f} steps/s "
        f"({lent['shrunk_seconds']:.0f} s) | {ratio:.2f} |"
    )
    print(
        f"\nH, borrowed: failure -> pool_granted {lent['to_grant']:.2f} s (L's release at its "
        f"boundary, its process's exit); pool_granted -> spare_ready {lent['spare_start']:.2f} s "
        f"(the spare's start, a fork of the job's template). L's release stall "
        f"(handover_done): {lent['release_stall']:.2f} s"
    )


if __name__ == "__main__":
    main()
