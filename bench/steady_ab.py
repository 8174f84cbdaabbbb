"""``python -m bench.steady_ab``: what torchrelay adds to a training step, A/B in-process.

Two jobs minutes apart differ by whatever else the machine ran meanwhile (``bench.steady_check``
saw ±6 % between idle pairs and ±40 % under load), so a 2 % cost cannot be read from them. This
benchmark runs both paths in the same two processes, interleaved in short blocks:

- **A, plain DDP**: a DDP model over a plain gloo group, as under torchrun;
- **B, torchrelay's step**: an identical model and optimizer, DDP over the relay's
  :class:`~torchrelay.runtime.facade.StableProcessGroup` bound to a second gloo group made as
  a job makes it (collectives in place, on a group whose connections can be cut), the optimizer
  guarded (:func:`guard_optimizer`), and what ``relay.steps()`` does around each step: the
  guard's new step and the per-step seeding (:func:`~torchrelay.runtime.rng.seed_all`), the
  tracked state's snapshot;
- **C, the stable group alone**: B's very model, optimizer and group without that per-step
  work. B and C take turns on B's model from round to round, so C/A against B/A is what the
  per-step work costs, in the same processes and on the same memory.

``--control`` puts B's and C's model on plain DDP over a second gloo group: C/A is then the
method's own bias, which should read 1.00, and B/C the per-step work alone. ``--unguarded``
sends the stable group's collectives straight to the inner group (no guard), to measure what
the guard costs. B's guard completes collectives in C++ where the launcher has built it
(:mod:`torchrelay.runtime.native`), in Python with ``TORCHRELAY_NATIVE_GUARD=0``; the output
says which.

Each round runs ``--block`` steps of A, then of B or C (in even rounds B, in odd rounds C; A
goes first in half the rounds of each), on the same batches (``bench.workload``'s small model
unless ``--model``); per block, the wall time and the process's CPU time (every thread: gloo's
and the completion callbacks included) per step. The ratios to A are taken per round, a
fraction of a second apart, and summarised as median (with its 95 % bootstrap interval) and
quartiles. B - C is also taken per run, a run being a pair (B and C share its processes), and
summarised over the runs, whose spread a pooled interval leaves out. B's output also gives the
per-step work's own wall time, timed in place. ``--json`` saves a series and ``--pool``
summarizes saved series together (a tree's runs alternated with ``--control`` runs, say). Not
measured here (they are not per-step costs of the training thread): the heartbeat and control
threads, and the commit report, which go through ``bench.steady_check``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.metrics import median_difference
from bench.procs import ProcessSet, free_port, wait_exit, worker_env
from bench.workload import parse_model_name

WORLD = 2
VARIANTS = ("relay", "group")  # B and C
LABELS = {"relay": "B, torchrelay's step", "group": "C, the stable group alone"}


def _timed_block(step_fn: Any, steps: range) -> tuple[float, float, float]:
    """Wall seconds, process-CPU seconds and minor page faults per step over ``steps`` (the
    faults are a cost the machine's load does not change)."""
    wall, cpu = time.perf_counter(), time.process_time()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for step in steps:
        step_fn(step)
    n = len(steps)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return (time.perf_counter() - wall) / n, (time.process_time() - cpu) / n, faults / n


def _worker(
    rank: int,
    port: int,
    model_size: str,
    rounds: int,
    block: int,
    out: Path,
    unguarded: bool,
    control: bool,
) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from bench.workload import build_model, build_optimizer, loss_fn, make_batch
    from torchrelay.runtime.allocator import keep_freed_memory
    from torchrelay.runtime.ddp import fix_buckets
    from torchrelay.runtime.devices import new_group
    from torchrelay.runtime.facade import StableProcessGroup
    from torchrelay.runtime.fast_lane import stable_group
    from torchrelay.runtime.guard import StepGuard, guard_optimizer
    from torchrelay.runtime.rng import seed_all
    from torchrelay.runtime.tracked import TrackedState

    # As a torchrelay worker does at start (runtime.allocator), for A too: the ratio is then
    # the collective path's cost, not glibc's thresholds moving with what B happens to free.
    keep_freed_memory()
    timeout = datetime.timedelta(seconds=300)
    store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=rank == 0, timeout=timeout)
    # A's group as torchrun makes it (DDP needs a registered ProcessGroup, not a bare backend).
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("plain", store), rank=rank, world_size=WORLD
    )
    plain = dist.group.WORLD
    # B's communicator as the runtime makes it (a gloo group whose connections can be cut).
    inner = new_group(dist.PrefixStore("relay", store), rank, WORLD, timeout, torch.device("cpu"))

    class Unguarded(StableProcessGroup):
        """The stable group's Python dispatch with every collective sent straight to the
        inner group: no guard, no callback. B with it measures what the guard costs."""

        def _run(self, outputs: list[Any], launch: Any, *_: Any, **__: Any) -> Any:
            return launch(self.inner, outputs)

    guard = StepGuard()
    facade = Unguarded(WORLD, guard) if unguarded else stable_group(WORLD, guard)
    facade.bind(inner, rank, 0)

    model_a = DDP(build_model(model_size), process_group=plain)
    opt_a = build_optimizer(model_a)
    if control:
        second = dist.ProcessGroup(store, rank, WORLD)
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("control", store), rank, WORLD, timeout)
        second._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
        second._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        model_b = DDP(build_model(model_size), process_group=second)
    else:
        model_b = DDP(build_model(model_size), process_group=facade)
        fix_buckets(model_b, facade)
    opt_b = build_optimizer(model_b)
    guard_optimizer(opt_b, guard)
    tracked = TrackedState()
    tracked.add("model", model_b)
    tracked.add("optimizer", opt_b)

    def plain_step(step: int) -> None:
        loss_fn(model_a, make_batch(model_size, step, rank)).backward()
        opt_a.step()
        opt_a.zero_grad()

    per_step_work = [0.0]  # wall seconds of relay.steps()'s work, summed over B's steps

    def group_step(step: int) -> None:
        loss_fn(model_b, make_batch(model_size, step, rank)).backward()
        opt_b.step()
        opt_b.zero_grad()
        if guard.poisoned:
            raise RuntimeError(f"step {step} was poisoned: {guard.poison_reason}")

    def relay_step(step: int) -> None:
        began = time.perf_counter()
        tracked.snapshot()
        guard.begin_step()
        seed_all(0, step, rank)
        per_step_work[0] += time.perf_counter() - began
        group_step(step)

    figures: dict[str, list[list[float]]] = {"plain": [], "relay": [], "group": []}
    # In a step from here on, as in training: collectives of a script's set-up run on private
    # copies (see runtime.facade), and never in C++. C's steps begin no other.
    guard.begin_step()
    for warm in range(block):  # first calls, allocator, gloo connections
        plain_step(warm)
        relay_step(warm)
    for r in range(rounds):
        steps = range(block * (r + 1), block * (r + 2))
        b_or_c = ("relay", relay_step) if r % 2 == 0 else ("group", group_step)
        order = (("plain", plain_step), b_or_c)
        for name, fn in order if r % 4 < 2 else reversed(order):
            plain.barrier().wait()
            figures[name].append(list(_timed_block(fn, steps)))
    same = all(
        torch.equal(a, b) for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True)
    )
    if rank == 0:
        lane = getattr(facade, "lane", None)
        launched = 0 if lane is None else lane.launched
        facts = {"weights_equal": same, "native": guard.native, "fast_lane": launched}
        facts["per_step_work_s"] = per_step_work[0] / (block * (1 + (rounds + 1) // 2))
        out.write_text(json.dumps({**figures, **facts}))
    dist.destroy_process_group()


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return q1, q2, q3


def _run(
    model: str, rounds: int, block: int, unguarded: bool, control: bool, timeout_s: float
) -> dict[str, Any]:
    """One pair of processes; returns rank 0's raw figures."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp, ProcessSet() as procs:
        out = Path(tmp) / "ab.json"
        args = ["--port", str(port), "--model", model, "--rounds", str(rounds)]
        args += ["--block", str(block), "--out", str(out)]
        args += ["--unguarded"] if unguarded else []
        args += ["--control"] if control else []
        children = [
            procs.start(
                [sys.executable, "-m", "bench.steady_ab", "--rank", str(r), *args],
                Path(tmp) / f"ab{r}.log",
                env=worker_env(),
            )
            for r in range(WORLD)
        ]
        deadline = time.monotonic() + timeout_s
        for r, child in enumerate(children):
            if wait_exit(child, deadline) != 0:
                raise RuntimeError((Path(tmp) / f"ab{r}.log").read_text()[-3000:])
        return json.loads(out.read_text())


def measure(
    model: str,
    rounds: int,
    block: int,
    unguarded: bool = False,
    control: bool = False,
    repeats: int = 1,
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """``repeats`` runs of the two processes, one after the other: see :func:`summarize`."""
    raws = []
    for run in range(repeats):
        raws.append(_run(model, rounds, block, unguarded, control, timeout_s))
        print(f"run {run + 1} of {repeats} done", file=sys.stderr, flush=True)
    return summarize(raws)


def summarize(raws: list[dict[str, Any]]) -> dict[str, Any]:
    """Every run's raw figures and the ratios' summaries over all their rounds pooled (a run's
    median moves by 1-3 % between runs of the same code here, more than within one), with
    B - C also per run and over the runs."""
    result: dict[str, Any] = {"raw": raws}
    result["weights_equal"] = all(raw["weights_equal"] for raw in raws)
    result["guard"] = "compiled" if all(raw["native"] for raw in raws) else "python"
    result["fast_lane"] = [raw["fast_lane"] for raw in raws]
    result["per_step_work_us"] = [1e6 * raw["per_step_work_s"] for raw in raws]
    for index, name in ((0, "wall"), (1, "cpu")):
        plain = [a[index] for raw in raws for a in raw["plain"]]
        result[name] = {"plain_ms": 1e3 * statistics.median(plain)}
        per_run = {v: [_ratios(raw, v, index) for raw in raws] for v in VARIANTS}
        pooled = {v: [x for run in runs for x in run] for v, runs in per_run.items()}
        medians = {v: [statistics.median(run) for run in runs] for v, runs in per_run.items()}
        for variant, ratios in pooled.items():
            excess = median_difference(ratios, [1.0])
            over_runs = median_difference(medians[variant], [1.0])
            result[name][variant] = {
                "ratio_quartiles": _quartiles(ratios),
                "ratio_interval": (1 + excess.lo, 1 + excess.hi),
                "run_medians": medians[variant],
                "runs_interval": (1 + over_runs.lo, 1 + over_runs.hi),
            }
        result[name]["per_step_work"] = asdict(median_difference(*pooled.values()))
        # Each run's B - C: the two take turns in the same processes, so a run is a pair, and
        # the runs' spread (the processes' placement, what else ran) is in the interval.
        paired = [b - c for b, c in zip(medians["relay"], medians["group"], strict=True)]
        result[name]["per_step_work_runs"] = paired
        result[name]["per_step_work_over_runs"] = asdict(median_difference(paired, [0.0]))
    result["faults_per_step"] = {
        name: statistics.median(block[2] for raw in raws for block in raw[name])
        for name in ("plain", *VARIANTS)
    }
    return result


def _saved_runs(parser: argparse.ArgumentParser, paths: list[Path]) -> list[dict[str, Any]]:
    """The runs saved with ``--json`` in ``paths``; a usage error if one cannot be read."""
    raws = []
    for path in paths:
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"--pool: cannot read {path}: {exc}")
        runs = saved.get("raw") if isinstance(saved, dict) else None
        if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
            parser.error(f"--pool: {path} holds no runs under 'raw': not saved with --json")
        raws += runs
    return raws


def _ratios(raw: dict[str, Any], variant: str, index: int) -> list[float]:
    """The variant's figure over A's in each round the variant ran."""
    plain = raw["plain"][0 if variant == "relay" else 1 :: 2]
    return [b[index] / a[index] for a, b in zip(plain, raw[variant], strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=parse_model_name, default="small")
    parser.add_argument("--rounds", type=int, default=80, help="rounds (B in half, C in half)")
    parser.add_argument("--block", type=int, default=10, help="steps per block")
    parser.add_argument(
        "--unguarded",
        action="store_true",
        help="the stable group sends every collective straight to its inner group (no step "
        "guard, no completion callback): what the guard costs, not a way to train",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="B's and C's model on plain DDP over a second gloo group: the method's own bias",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs, one after the other, their rounds pooled"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSON",
        help="run nothing: summarize the runs saved with --json in these files, pooled (runs "
        "of one tree interleaved with --control runs, say)",
    )
    a = parser.parse_args()
    if a.rank is not None:
        _worker(a.rank, a.port, a.model, a.rounds, a.block, a.out, a.unguarded, a.control)
        return
    if a.pool:
        r = summarize(_saved_runs(parser, a.pool))
        print(f"{len(r['raw'])} saved run(s) from {len(a.pool)} file(s), the rounds pooled:")
    else:
        r = measure(a.model, a.rounds, a.block, a.unguarded, a.control, a.repeats)
        print(f"{a.repeats} run(s) of {a.rounds} rounds of {a.block} steps, the rounds pooled:")
    for name in ("wall", "cpu"):
        print(f"{name} per step: plain DDP (A) {r[name]['plain_ms']:.2f} ms")
        for variant in VARIANTS:
            q1, q2, q3 = r[name][variant]["ratio_quartiles"]
            lo, hi = r[name][variant]["ratio_interval"]
            medians = r[name][variant]["run_medians"]
            run_lo, run_hi = r[name][variant]["runs_interval"]
            print(
                f"  {LABELS[variant]} / A: median {q2:.3f} (95 % interval {lo:.3f}-{hi:.3f}; "
                f"quartiles {q1:.3f}-{q3:.3f}); run medians "
                + ", ".join(f"{m:.3f}" for m in medians)
                + f", their median {statistics.median(medians):.3f} ({run_lo:.3f}-{run_hi:.3f})"
            )
        work, runs = r[name]["per_step_work"], r[name]["per_step_work_over_runs"]
        print(
            f"  B - C, the per-step work: {work['median']:+.3f} "
            f"(95 % interval {work['lo']:+.3f} to {work['hi']:+.3f}); per run "
            + ", ".join(f"{x:+.3f}" for x in r[name]["per_step_work_runs"])
            + f", their median {runs['median']:+.3f} ({runs['lo']:+.3f} to {runs['hi']:+.3f})"
        )
    work_us = ", ".join(f"{us:.0f}" for us in r["per_step_work_us"])
    print(f"the per-step work timed inside B's steps, µs a step: {work_us}")
    lane = ", ".join(str(n) for n in r["fast_lane"])
    print(f"B's step guard: {r['guard']}; collectives in the compiled fast lane: {lane}")
    faults = r["faults_per_step"]
    print("minor page faults per step: " + ", ".join(f"{k} {v:.0f}" for k, v in faults.items()))
    print(f"final weights bitwise equal: {r['weights_equal']}")
    if a.json:
        a.json.write_text(json.dumps(r))


if __name__ == "__main__":
    main()
