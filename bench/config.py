"""Benchmark sizes: which jobs run, how long, and when workers are killed.

Sizes are picked to fit the time budget on the project's 2-core machine (2 workers; every
process start costs ~2.5 s of CPU there): the default preset takes about 10 minutes, ``quick``
under 3. Kills are spaced so that each failure's recovery is over before the next one, and
each falls half a checkpoint interval after a checkpoint, so torchrun's rollback is the
expected K/2 steps.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    """One model size: a job of ``steps`` steps, run failure-free and with ``kill_steps``."""

    model: str
    steps: int
    kill_steps: tuple[int, ...]
    repeats: int


@dataclass(frozen=True)
class BenchConfig:
    """Everything that defines a benchmark run (recorded in the report)."""

    name: str
    scenarios: tuple[Scenario, ...]
    world: int = 2
    kill_rank: int = 1
    ckpt_every: int = 50
    heartbeat_ms: int = 1000
    run_timeout_s: float = 180.0


PRESETS: dict[str, BenchConfig] = {
    "default": BenchConfig(
        "default",
        (
            Scenario("small", steps=540, kill_steps=(125, 275, 425), repeats=3),
            Scenario("large", steps=150, kill_steps=(75,), repeats=1),
        ),
    ),
    "quick": BenchConfig(
        "quick", (Scenario("small", steps=200, kill_steps=(125,), repeats=1),), run_timeout_s=90.0
    ),
}
