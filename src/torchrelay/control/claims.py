"""Which step a member's report may claim: pure rules over plain data.

Reports are authenticated, but the process behind one may be confused or dying, and what it
claims becomes the job's record (``steps_committed``, the planner's target step). So a claim is
acted on only if it fits the plan: every worker declares ``max_steps`` when it enters
``Relay.steps()`` (all must declare the same), a committed step lies in ``-1 .. max_steps - 1``,
``done`` is claimed at the last step only (a transparent-mode script decides its own end: its
workers declare :data:`OPEN_ENDED`, and claim done where the script stopped), and a member's
claims never go back -- except once on a receiver, whose state is replaced by the sources' (it
may drop to the plan's target step).

A worker reports on two channels, which may overtake each other on the wire: its heartbeats
(``progress``, from a thread of their own) and its training thread's reports (``halted``,
``done``, the ``progress`` of the first step after a recovery). Each is in order on its own, so
each has its own floor.
"""

from __future__ import annotations

from typing import Any

from torchrelay.control.protocol import Done, Halted, Progress, Report

BEAT, MAIN = "beat", "main"
# max_steps of a job whose script decides where it ends (``torchrelay run --transparent``).
OPEN_ENDED = 2**53


def claimed_step(report: Report) -> tuple[str, int] | None:
    """``(channel, step)`` that ``report`` claims, or None if it claims no step."""
    if isinstance(report, Progress):
        return (MAIN if report.first_after_recovery else BEAT), report.step
    if isinstance(report, Done):
        return MAIN, report.step
    if isinstance(report, Halted):
        return MAIN, report.committed
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def judge_claim(kind: str, step: Any, max_steps: int | None, floor: int | None) -> str | None:
    """Why a claim of committed ``step`` is refused, or None if it is acceptable.

    ``max_steps`` is the job's declared number of steps (None: nobody has entered
    ``Relay.steps()`` yet, so no step can have been committed); ``floor`` is the highest step
    this member claimed before on the same channel (None: no floor, as for a receiver).
    """
    if not _is_int(step) or step < -1:
        return f"claimed step {step!r} is not a step number (an integer >= -1)"
    if max_steps is None:
        if step >= 0:
            return f"claimed step {step} before any rank declared max_steps"
    elif step >= max_steps:
        return f"claimed step {step}, beyond the job's last step {max_steps - 1}"
    elif kind == "done" and step != max_steps - 1 and max_steps != OPEN_ENDED:
        return f"claimed to be done at step {step}, but the job's last step is {max_steps - 1}"
    if floor is not None and step < floor:
        return f"claimed step {step} after step {floor}: steps went backwards outside a recovery"
    return None


def judge_max_steps(value: Any, declared: int | None) -> str | None:
    """Why a declaration of ``max_steps`` is refused (``declared``: the job's, if any)."""
    if not _is_int(value) or value < 0:
        return f"max_steps {value!r} is not a number of steps (an integer >= 0)"
    if declared is not None and value != declared:
        return (
            f"declared max_steps={value}, but the job runs max_steps={declared}: every rank "
            "must pass the same max_steps to relay.steps()"
        )
    return None
