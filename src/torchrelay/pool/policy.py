"""The pool's decisions: pure functions over :class:`~torchrelay.pool.state.PoolState`.

Each entry point mutates the state in place and queues what the affected jobs must be told on
their :attr:`PoolJob.commands` (fetched by their links, see :mod:`torchrelay.pool.link`):

- ``grant {slot, loan?, lender?}``: start a spare on ``slot`` (it replaces a lost process);
- ``refuse {reason}``: no slot can be had now (the job shrinks or stops as without a pool);
- ``release {loan, borrower}``: a lender gives one process up at its next step boundary
  (``Controller.release``: an --elastic shrink, the global batch unchanged);
- ``grow {slot, loan}``: a loan came back: the lender starts a spare and regrows onto it;
- ``park {loan, borrower}``: a lender at its minimum halts whole right after committing its
  next step boundary and reports ``parked``; then every slot it holds leaves it (one to the
  borrower, the others idle);
- ``unpark {loan, slots}``: a park loan came back (``count`` slots at once): the lender resumes
  from the step it parked at, with the same processes.

Policy (:func:`choose_lender`): a job that lost a process takes an idle slot if one exists;
else it borrows from a job of priority strictly below its own that is not recovering, not
growing or shrinking, not parked, not itself waiting for slots, and that was asked to lend
fewer than ``Rules.max_lends`` times in the last ``Rules.window`` seconds (so a lender is not
drained over and over, by shrinks and parks alike). Among those, a job that can release a
process without going below its ``--min-nproc`` shrinks (lowest priority first); only when no
job can, the lowest-priority *parkable* job with no release pending parks. A slot that comes
back to the pool pays loans back first, oldest first and strictly in order (a park loan waits
until ``count`` slots are idle, and younger loans wait behind it), before any new grant; the
shrink loans of a parked lender wait until it is unparked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torchrelay.pool.state import BROKEN, IDLE, Loan, LoanKind, LoanState, PoolJob, PoolState

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
    state: PoolState,
    name: str,
    size: int,
    min_nproc: int,
    priority: int,
    elastic: bool,
    parkable: bool = False,
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
    state.jobs[name] = PoolJob(
        name, size, min_nproc, priority, elastic, processes=size, lent_at=[], parkable=parkable
    )
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
    parked: bool = False,
) -> None:
    """A job's link reports its live processes, whether it is recovering, how many lost
    processes it wants replaced (each sets one of its slots aside as broken), the loans whose
    release or park it refused (loan id -> why) and whether it is parked; then everything that
    can be decided is."""
    job = job_of(state, name)
    job.processes, job.recovering, job.parked = processes, recovering, parked
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
) -> tuple[str | None, LoanKind, str]:
    """The job that lends ``borrower`` a slot and how (a shrink if any job can, else a park),
    or ``None`` and why no job can."""
    asked: dict[str, int] = {}
    for loan in state.loans_in(LoanState.ASKED):
        asked[loan.lender] = asked.get(loan.lender, 0) + 1
    parked = state.parked_lenders()
    why: list[str] = []
    shrink: list[PoolJob] = []
    park: list[PoolJob] = []
    for job in state.jobs.values():
        if job.name == borrower.name:
            continue
        pending = asked.get(job.name, 0)
        skip = _cannot_lend(state, job, borrower, job.name in parked, now, rules)
        skip = skip or _cannot_shrink(job, pending)
        if not skip:
            shrink.append(job)
        elif skip.startswith(_NO_SHRINK) and not _cannot_park(job, pending):
            park.append(job)
        else:
            why.append(f"{job.name}: {skip}" + _park_why(job, pending, skip))
    if shrink:
        best = min(shrink, key=lambda j: (j.priority, -(j.processes - j.min_nproc), j.name))
        return best.name, LoanKind.SHRINK, ""
    if park:
        return min(park, key=lambda j: (j.priority, j.name)).name, LoanKind.PARK, ""
    return None, LoanKind.SHRINK, "; ".join(why) or "no other job is attached"


_NO_SHRINK = "cannot shrink: "
"""How a reason that only rules a shrink out (a park may still be possible) starts."""


def _cannot_lend(
    state: PoolState, job: PoolJob, borrower: PoolJob, parked: bool, now: float, rules: Rules
) -> str:
    """Why ``job`` may lend ``borrower`` nothing at all now ("" if it may shrink or park)."""
    recent = [t for t in job.lent_at if now - t < rules.window]
    if job.priority >= borrower.priority:
        return f"priority {job.priority} is not below {borrower.priority}"
    if job.recovering:
        return "recovering"
    if parked or job.parked:
        return "parked"
    if job.wanted > 0:
        return "waiting for a slot itself"
    if job.processes != len(state.held(job.name)):
        return "growing or shrinking"
    if len(recent) >= rules.max_lends:
        return f"lent {len(recent)} time(s) in the last {rules.window:.0f} s"
    return ""


def _cannot_shrink(job: PoolJob, asked: int) -> str:
    """Why ``job`` may not release one process, ``asked`` releases already pending."""
    if not job.elastic:
        return _NO_SHRINK + "not --elastic"
    if job.processes - asked - 1 < job.min_nproc:
        return _NO_SHRINK + f"at its minimum ({job.min_nproc} process(es))"
    return ""


def _cannot_park(job: PoolJob, asked: int) -> str:
    if not job.parkable:
        return "does not park (--no-park, or its launcher cannot)"
    if asked:
        return "a release is pending"
    return ""


def _park_why(job: PoolJob, asked: int, skip: str) -> str:
    """What to add to ``skip`` (a reason a job lends nothing) about parking."""
    if not skip.startswith(_NO_SHRINK):
        return ""
    return f", cannot park: {_cannot_park(job, asked)}"


def settle(state: PoolState, now: float, rules: Rules) -> None:
    """Decide everything that can be: loans whose lender released a process move their slot;
    idle slots pay loans back, then serve waiting jobs; a job still waiting borrows or is
    refused."""
    for loan in state.loans_in(LoanState.ASKED):
        lender = state.jobs[loan.lender]
        held = state.held(loan.lender)
        shrunk = loan.kind is LoanKind.SHRINK and lender.processes < len(held)
        if shrunk or (loan.kind is LoanKind.PARK and lender.parked and held):
            loan.slot, loan.count = held[-1], len(held) if loan.kind is LoanKind.PARK else 1
            for slot in held[:-1] if loan.kind is LoanKind.PARK else []:
                state.slots[slot] = IDLE  # a parked lender's other slots go to the pool
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
        grant.update(loan=loan.id, lender=loan.lender, kind=loan.kind.value)
    job.commands.append(grant)


def _pay_back(state: PoolState) -> None:
    for loan in state.loans_in(LoanState.ACTIVE):
        lender = state.jobs.get(loan.lender)
        idle = state.idle()
        if lender is None:
            loan.move(LoanState.RETURNED, f"{loan.lender} left the pool")
        elif loan.kind is LoanKind.PARK:
            if len(idle) < loan.count:
                return  # oldest debt first: younger loans wait behind this one
            for slot in idle[: loan.count]:
                state.slots[slot] = lender.name
            loan.move(LoanState.RETURNED, f"slot(s) {idle[: loan.count]} came back")
            lender.commands.append({"type": "unpark", "loan": loan.id, "slots": idle[: loan.count]})
        elif lender.name in state.parked_lenders():
            continue  # paid back once its park loan is
        elif idle and len(state.held(lender.name)) < lender.size:
            state.slots[idle[0]] = lender.name
            loan.move(LoanState.RETURNED, f"slot {idle[0]} came back")
            lender.commands.append({"type": "grow", "slot": idle[0], "loan": loan.id})


def _serve(state: PoolState, job: PoolJob, now: float, rules: Rules) -> None:
    idle = state.idle()
    if idle:
        _give(state, job, idle[0], None)
        return
    lender, kind, why = choose_lender(state, job, now, rules)
    if lender is None:
        job.wanted -= 1
        job.commands.append({"type": "refuse", "reason": f"no idle slot and no lender ({why})"})
        return
    loan = Loan(id=len(state.loans), borrower=job.name, lender=lender, asked=now, kind=kind)
    state.loans.append(loan)
    state.jobs[lender].lent_at.append(now)
    command = "park" if kind is LoanKind.PARK else "release"
    state.jobs[lender].commands.append({"type": command, "loan": loan.id, "borrower": job.name})
