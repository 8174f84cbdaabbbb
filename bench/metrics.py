"""Pure functions from progress logs, kill times and weights to the reported numbers.

Every system's rank 0 writes one ``step time participants`` line per committed step (see
``bench.workload.ProgressLog``); a torchrun restart appends the rolled-back steps again. From
that alone, identically for all systems:

- *normal interval* ``p``: median gap between consecutive steps before the kill;
- *stall*: kill -> the first commit of a step never committed before (> ``h``, the highest step
  committed before the kill) from which ``window`` consecutive new steps follow at normal pace
  (each gap <= ``tolerance * p``). Rollback and recompute are inside it by construction;
- *resume*: kill -> the first commit of a new step, whatever the pace after it;
- *degraded*: kill -> the first new commit from which the job also runs at full strength
  (participants == world) for ``window`` steps; equals the stall except for torchft, which
  keeps committing with fewer replicas;
- *lost*: committed steps the job had to redo = ``h + 1 - first step committed after kill``;
- *recomputed*: steps whose work was done again = commits after the kill of steps <= ``h``,
  plus the one step in flight when the worker died (killed inside it, so always 1);
- *samples dropped*: for steps committed with fewer participants than the world, the missing
  replicas' samples (they never reach the weights);
- *time lost*: how far behind its own pace (``p``) the job is ``LOST_AFTER`` new steps
  after it is back at full strength (the commit that ends *degraded*, and the ones after it):
  that commit's time less the commit of ``h``, less ``p`` for each step between them. It counts
  the stall and the slower steps after it (a refill spare starting beside the workers, a new
  communicator's first collectives, torchft's rejoin), as an end-to-end time does, without the
  job-to-job drift of the pace that a ratio of two jobs' times carries;
- *after the stall*: the first ``AFTER_STALL`` steps from the stall's end, each step's time over
  ``p``: which of those slower steps the time lost beyond the stall is made of.
"""

from __future__ import annotations

import itertools
import math
import random
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Commit:
    """One committed step as rank 0 logged it."""

    step: int
    t: float
    participants: int


@dataclass(frozen=True)
class Kill:
    """A SIGKILL: the step the victim was starting (``step``) and when (``t``)."""

    step: int
    t: float


LOST_AFTER = 25  # steps at full strength after a kill by which its time lost is taken
AFTER_STALL = 10  # steps after a stall whose pace ``after_stall`` reports


@dataclass(frozen=True)
class FailureImpact:
    """The cost of one failure, as defined in the module docstring."""

    stall_s: float
    resume_s: float
    degraded_s: float
    lost_steps: int
    recomputed_steps: int
    samples_dropped: int
    time_lost_s: float


@dataclass(frozen=True)
class Spread:
    """Median with min and max of a sample (``n`` values)."""

    median: float
    lo: float
    hi: float
    n: int


def parse_progress(text: str) -> list[Commit]:
    """Parses progress-file text; ignores a torn last line (a writer killed mid-line)."""
    commits = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            commits.append(Commit(int(parts[0]), float(parts[1]), int(parts[2])))
    return commits


def parse_kill_marker(text: str) -> Kill:
    """The kill recorded in a ``KillSwitch`` marker (``scheduled_step step time``)."""
    _, step, t = text.split()
    return Kill(int(step), float(t))


def steady_rate(commits: Sequence[Commit], skip: float = 0.2) -> float:
    """Steps/s over the commits after the first ``skip`` fraction (start-up excluded)."""
    first = max(1, int(len(commits) * skip))
    if len(commits) - first < 2:
        return math.nan
    span = commits[-1].t - commits[first].t
    return (len(commits) - 1 - first) / span if span > 0 else math.nan


def normal_interval(commits: Sequence[Commit], before: float, last: int = 50) -> float:
    """Median gap between consecutive-step commits in the ``last`` ones before ``before``."""
    pre = [c for c in commits if c.t <= before][-last - 1 :]
    gaps = [b.t - a.t for a, b in itertools.pairwise(pre) if b.step == a.step + 1]
    return statistics.median(gaps) if gaps else math.nan


def _recovery_index(
    new: Sequence[Commit], interval: float, window: int, tolerance: float, world: int | None
) -> int | None:
    """Index of the first new commit followed by ``window`` normal ones (see module doc)."""
    limit = tolerance * interval
    for i in range(len(new)):
        run = new[i : i + window + 1]
        paced = all(b.t - a.t <= limit for a, b in itertools.pairwise(run))
        full = world is None or all(c.participants >= world for c in run)
        if paced and full:
            return i
    return None


