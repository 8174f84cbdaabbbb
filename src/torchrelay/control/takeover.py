"""A standby takes over a running job: the transition from the durable state to a live one.

The durable state (:func:`torchrelay.control.persistence.durable_view`) is what the lost
leader had decided and written before acting. :func:`take_over` makes it the new leader's:

- what is re-learnt from heartbeats starts afresh at ``now`` (liveness timestamps, the hang
  timeout), so nobody is declared silent for the time no leader listened -- a process's own
  lease, counted from its last acknowledged heartbeat, always runs out first;
- the lost leader's node is lost with it (its launcher was that node's agent, and every process
  it started dies with it): its processes fail, as in any node loss;
- a recovery in flight starts over: its plan, if published, was to meet in the lost leader's
  rendezvous store, which died with it, so it is made again to meet in the new leader's
  ``store``. Survivors that had halted are asked again (a halted report carries the step
  they committed, which the durable state does not keep); they report again on reaching the
  new leader (see :mod:`torchrelay.runtime.control_link`);
- spares on their way from the lost leader's commands are forgotten (a command queued for a
  node agent died with the leader; a spare that does come is just one more spare).

Pure: it changes ``job`` in place and returns the actions, as every transition does.
"""

from __future__ import annotations

from torchrelay import events
from torchrelay.config import JobConfig
from torchrelay.control.actions import Action, Record, StartRecovery
from torchrelay.control.departures import OutputTail, node_lost
from torchrelay.control.state import JobState, MemberState, NodeEntry, RecoveryStep, move

REPLAN_REASON = "the controller was lost during the recovery: planned again by its successor"


def take_over(
    job: JobState,
    config: JobConfig,
    leader: str,
    term: int,
    control: str,
    store: str,
    now: float,
    output_tail: OutputTail,
) -> list[Action]:
    """Make ``job`` (restored from the durable state) the state of the leader ``leader``,
    whose term is ``term``, serving ``control`` and the rendezvous store ``store``."""
    previous = job.leader_node
    job.leader_node, job.local_node, job.store = leader, None, store
    job.hang_timeout = config.hang_floor
    job.spares_launching = {}
    for member in job.members.values():
        member.last_seen, member.step_age, member.waiting = now, None, None
        if member.state is MemberState.HALTED:
            move(member, MemberState.ACTIVE)  # to halt again, naming its committed step
    for entry in job.nodes.values():
        entry.last_seen = now
    actions: list[Action] = [
        Record(
            events.ControllerTakeover(
                leader=leader,
                previous=previous,
                term=term,
                generation=job.generation,
                committed=job.highest_committed,
                control=control,
                store=store,
            )
        )
    ]
    # The first leader's node was its own, not in the registry of remote nodes.
    job.nodes.setdefault(previous, NodeEntry(previous, last_seen=now))
    reason = "it hosted the controller, which was lost"
    actions += node_lost(job, config, previous, reason, now, output_tail)
    current = job.recovery.current
    if current is not None and current.step is RecoveryStep.DONE:
        job.recovery.replan = REPLAN_REASON
    if job.recovery.pending or current is not None:
        actions.append(StartRecovery())
    return actions
