"""Verdicts on exits, missing spares and stuck recoveries, as pure functions over plain data.

The controller asks these when a process exits, when a recovery waits for a spare and while a
published plan is being carried out. Each takes what the controller knows (exit statuses, the
tail of a process's output, counts, timestamps) and returns a decision with a one-line reason;
no processes, sockets or locks here, so every rule is unit-tested directly.

The rules, in short:

- a worker that exits before it joins the job, or whose script fails (an exception, an exit)
  before any step was committed, is a bug in the script or its environment: every rank would
  fail the same way, so the job stops at once instead of retrying (:func:`never_joined`,
  :func:`fails_before_first_step`); after a hardware-like loss it is that loss's consequence,
  and the reason names the loss (:func:`lost_in_setup`);
- a job has *succeeded* only when every slot's process has exited with status 0 after its last
  step; anything else after the training loop is a failure (:func:`finish_verdict`);
- a recovery that needs more spares than are ready, starting or being launched will never get
  them: stop at once (:func:`missing_spares`);
- a published plan not carried out within :func:`recovery_deadline` is abandoned and planned
  again (:func:`overdue_reason`).
"""

from __future__ import annotations

import re
import signal
from typing import Any

TRACEBACK_HEADER = "Traceback (most recent call last):"
TAIL_LINES = 40
# What a plain torchrun script's own rendezvous leaves in its output under torchrelay run:
# rank 0 cannot listen on MASTER_PORT (the launcher's store holds it), and a spare has no RANK.
_TORCHRUN_MARKS = ("init_process_group", "EADDRINUSE", "env:// rendezvous")
TRANSPARENT_MODE_NOTE = (
    "torchrelay run runs scripts in model-aware mode, which needs torchrelay.init() (and "
    "relay.process_group for DDP) instead of dist.init_process_group(); run an unmodified "
    "torchrun script with torchrelay run --transparent --spares 0 (docs/transparent.md)"
)


