"""Monte Carlo discrete-event simulation of a long training run under interruptions.

Each replication draws one interruption trace (times from a Poisson or Weibull renewal
process, a failure class per event, and the uniforms that decide warning and coverage) and
replays it through both strategies, so their difference is measured on the same failures.

Event model, shared with ``analytic.ettr_exact``:

* The job runs in segments of ``interval`` compute plus a blocking ``save``; progress is kept
  only when a segment's save completes (or when the run ends, as it would with a final save).
* An interruption is handled live if the strategy can (curable class, warned or covered)
  and the pool has the class's GPUs free; the spares come back after the repair time. A live
  event pauses training for the recovery time, restarting the pause if it lands in one.
* Anything else rolls back: progress since the last save is lost and the job restarts,
  and any interruption during a restart starts the restart again.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from torchrelay.simulate.params import Failures, Scenario
from torchrelay.simulate.plan import Strategy, StrategyPlan, plans

Z_95 = 1.96


@dataclass(frozen=True)
class Estimate:
    """A mean over replications and its 95% confidence half-width (1.96 standard errors)."""

    mean: float
    half_width: float

    @property
    def low(self) -> float:
        """Lower end of the 95% confidence interval."""
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        """Upper end of the 95% confidence interval."""
        return self.mean + self.half_width

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies inside the confidence interval."""
        return self.low <= value <= self.high


def estimate(samples: Sequence[float]) -> Estimate:
    """Mean and 1.96 * stderr of ``samples`` (at least two)."""
    values = np.asarray(samples, dtype=float)
    stderr = values.std(ddof=1) / math.sqrt(len(values))
    return Estimate(float(values.mean()), float(Z_95 * stderr))


@dataclass(frozen=True)
class StrategySample:
    """One strategy's Monte Carlo estimates. Shares are per interruption: handled live,
    blocked (would have been live but the pool was short), handled by warned migration."""

    strategy: Strategy
    ettr: Estimate
    dollars_per_h: Estimate
    failures_per_h: Estimate
    live_share: Estimate
    blocked_share: Estimate
    warned_share: Estimate


@dataclass(frozen=True)
class MonteCarlo:
    """Both strategies replayed over the same seeded interruption traces."""

    replications: int
    run_days: float
    seed: int
    checkpoint_restart: StrategySample
    live_recovery: StrategySample


class _Trace(NamedTuple):
    times: list[float]
    classes: list[int]
    warn: list[float]
    cover: list[float]


class _Tally(NamedTuple):
    ettr: float
    events: int
    live: int
    blocked: int
    warned: int
    borrowed_gpus: int


def _gaps(rng: np.random.Generator, failures: Failures, mttf_h: float, n: int) -> np.ndarray:
    if failures.process == "poisson":
        return rng.exponential(mttf_h, n)
    # Scale the Weibull so its mean is the MTTF: mean = scale * Gamma(1 + 1/k).
    scale = mttf_h / math.gamma(1 + 1 / failures.weibull_shape)
    return scale * rng.weibull(failures.weibull_shape, n)


def _trace(
    rng: np.random.Generator, failures: Failures, mttf_h: float, shares: Sequence[float], end: float
) -> _Trace:
    expected = end / mttf_h
    batch = int(expected + 5 * math.sqrt(expected)) + 16
    chunks, last = [], 0.0
    while last < end:
        times = last + np.cumsum(_gaps(rng, failures, mttf_h, batch))
        chunks.append(times)
        last = float(times[-1])
    times = np.concatenate(chunks)
    times = times[times < end]
    n = len(times)
    classes = rng.choice(len(shares), size=n, p=shares) if len(shares) > 1 else np.zeros(n, int)
    return _Trace(times.tolist(), classes.tolist(), rng.random(n).tolist(), rng.random(n).tolist())


_RUN, _PAUSE, _DOWN = 0, 1, 2


