"""Scenario inputs: frozen dataclasses with validated ranges (read from dicts or YAML by
:mod:`torchrelay.simulate.settings`).

Every duration carries its unit in its name (``_s`` seconds, ``_h`` hours). Each field's
validator names only its own field; the reader adds the dotted path (``live.coverage``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Literal

from torchrelay.simulate import presets
from torchrelay.simulate.errors import ScenarioError
from torchrelay.simulate.scaling import mttf_at

HOURS_PER_YEAR = 8760.0
# The average month (8760 / 12 = 730 h); the $307K/month claim only reproduces with it.
HOURS_PER_MONTH = HOURS_PER_YEAR / 12


def _check(ok: bool, name: str, rule: str, value: object) -> None:
    if not ok:
        raise ScenarioError(f"{name}: must be {rule}, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    _check(math.isfinite(value) and value >= 0, name, "a finite number >= 0", value)


def _positive(name: str, value: float) -> None:
    _check(math.isfinite(value) and value > 0, name, "a finite number > 0", value)


def _share(name: str, value: float, meaning: str) -> None:
    _check(0 <= value <= 1, name, f"in [0, 1] ({meaning})", value)


MAX_GPUS = 1_000_000
"""Largest cluster simulated: five times the largest announced (~200k GPUs). The work grows
with the size (interruptions per simulated run, spare pools to size); at a million GPUs a
default run takes seconds, while an absurd size (1e13) would run for ever."""


@dataclass(frozen=True)
class Cluster:
    """The job's size and price: 1 to :data:`MAX_GPUS` GPUs, a non-negative price per
    GPU-hour."""

    gpus: int = 1024
    price_per_gpu_h: float = 3.0

    def __post_init__(self) -> None:
        _check(
            1 <= self.gpus <= MAX_GPUS, "gpus", f"an integer >= 1 and <= {MAX_GPUS:,}", self.gpus
        )
        _non_negative("price_per_gpu_h", self.price_per_gpu_h)


@dataclass(frozen=True)
class CalibrationPoint:
    """A measured interruption rate at one cluster size: the job MTTF or the per-GPU rate.

    Exactly one of the two is given; ``job_mttf_h`` is always the job-level MTTF in hours.
    """

    gpus: int
    mttf_h: float | None = None
    per_gpu_failures_per_h: float | None = None

    def __post_init__(self) -> None:
        _check(self.gpus >= 1, "gpus", "an integer >= 1", self.gpus)
        given = [v for v in (self.mttf_h, self.per_gpu_failures_per_h) if v is not None]
        _check(len(given) == 1, "mttf_h", "given, or per_gpu_failures_per_h instead", given)
        _positive("mttf_h" if self.mttf_h is not None else "per_gpu_failures_per_h", given[0])

    @property
    def job_mttf_h(self) -> float:
        """Mean hours between interruptions of a job spanning ``gpus`` GPUs."""
        if self.mttf_h is not None:
            return self.mttf_h
        assert self.per_gpu_failures_per_h is not None
        return 1.0 / (self.gpus * self.per_gpu_failures_per_h)


@dataclass(frozen=True)
class FailureClass:
    """One kind of interruption: how often (relative weight), how many GPUs it takes down at
    once (its blast radius), and whether swapping in spares can cure it at all (a software
    bug recurs on a spare; a dead GPU does not)."""

    name: str
    weight: float
    gpus: int = 1
    curable: bool = True

    def __post_init__(self) -> None:
        _non_negative("weight", self.weight)
        _check(self.gpus >= 1, "gpus", "an integer >= 1", self.gpus)


@dataclass(frozen=True)
class Failures:
    """When the job is interrupted and by what.

    Rate: ``mttf_h`` (the job MTTF at this cluster size) if set, else the ``calibration``
    preset name or points, interpolated in log-log space. Timing: a Poisson process, or a
    renewal process with Weibull gaps of the same mean. Kind: the ``mix`` of failure classes.
    """

    mttf_h: float | None = None
    calibration: str | tuple[CalibrationPoint, ...] = "kokolis2024"
    process: Literal["poisson", "weibull"] = "poisson"
    weibull_shape: float = 1.0
    mix: str | tuple[FailureClass, ...] = "single-gpu"

    def __post_init__(self) -> None:
        if self.mttf_h is not None:
            _positive("mttf_h", self.mttf_h)
        _positive("weibull_shape", self.weibull_shape)
        if isinstance(self.calibration, str):
            presets.lookup(presets.CALIBRATIONS, "calibration", self.calibration)
        else:
            sizes = [p.gpus for p in self.calibration]
            _check(bool(sizes), "calibration", "a preset name or at least one point", sizes)
            _check(len(set(sizes)) == len(sizes), "calibration", "distinct GPU counts", sizes)
        if isinstance(self.mix, str):
            presets.lookup(presets.MIXES, "mix", self.mix)
        else:
            total = sum(c.weight for c in self.mix)
            _check(total > 0, "mix", "classes with a positive total weight", total)

    def points(self, gpus: int) -> tuple[tuple[int, float], ...]:
        """Calibration as (GPUs, job MTTF h) pairs; an explicit ``mttf_h`` is one pair at
        ``gpus``, which holds its per-GPU rate constant at other sizes."""
        if self.mttf_h is not None:
            return ((gpus, self.mttf_h),)
        if isinstance(self.calibration, str):
            return presets.lookup(presets.CALIBRATIONS, "calibration", self.calibration).points
        return tuple((p.gpus, p.job_mttf_h) for p in self.calibration)

    def classes(self) -> tuple[FailureClass, ...]:
        """The failure classes of the mix (preset resolved), weights not yet normalised."""
        if isinstance(self.mix, str):
            preset = presets.lookup(presets.MIXES, "mix", self.mix)
            return tuple(FailureClass(*row) for row in preset.classes)
        return self.mix

    def with_burst(self, share: float, gpus: int) -> Failures:
        """This mix plus a correlated-burst class (a rack or power domain: ``gpus`` GPUs at
        once, still curable given enough spares) that makes up ``share`` of interruptions."""
        _check(0 <= share < 1, "burst share", "in [0, 1)", share)
        _check(gpus >= 1, "burst gpus", "an integer >= 1", gpus)
        classes = self.classes()
        total = sum(c.weight for c in classes)
        scaled = tuple(replace(c, weight=c.weight / total * (1 - share)) for c in classes)
        return replace(self, mix=(*scaled, FailureClass("correlated-burst", share, gpus, True)))


@dataclass(frozen=True)
class Checkpointing:
    """Periodic checkpoints: blocking save cost and interval (None: Young/Daly optimum
    sqrt(2 * save * MTTF), computed per strategy from the failures it cannot cure live)."""

    interval_h: float | None = None
    save_s: float = 60.0

    def __post_init__(self) -> None:
        _non_negative("save_s", self.save_s)
        if self.interval_h is not None:
            _positive("interval_h", self.interval_h)
        elif self.save_s == 0:
            raise ScenarioError(
                "interval_h: not set and save_s is 0, so the Young/Daly interval "
                "sqrt(2 * save * MTTF) would be 0; set interval_h (e.g. 1.5) or save_s > 0"
            )


@dataclass(frozen=True)
class Restart:
    """Checkpoint-restart cost per failure, split into its phases. Only the total enters the
    model; the default split (sum 20 min, the vendor claims' restart) is illustrative."""

    detect_s: float = 120.0
    replace_s: float = 300.0
    restore_s: float = 300.0
    startup_s: float = 480.0

    def __post_init__(self) -> None:
        for f in fields(self):
            _non_negative(f.name, getattr(self, f.name))

    @property
    def total_s(self) -> float:
        """Seconds from failure to training again, excluding rework."""
        return self.detect_s + self.replace_s + self.restore_s + self.startup_s


@dataclass(frozen=True)
class LiveRecovery:
    """Live recovery onto hot spares.

    ``recovery_s``: pause from failure to training again (end to end). ``coverage``: share of
    curable failures it cures with zero lost steps. ``overhead``: steady-state throughput
    cost. ``warning_share``: share of curable failures announced early enough to migrate
    away proactively (zero rework; costs one pause and the spares).
    """

    recovery_s: float = 90.0
    coverage: float = 0.95
    overhead: float = 0.01
    warning_share: float = 0.0

    def __post_init__(self) -> None:
        _non_negative("recovery_s", self.recovery_s)
        _share("coverage", self.coverage, "share of failures cured live")
        _check(0 <= self.overhead < 1, "overhead", "in [0, 1) (throughput lost)", self.overhead)
        _share("warning_share", self.warning_share, "share of failures with warning signs")


@dataclass(frozen=True)
class Spares:
    """The hot-spare pool that live recovery draws from.

    ``count`` None sizes the pool to the smallest one whose blocking probability is at most
    ``target_blocking``. A used spare returns after ``repair_h``. ``source`` idle: the pool
    is paid for all the time; borrowed: taken from a lower-priority job, which loses
    ``preempt_gpu_h`` GPU-hours of its own work per GPU taken.
    """

    count: int | None = None
    source: Literal["idle", "borrowed"] = "idle"
    repair_h: float = 24.0
    target_blocking: float = 0.001
    preempt_gpu_h: float = 1.0

    def __post_init__(self) -> None:
        if self.count is not None:
            _check(self.count >= 0, "count", "an integer >= 0 or null (auto)", self.count)
        _positive("repair_h", self.repair_h)
        _check(0 < self.target_blocking < 1, "target_blocking", "in (0, 1)", self.target_blocking)
        _non_negative("preempt_gpu_h", self.preempt_gpu_h)


MAX_REPLICATIONS = 10_000
MAX_RUN_DAYS = 3650.0
"""Bounds of the Monte Carlo (the default is 200 runs of 30 days): its time grows with both,
and beyond them a typo would keep it running for hours instead of saying so."""


@dataclass(frozen=True)
class Simulation:
    """Monte Carlo settings: replications (0 skips it; else 2 to :data:`MAX_REPLICATIONS`
    for an interval), run length in days (at most :data:`MAX_RUN_DAYS`), and the seed (>= 0)
    that makes results reproducible."""

    replications: int = 200
    run_days: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        ok = self.replications == 0 or 2 <= self.replications <= MAX_REPLICATIONS
        _check(ok, "replications", f"0 (skip) or in [2, {MAX_REPLICATIONS:,}]", self.replications)
        _positive("run_days", self.run_days)
        _check(self.run_days <= MAX_RUN_DAYS, "run_days", f"<= {MAX_RUN_DAYS:g}", self.run_days)
        _check(self.seed >= 0, "seed", "an integer >= 0", self.seed)


@dataclass(frozen=True)
class Scenario:
    """Everything both engines need; every field validated on construction."""

    cluster: Cluster = field(default_factory=Cluster)
    failures: Failures = field(default_factory=Failures)
    checkpoint: Checkpointing = field(default_factory=Checkpointing)
    restart: Restart = field(default_factory=Restart)
    live: LiveRecovery = field(default_factory=LiveRecovery)
    spares: Spares = field(default_factory=Spares)
    simulation: Simulation = field(default_factory=Simulation)

    @property
    def mttf_h(self) -> float:
        """Job MTTF in hours at this cluster size."""
        return mttf_at(self.failures.points(self.cluster.gpus), self.cluster.gpus)

    def at_size(self, gpus: int) -> Scenario:
        """The same scenario at another size; an explicit MTTF keeps its per-GPU rate."""
        points = self.failures.points(self.cluster.gpus)
        calibration = tuple(CalibrationPoint(n, mttf_h=m) for n, m in points)
        return replace(
            self,
            cluster=replace(self.cluster, gpus=gpus),
            failures=replace(self.failures, mttf_h=None, calibration=calibration),
        )
