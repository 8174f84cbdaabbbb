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
  tracked state's snapshot. ``--control`` makes B plain DDP too, over a second gloo group:
  the method's own bias, which should read 1.00. ``--facade-only`` leaves out the per-step
  work; ``--unguarded``
  also the stable group's guard (its collectives go straight to the inner group), to measure
  what the guard costs. B's guard completes collectives in C++ where the launcher has built
  it (:mod:`torchrelay.runtime.native`), in Python with ``TORCHRELAY_NATIVE_GUARD=0``;
  the output says which.

Each round runs ``--block`` steps of A, then of B (their order alternates between rounds), on the
same batches (``bench.workload``'s small model unless ``--model``); per block, the wall time and
the process's CPU time (every thread: gloo's and the completion callbacks included) per step.
The ratios B/A are taken per round, a fraction of a second apart, and summarised as median and
quartiles. Not measured here (they are not per-step costs of the training thread): the
heartbeat and control threads, and the commit report, which go through ``bench.steady_check``.
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
from pathlib import Path
from typing import Any

from bench.procs import ProcessSet, free_port, wait_exit, worker_env

WORLD = 2


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
    facade_only: bool,
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

    def relay_step(step: int) -> None:
        if not facade_only:
            tracked.snapshot()
            guard.begin_step()
            seed_all(0, step, rank)
        loss_fn(model_b, make_batch(model_size, step, rank)).backward()
        opt_b.step()
        opt_b.zero_grad()
        if guard.poisoned:
            raise RuntimeError(f"step {step} was poisoned: {guard.poison_reason}")

    figures: dict[str, list[list[float]]] = {"plain": [], "relay": []}
    # In a step from here on, as in training (--facade-only begins no other): collectives of
    # a script's set-up run on private copies (see runtime.facade), and never in C++.
    guard.begin_step()
    for warm in range(block):  # first calls, allocator, gloo connections
        plain_step(warm)
        relay_step(warm)
    for r in range(rounds):
        steps = range(block * (r + 1), block * (r + 2))
        order = (("plain", plain_step), ("relay", relay_step))
        for name, fn in order if r % 2 == 0 else reversed(order):
            plain.barrier().wait()
            figures[name].append(list(_timed_block(fn, steps)))
    same = all(
        torch.equal(a, b) for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True)
    )
    if rank == 0:
        lane = getattr(facade, "lane", None)
        launched = 0 if lane is None else lane.launched
        facts = {"weights_equal": same, "native": guard.native, "fast_lane": launched}
        out.write_text(json.dumps({**figures, **facts}))
    dist.destroy_process_group()


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return q1, q2, q3


def measure(
    model: str,
    rounds: int,
    block: int,
    facade_only: bool = False,
    unguarded: bool = False,
    control: bool = False,
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """Runs the two processes; returns per-round figures and the B/A ratios' quartiles."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp, ProcessSet() as procs:
        out = Path(tmp) / "ab.json"
        args = ["--port", str(port), "--model", model, "--rounds", str(rounds)]
        args += ["--block", str(block), "--out", str(out)]
        args += ["--facade-only"] if facade_only else []
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
        raw = json.loads(out.read_text())
    result: dict[str, Any] = {"raw": raw, "weights_equal": raw["weights_equal"]}
    result["guard"] = "compiled" if raw["native"] else "python"
    result["fast_lane"] = raw["fast_lane"]
    for index, name in ((0, "wall"), (1, "cpu")):
        ratios = [b[index] / a[index] for a, b in zip(raw["plain"], raw["relay"], strict=True)]
        result[name] = {
            "ratio_quartiles": _quartiles(ratios),
            "plain_ms": 1e3 * statistics.median(a[index] for a in raw["plain"]),
            "relay_ms": 1e3 * statistics.median(b[index] for b in raw["relay"]),
        }
    result["faults_per_step"] = {
        name: statistics.median(block[2] for block in raw[name]) for name in ("plain", "relay")
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="small")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=10, help="steps per block")
    parser.add_argument(
        "--facade-only",
        action="store_true",
        help="B without the per-step work of relay.steps(): the collective path alone",
    )
    parser.add_argument(
        "--unguarded",
        action="store_true",
        help="B's stable group sends every collective straight to its inner group (no step "
        "guard, no completion callback): what the guard costs, not a way to train",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="B is plain DDP too, over a second gloo group: the method's own bias (1.00)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    a = parser.parse_args()
    if a.rank is not None:
        _worker(
            a.rank, a.port, a.model, a.rounds, a.block, a.out, a.facade_only, a.unguarded, a.control
        )
        return
    r = measure(a.model, a.rounds, a.block, a.facade_only, a.unguarded, control=a.control)
    for name in ("wall", "cpu"):
        q1, q2, q3 = r[name]["ratio_quartiles"]
        print(
            f"{name} per step: plain DDP {r[name]['plain_ms']:.2f} ms, torchrelay "
            f"{r[name]['relay_ms']:.2f} ms; ratio median {q2:.3f} (quartiles {q1:.3f}-{q3:.3f})"
        )
    print(f"B's step guard: {r['guard']}; collectives in the compiled fast lane: {r['fast_lane']}")
    faults = r["faults_per_step"]
    print(f"minor page faults per step: plain DDP {faults['plain']:.0f}, ", end="")
    print(f"torchrelay {faults['relay']:.0f}")
    print(f"final weights bitwise equal: {r['weights_equal']}")
    if a.json:
        a.json.write_text(json.dumps(r))


if __name__ == "__main__":
    main()