def _recovered_at(new: Sequence[Commit], kill_t: float, found: int | None) -> float:
    """Kill -> the commit at ``found`` (``_recovery_index``), or the last one if none."""
    if found is not None:
        return new[found].t - kill_t
    return (new[-1].t - kill_t) if new else math.nan


def _split_at_kill(commits: Sequence[Commit], kill: Kill) -> int:
    """Index of the first commit that happened after the kill.

    The victim dies at the start of step ``kill.step``, having committed the step before; rank 0
    may log that step a moment *after* the kill (it finished its optimizer step later). That
    commit belongs before the kill, or the rollback would look one step shorter than it was.
    """
    split = next((i for i, c in enumerate(commits) if c.t > kill.t), len(commits))
    prev = commits[split - 1].step if split else -1
    if split < len(commits) and commits[split].step == kill.step - 1 == prev + 1:
        split += 1
    return split


def failure_impact(
    commits: Sequence[Commit],
    kill: Kill,
    world: int,
    batch: int,
    until: float = math.inf,
    window: int = 5,
    tolerance: float = 3.0,
) -> FailureImpact:
    """The impact of ``kill``, looking at commits up to ``until`` (the next kill)."""
    split = _split_at_kill(commits, kill)
    before = commits[:split]
    after = [c for c in commits[split:] if c.t < until]
    high = max((c.step for c in before), default=-1)
    seen: set[int] = set()
    new = []
    for commit in after:
        if commit.step > high and commit.step not in seen:
            seen.add(commit.step)
            new.append(commit)
    interval = normal_interval(before, kill.t)
    lost = max(0, high + 1 - after[0].step) if after else 0
    last_before = max((c.t for c in before if c.step == high), default=math.nan)
    normal = _recovery_index(new, interval, window, tolerance, None)
    full = _recovery_index(new, interval, window, tolerance, world)
    end = None if full is None else full + LOST_AFTER - 1
    paced = new[end] if end is not None and end < len(new) else None
    return FailureImpact(
        stall_s=_recovered_at(new, kill.t, normal),
        resume_s=new[0].t - kill.t if new else math.nan,
        degraded_s=_recovered_at(new, kill.t, full),
        lost_steps=lost,
        recomputed_steps=sum(1 for c in after if c.step <= high) + 1,
        samples_dropped=sum(max(0, world - c.participants) * batch for c in after),
        time_lost_s=(paced.t - last_before - (paced.step - high) * interval if paced else math.nan),
    )


def _until_next(kills: Sequence[Kill]) -> list[tuple[Kill, float]]:
    """Each kill in time order, with the time of the next one (``inf`` for the last)."""
    ordered = sorted(kills, key=lambda k: k.t)
    bounds = [*(k.t for k in ordered[1:]), math.inf][: len(ordered)]
    return list(zip(ordered, bounds, strict=True))


def all_failures(
    commits: Sequence[Commit], kills: Sequence[Kill], world: int, batch: int
) -> list[FailureImpact]:
    """``failure_impact`` of each kill, each one looked at until the next kill."""
    return [failure_impact(commits, k, world, batch, until=u) for k, u in _until_next(kills)]


def after_stall(
    commits: Sequence[Commit],
    kill: Kill,
    stall_s: float,
    until: float = math.inf,
    count: int = AFTER_STALL,
) -> list[float]:
    """The gaps between the first ``count`` + 1 consecutive new steps from the stall's end (the
    commit that starts its paced run), each over the normal interval before ``kill``: where a
    kill's time lost beyond its stall goes. Fewer where the next kill (``until``) or a gap in
    the steps comes first; none where no stall ended (``stall_s`` NaN)."""
    interval = normal_interval(commits, kill.t)
    end = kill.t + stall_s - 1e-9  # the stall's end is that commit's own time
    run = [c for c in commits if end <= c.t < until]
    ratios: list[float] = []
    for a, b in itertools.pairwise(run):
        if b.step != a.step + 1 or len(ratios) == count:
            break
        ratios.append((b.t - a.t) / interval)
    return ratios


def all_after_stall(
    commits: Sequence[Commit], kills: Sequence[Kill], impacts: Sequence[FailureImpact]
) -> list[list[float]]:
    """``after_stall`` of each kill (``impacts``: ``all_failures``'s, in the same order)."""
    return [
        after_stall(commits, k, impact.stall_s, until=u)
        for (k, u), impact in zip(_until_next(kills), impacts, strict=True)
    ]


