"""The pool's decisions: pure functions over :class:`~torchrelay.pool.state.PoolState`.

Each entry point mutates the state in place and queues what the affected jobs must be told on
their :attr:`PoolJob.commands` (fetched by their links, see :mod:`torchrelay.pool.link`):

- ``grant {slot, loan?, lender?}``: start a spare on ``slot`` (it replaces a lost process);
- ``refuse {reason}``: no slot can be had now (the job shrinks or stops as without a pool);
- ``release {loan, borrower}``: a lender gives one process up at its next step boundary
  (``Controller.release``: an --elastic shrink, the global batch unchanged);
- ``grow {slot, loan}``: a loan came back: the lender starts a spare and regrows onto it.

Policy (:func:`choose_lender`): a job that lost a process takes an idle slot if one exists;
else it borrows from the job of lowest priority (strictly below its own) that can release a
process without going below its ``--min-nproc``, that is not recovering, not growing and not
itself waiting for slots, and that was asked to lend fewer than ``Rules.max_lends`` times in
the last ``Rules.window`` seconds (so a lender is not drained over and over). A slot that comes
back to the pool pays a loan back first (oldest first), before any new grant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torchrelay.pool.state import BROKEN, IDLE, Loan, LoanState, PoolJob, PoolState

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class PoolRefusal(ValueError):
    """A request the pool refuses; the message is one actionable line."""


@dataclass(frozen=True)
class Rules:
    """``max_lends`` asks to lend per job within ``window`` seconds, at most."""

    max_lends: int = 3
    window: float = 3600.0


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise PoolRefusal(
            f"job name {name!r}: use 1-64 letters, digits, '.', '_' or '-' (starting with a "
            "letter or digit)"
        )
    return name


def attach(
    state: PoolState, name: str, size: int, min_nproc: int, priority: int, elastic: bool
) -> list[int]:
    """Give a new job ``size`` idle slots; :class:`PoolRefusal` if it cannot have them."""
    check_name(name)
    if name in state.jobs:
        raise PoolRefusal(f"a job named {name!r} is attached already (pick another --job-name)")
    if not 1 <= min_nproc <= size:
        raise PoolRefusal(f"min size {min_nproc} must be in [1, {size}]")
    idle = state.idle()
    if len(idle) < size:
        raise PoolRefusal(
            f"the pool has {len(idle)} idle slot(s) of {len(state.slots)}; job {name!r} needs "
            f"{size} (see `torchrelay status --pool`)"
        )
    for slot in idle[:size]:
        state.slots[slot] = name
    state.jobs[name] = PoolJob(name, size, min_nproc, priority, elastic, processes=size, lent_at=[])
    return idle[:size]


def job_of(state: PoolState, name: str) -> PoolJob:
    job = state.jobs.get(name)
    if job is None:
        raise PoolRefusal(f"no job named {name!r} is attached to this pool")
    return job


def report(
    state: PoolState,
    name: str,
    processes: int,
    recovering: bool,
    lost: int,
    refused: dict[int, str],
    now: float,
    rules: Rules,
) -> None:
    """A job's link reports its live processes, whether it is recovering, how many lost
    processes it wants replaced (each sets one of its slots aside as broken), and the loans
    whose release it refused (loan id -> why); then everything that can be decided is."""
    job = job_of(state, name)
    job.processes, job.recovering = processes, recovering
    for _ in range(lost):
        held = state.held(name)
        if held:
            state.slots[held[-1]] = BROKEN
        job.wanted += 1
    for loan in state.loans_in(LoanState.ASKED):
        if loan.lender == name and loan.id in refused:
            loan.move(LoanState.FAILED, f"{name} refused: {refused[loan.id]}")
    settle(state, now, rules)


def detach(state: PoolState, name: str, now: float, rules: Rules) -> None:
    """A job ended: its slots go back to the pool (paying its loans back first)."""
    job_of(state, name)
    for slot in state.held(name):
        state.slots[slot] = IDLE
    for loan in state.loans_in(LoanState.ASKED):
        if name in (loan.lender, loan.borrower):
            loan.move(LoanState.FAILED, f"{name} left the pool")
    del state.jobs[name]
    settle(state, now, rules)


def choose_lender(
    state: PoolState, borrower: PoolJob, now: float, rules: Rules
) -> tuple[str | None, str]:
    """The job that lends ``borrower`` a slot, or ``None`` and why no job can."""
    asked = {}
    for loan in state.loans_in(LoanState.ASKED):
        asked[loan.lender] = asked.get(loan.lender, 0) + 1
    why: list[str] = []
    fit: list[PoolJob] = []
    for job in state.jobs.values():
        if job.name == borrower.name:
            continue
        skip = _cannot_lend(state, job, borrower, asked.get(job.name, 0), now, rules)
        if skip:
            why.append(f"{job.name}: {skip}")
        else:
            fit.append(job)
    if not fit:
        return None, "; ".join(why) or "no other job is attached"
    best = min(fit, key=lambda j: (j.priority, -(j.processes - j.min_nproc), j.name))
    return best.name, ""


def _cannot_lend(
    state: PoolState, job: PoolJob, borrower: PoolJob, asked: int, now: float, rules: Rules
) -> str:
    """Why ``job`` may not lend to ``borrower`` now ("" if it may); ``asked``: its releases
    already asked for."""
    recent = [t for t in job.lent_at if now - t < rules.window]
    if job.priority >= borrower.priority:
        return f"priority {job.priority} is not below {borrower.priority}"
    if not job.elastic:
        return "not --elastic"
    if job.recovering:
        return "recovering"
    if job.wanted > 0:
        return "waiting for a slot itself"
    if job.processes != len(state.held(job.name)):
        return "growing or shrinking"
    if job.processes - asked - 1 < job.min_nproc:
        return f"at its minimum ({job.min_nproc} process(es))"
    if len(recent) >= rules.max_lends:
        return f"lent {len(recent)} time(s) in the last {rules.window:.0f} s"
    return ""


def settle(state: PoolState, now: float, rules: Rules) -> None:
    """Decide everything that can be: loans whose lender released a process move their slot;
    idle slots pay loans back, then serve waiting jobs; a job still waiting borrows or is
    refused."""
    for loan in state.loans_in(LoanState.ASKED):
        lender = state.jobs[loan.lender]
        held = state.held(loan.lender)
        if lender.processes < len(held):
            loan.slot = held[-1]
            loan.move(LoanState.ACTIVE)
            _give(state, state.jobs[loan.borrower], loan.slot, loan)
    _pay_back(state)
    waiting = sorted(state.jobs.values(), key=lambda j: (-j.priority, j.name))
    for job in waiting:
        coming = sum(1 for loan in state.loans_in(LoanState.ASKED) if loan.borrower == job.name)
        for _ in range(job.wanted - coming):
            _serve(state, job, now, rules)


def _give(state: PoolState, job: PoolJob, slot: int, loan: Loan | None) -> None:
    state.slots[slot] = job.name
    job.wanted -= 1
    grant: dict[str, Any] = {"type": "grant", "slot": slot}
    if loan is not None:
        grant.update(loan=loan.id, lender=loan.lender)
    job.commands.append(grant)


def _pay_back(state: PoolState) -> None:
    for loan in state.loans_in(LoanState.ACTIVE):
        lender = state.jobs.get(loan.lender)
        idle = state.idle()
        if lender is None:
            loan.move(LoanState.RETURNED, f"{loan.lender} left the pool")
        elif idle and len(state.held(lender.name)) < lender.size:
            state.slots[idle[0]] = lender.name
            loan.move(LoanState.RETURNED, f"slot {idle[0]} came back")
            lender.commands.append({"type": "grow", "slot": idle[0], "loan": loan.id})


def _serve(state: PoolState, job: PoolJob, now: float, rules: Rules) -> None:
    idle = state.idle()
    if idle:
        _give(state, job, idle[0], None)
        return
    lender, why = choose_lender(state, job, now, rules)
    if lender is None:
        job.wanted -= 1
        job.commands.append({"type": "refuse", "reason": f"no idle slot and no lender ({why})"})
        return
    loan = Loan(id=len(state.loans), borrower=job.name, lender=lender, asked=now)
    state.loans.append(loan)
    state.jobs[lender].lent_at.append(now)
    state.jobs[lender].commands.append({"type": "release", "loan": loan.id, "borrower": job.name})