def _replay(plan: StrategyPlan, trace: _Trace, end: float) -> _Tally:
    """Run one strategy through one trace; the hot loop, so locals only."""
    segment, interval = plan.segment_h, plan.interval_h
    restart, pause, repair = plan.restart_h, plan.pause_h, plan.repair_h
    warning, coverage = plan.warning_share, plan.coverage
    curable = [c.curable for c in plan.classes]
    gpus = [c.gpus for c in plan.classes]
    can_live = plan.strategy is Strategy.LIVE_RECOVERY
    free, returns = plan.pool, []
    state, until, now = _RUN, 0.0, 0.0
    progress, segments = 0.0, 0
    live = blocked = warned = borrowed = 0

    # A sentinel event at ``end`` advances the clock one last time through the same code.
    events = zip(
        [*trace.times, end],
        [*trace.classes, 0],
        [*trace.warn, 1.0],
        [*trace.cover, 1.0],
        strict=True,
    )
    for at, kind, u_warn, u_cover in events:
        if state != _RUN and until <= at:
            state, now = _RUN, until
        if state == _RUN:
            progress += at - now
            if progress >= segment:
                done = int(progress // segment)
                segments += done
                progress -= done * segment
        now = at
        if at >= end:
            break
        while returns and returns[0][0] <= at:
            free += heapq.heappop(returns)[1]
        handled_live = False
        if can_live and curable[kind]:
            is_warned = u_warn < warning
            if is_warned or u_cover < coverage:
                need = gpus[kind]
                if free >= need:
                    free -= need
                    heapq.heappush(returns, (at + repair, need))
                    borrowed += need
                    live += 1
                    warned += is_warned
                    handled_live = True
                else:
                    blocked += 1
        if state == _DOWN:
            until = at + restart
        elif handled_live:
            state, until = _PAUSE, at + pause
        else:
            state, until, progress = _DOWN, at + restart, 0.0

    # The run ends with a final save: the work of the segment in flight is kept too.
    kept = min(progress, interval) + (segments * interval if segments else 0.0)
    return _Tally(
        ettr=(1 - plan.overhead) * kept / end,
        events=len(trace.times),
        live=live,
        blocked=blocked,
        warned=warned,
        borrowed_gpus=borrowed,
    )


def monte_carlo(scenario: Scenario) -> MonteCarlo:
    """Seeded, reproducible estimates for both strategies: ``scenario.simulation`` sets the
    number of replications (>= 2), the run length and the seed."""
    settings = scenario.simulation
    if settings.replications < 2:
        raise ValueError("monte_carlo needs simulation.replications >= 2")
    end = settings.run_days * 24
    resolved = plans(scenario)
    shares = [c.share for c in resolved[Strategy.CHECKPOINT_RESTART].classes]
    mttf_h = scenario.mttf_h
    tallies: dict[Strategy, list[_Tally]] = {strategy: [] for strategy in resolved}
    for child in np.random.SeedSequence(settings.seed).spawn(settings.replications):
        trace = _trace(np.random.default_rng(child), scenario.failures, mttf_h, shares, end)
        for strategy, plan in resolved.items():
            tallies[strategy].append(_replay(plan, trace, end))
    samples = {s: _summarise(resolved[s], tallies[s], end) for s in resolved}
    return MonteCarlo(
        replications=settings.replications,
        run_days=settings.run_days,
        seed=settings.seed,
        checkpoint_restart=samples[Strategy.CHECKPOINT_RESTART],
        live_recovery=samples[Strategy.LIVE_RECOVERY],
    )


def _summarise(plan: StrategyPlan, tallies: Sequence[_Tally], end: float) -> StrategySample:
    def share(count: int, tally: _Tally) -> float:
        return count / tally.events if tally.events else 0.0

    return StrategySample(
        strategy=plan.strategy,
        ettr=estimate([t.ettr for t in tallies]),
        dollars_per_h=estimate(
            [plan.dollars_per_h(t.ettr, t.borrowed_gpus / end) for t in tallies]
        ),
        failures_per_h=estimate([t.events / end for t in tallies]),
        live_share=estimate([share(t.live, t) for t in tallies]),
        blocked_share=estimate([share(t.blocked, t) for t in tallies]),
        warned_share=estimate([share(t.warned, t) for t in tallies]),
    )