def compare_weights(
    a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]
) -> tuple[bool, float]:
    """(bitwise equal, max abs difference) of two state dicts with the same keys."""
    if a.keys() != b.keys():
        return False, math.inf
    equal, worst = True, 0.0
    for key, x in a.items():
        y = b[key]
        if x.shape != y.shape:
            return False, math.inf
        equal = equal and torch.equal(x, y)
        worst = max(worst, (x.double() - y.double()).abs().max().item() if x.numel() else 0.0)
    return equal, worst


def spread(values: Iterable[float]) -> Spread:
    """Median/min/max of the finite values (all NaN if there are none)."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return Spread(math.nan, math.nan, math.nan, 0)
    return Spread(statistics.median(finite), min(finite), max(finite), len(finite))


@dataclass(frozen=True)
class Difference:
    """``median(a) - median(b)`` with a 95 % bootstrap interval ``[lo, hi]``."""

    median: float
    lo: float
    hi: float

    @property
    def resolved(self) -> bool:
        """Whether the interval excludes 0: the two samples differ beyond their own noise."""
        return self.lo > 0 or self.hi < 0


def median_difference(
    a: Sequence[float], b: Sequence[float], rounds: int = 2000, seed: int = 0
) -> Difference:
    """The difference of the samples' medians and its 95 % percentile-bootstrap interval.

    Why: on a shared 2-core VM the median of 9 kills moves by several ms between runs of the
    same code, so a change of a few ms read off two medians is noise more often than not;
    the interval says what a run can resolve. Deterministic for a ``seed``; NaNs are dropped;
    an empty sample gives NaNs."""
    xs = [v for v in a if not math.isnan(v)]
    ys = [v for v in b if not math.isnan(v)]
    if not xs or not ys:
        return Difference(math.nan, math.nan, math.nan)
    rng = random.Random(seed)
    diffs = sorted(
        statistics.median(rng.choices(xs, k=len(xs)))
        - statistics.median(rng.choices(ys, k=len(ys)))
        for _ in range(rounds)
    )
    return Difference(
        statistics.median(xs) - statistics.median(ys),
        diffs[int(0.025 * (rounds - 1))],
        diffs[int(0.975 * (rounds - 1))],
    )


@dataclass(frozen=True)
class RecoveryPhases:
    """torchrelay's recovery timeline as durations (seconds) between ledger timestamps."""

    detect: float
    plan: float
    communicator: float
    transfer: float
    first_step: float
    total: float
    bytes_moved: int

    @property
    def transfer_bytes_per_s(self) -> float:
        return self.bytes_moved / self.transfer if self.transfer > 0 else math.nan


def recovery_phases(event: Mapping[str, object], kill_t: float) -> RecoveryPhases:
    """Durations from a ``recovery_done`` ledger event and the kill time.

    detect = kill -> detected; plan = detected -> planned (spare ready, survivors halted);
    communicator = planned -> comm_ready; transfer = comm_ready -> transfer_done;
    first step = transfer_done -> first_step (the step in flight, recomputed).
    """
    tl = event["timeline"]
    assert isinstance(tl, Mapping)
    return RecoveryPhases(
        detect=tl["detected"] - kill_t,
        plan=tl["planned"] - tl["detected"],
        communicator=tl["comm_ready"] - tl["planned"],
        transfer=tl["transfer_done"] - tl["comm_ready"],
        first_step=tl["first_step"] - tl["transfer_done"],
        total=tl["first_step"] - kill_t,
        bytes_moved=int(event.get("bytes_transferred", 0)),  # type: ignore[call-overload]
    )


# The template's line for each fork (agent/template_main.py).
FORKED = re.compile(r"forked pid (\d+) in [\d.]+ ms \(([\d.]+) ms of CPU\)")


def refill_cpu(events: Sequence[Mapping[str, Any]], template_log: str) -> list[tuple[float, bool]]:
    """``(CPU seconds, forked)`` of every refill spare: one that joined after the first
    failure, its own CPU until ready plus the template's for its fork."""
    first_failure = min((e["t"] for e in events if e.get("event") == "failure"), default=None)
    if first_failure is None:
        return []
    template_cpu = {int(pid): float(ms) / 1e3 for pid, ms in FORKED.findall(template_log)}
    joined = {
        e["process"]: e["pid"]
        for e in events
        if e.get("event") == "process_join" and e["role"] == "spare" and e["t"] > first_failure
    }
    found = []
    for event in events:
        if event.get("event") != "spare_ready" or event["process"] not in joined:
            continue
        share = template_cpu.get(joined[event["process"]], 0.0)
        found.append((event["cpu_seconds"] + share, bool(event.get("forked"))))
    return found