def describe_exit(returncode: int) -> str:
    """``SIGKILL`` for a process killed by a signal (negative status), else ``exit code N``."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def worker_slot(process: str) -> int | None:
    """The slot of a worker started by a node agent (``worker3`` -> 3); ``None`` for a spare."""
    match = re.fullmatch(r"worker(\d+)", process)
    return int(match.group(1)) if match else None


def spare_node(process: str) -> str:
    """The node a spare process runs on, from its agent-given name (``node1-spare0``; node 0's
    agent gives none: ``spare0``)."""
    node, sep, _ = process.partition("-spare")
    return node if sep else "node0"


def last_traceback(output: str, max_lines: int = TAIL_LINES) -> str:
    """The last Python traceback in a process's ``output``, else its last ``max_lines`` lines.

    Never raises; an empty output gives an empty string.
    """
    lines = output.rstrip("\n").splitlines()
    starts = [i for i, line in enumerate(lines) if TRACEBACK_HEADER in line]
    tail = lines[starts[-1] :] if starts else lines
    return "\n".join(tail[-max_lines:])


def never_joined(process: str, returncode: int, output: str) -> str | None:
    """Why the job must stop because ``process`` exited before joining it, or ``None``.

    ``output`` is the end of the process's log. A worker that never joined leaves a slot no
    process can fill, whatever killed it; a spare that failed on its own (an exception, an exit,
    even with status 0) ran the same script as the workers, so they would fail the same way.
    Only a spare killed by a signal (the OOM killer, an operator) is no verdict on the script:
    ``None``, start another one.
    """
    slot = worker_slot(process)
    if slot is None and returncode < 0:
        return None
    who = f"rank {slot} ({process})" if slot is not None else process
    if any(mark in output for mark in _TORCHRUN_MARKS):
        return (
            f"{who} exited ({describe_exit(returncode)}) in its own torch.distributed "
            f"rendezvous, without joining the job: this looks like an unmodified torchrun "
            f"script; {TRANSPARENT_MODE_NOTE}"
        )
    if returncode == 0:
        return (
            f"{who} exited with status 0 without ever calling torchrelay.init(): the script "
            "must call torchrelay.init() and train in relay.steps(...)"
        )
    return (
        f"{who} failed ({describe_exit(returncode)}) before calling torchrelay.init(): a bug in "
        "the script or its environment, not a hardware failure (every rank would fail the same "
        "way), so the job stops without retrying"
    )


def unjoined_failure(process: str, returncode: int, output: str) -> dict[str, Any] | None:
    """The ledger's ``failure`` fields for a worker that exited before joining (``None`` for a
    spare: it held no slot). It fails in step 0, having committed nothing."""
    slot = worker_slot(process)
    if slot is None:
        return None
    kind = "exception" if TRACEBACK_HEADER in output else "exit"
    return {
        "slot": slot,
        "process": process,
        "last_reported_step": -1,
        "step": 0,
        "cause": describe_exit(returncode),
        "kind": "signal" if returncode < 0 else kind,
        "detected_by": "process exit before joining the job",
        "traceback": output or None,
    }


def fails_before_first_step(kind: str, highest_committed: int) -> bool:
    """A script failure (``exception``/``exit``) while no rank has committed a step yet is a
    bug every replacement would hit again: stop at once instead of retrying."""
    return kind in ("exception", "exit") and highest_committed < 0


def lost_in_setup(failed: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """Of the failures a recovery is handling (by slot), the first that looks like hardware
    (a signal, a self-fence): a script failure that follows it before any commit is its
    consequence, not a bug (the others' set-up collectives fail with the lost process)."""
    hardware = [f for f in failed.values() if f.get("kind") in ("signal", "fenced")]
    return min(hardware, key=lambda f: f["t"]) if hardware else None


def first_step_bug_reason(
    slot: int, process: str, step: int, cause: str, lost: dict[str, Any] | None = None
) -> str:
    """Why a script failure before any commit stopped the job (see above); ``lost``: the
    earlier loss it followed (:func:`lost_in_setup`), which is then named as the cause."""
    if lost is not None:
        return (
            f"rank {lost['slot']} ({lost['process']}) was lost ({lost['cause']}) before any "
            f"step was committed, and rank {slot} ({process}) then failed in its set-up "
            f"({cause}), most likely because of that loss (set-up code of the script's own that "
            "talks to its peers cannot be recovered); nothing was committed, so run the job again"
        )
    return (
        f"rank {slot} ({process}) failed in step {step} ({cause}) before any step was "
        "committed: a bug in the script, not a hardware failure (every rank would fail the "
        "same way), so the job stops without retrying"
    )


def step_in_flight(highest_committed: int, error_step: int | None = None) -> int:
    """The step a failure interrupted: the one an exception names, else last committed + 1."""
    return error_step if error_step is not None else highest_committed + 1


def finish_verdict(exits: dict[int, int | None]) -> tuple[str, int | None]:
    """Decide the end of a job whose slots have all finished their last step.

    ``exits`` maps each slot to its process's exit status (``None``: still running, doing its
    final work -- saving the model, cleaning up -- which is waited for). Returns
    ``("failed", slot)`` as soon as one exited non-zero, ``("succeeded", None)`` once every
    slot exited with 0, else ``("wait", None)``.
    """
    for slot, returncode in sorted(exits.items()):
        if returncode is not None and returncode != 0:
            return "failed", slot
    if all(returncode == 0 for returncode in exits.values()):
        return "succeeded", None
    return "wait", None


def after_loop_reason(slot: int, process: str, returncode: int) -> str:
    """Why the job failed although every slot finished its last step."""
    return (
        f"rank {slot} ({process}) failed after its last step ({describe_exit(returncode)}), in "
        "the script's final work after the training loop; the job did not complete"
    )


def missing_spares(needed: int, ready: int, starting: int, launching: int) -> bool:
    """True when a recovery needing ``needed`` spares can never get them: fewer are ready,
    starting (joined, still setting up) or launching (started, not yet joined) than needed.
    Nothing else ever starts a spare during a recovery, so waiting would be in vain."""
    return ready + starting + launching < needed


def no_spare_reason(
    causes: dict[int, str], step: int, spares: int, transparent: bool = False
) -> str:
    """Why a recovery of the slots in ``causes`` (slot -> cause) was given up in ``step``."""
    named = ", ".join(f"rank {slot}: {cause}" for slot, cause in sorted(causes.items()))
    lost = f"rank(s) {sorted(causes)} lost in step {step} ({named})"
    if transparent:  # it keeps no spare: a live replica is cloned (docs/transparent.md)
        return (
            f"{lost}; --transparent could not clone a live replica into their place (no "
            "survivor left, or the copy failed: see the ledger's copy_failed)"
        )
    return (
        f"{lost} and no spare can replace them: none is ready, starting or being launched "
        f"(--spares {spares}), so none will come; run with --spares 1 or more"
    )


def recovery_deadline(halt_timeout: float, hang_timeout: float) -> float:
    """Seconds a published plan gets until every member has committed its first step.

    A plan is a rendezvous, a state transfer and one step. The first two are bounded like the
    survivors' halt (``--halt-timeout``: as long as stopping a step may take, which also covers
    moving the state at the speeds torchrelay reaches), the step like any other step (the hang
    timeout, ``max(--hang-floor, 10 x median step time)``). Past that the plan is abandoned:
    aborted and planned again, at most ``--max-restarts`` times in a row.
    """
    return halt_timeout + hang_timeout


def overdue_reason(
    generation: int,
    deadline: float,
    assignments: dict[int, str],
    phases: dict[str, set[int]],
) -> str:
    """The one-line reason for abandoning the plan of ``generation`` after ``deadline`` s.

    ``phases`` maps ``comm_ready``/``transfer_done``/``first_step`` to the slots that reported
    it; the reason names, for each slot short of its first step, the first phase it missed.
    """
    order = ("comm_ready", "transfer_done", "first_step")
    stuck = []
    for slot, process in sorted(assignments.items()):
        missed = next((p for p in order if slot not in phases.get(p, set())), None)
        if missed is not None:
            stuck.append(f"rank {slot} ({process}) never reported {missed}")
    return (
        f"the recovery into generation {generation} did not finish within {deadline:.0f} s: "
        + "; ".join(stuck or ["no member reported its first step"])
    )


def survivor_gaps(
    last_commits: dict[int, float | None], first_commits: dict[int, float]
) -> dict[int, float]:
    """Each survivor's stall as it saw it: from its last commit before the failure to its first
    commit after the recovery (seconds, its own clock at both ends). Slots without both times
    (a replacement, which committed nothing before) are left out."""
    return {
        slot: first_commits[slot] - last
        for slot, last in sorted(last_commits.items())
        if last is not None and slot in first_commits
    }
