"""The controller's durable state: written ahead of every decision it acts on, under its lead.

With ``--state etcd://...`` the controller holds the job's lead (an etcd lease, see
:mod:`torchrelay.control.store.election`) and, before the executor carries out the actions of a
transition, writes the job's durable state with a compare-and-swap fenced by that lead. So a
decision is acted on only once it is recorded, and a controller that lost its lead (its lease
ran out: it was paused, cut off, or etcd went away) can write nothing and therefore act on
nothing: two controllers never both act.

What is written is :meth:`JobState.to_dict` without what changes on every heartbeat and is
re-learnt within a heartbeat by whoever leads (liveness timestamps, step timings, per-channel
step claims, each member's last reported step; ``highest_committed`` stays). A transition that
changed none of the rest writes nothing, so steady training costs one write per committed step;
a heartbeat, a report of a recovery's progress that acts on nothing (:func:`relearnt`), and a
recovery or monitor round that acts on nothing are not even compared.

Failure behaviour: :meth:`StatePersister.save` raises :class:`StoreError` (one line) when the
store does not answer, when the lead was lost, or when someone else wrote the state; the
controller then ends the job without acting on the unwritten decision.

With the default ``--state memory`` nothing is persisted: the state already lives in the only
process that could use it.
"""

from __future__ import annotations

import json
from typing import Any

from torchrelay.control import endpoint
from torchrelay.control.endpoint import Endpoint
from torchrelay.control.protocol import (
    Halted,
    NodeHeartbeat,
    NodeReport,
    PhaseDone,
    Progress,
    Report,
)
from torchrelay.control.state import ENDED, JobPhase, JobState
from torchrelay.control.store import (
    Leadership,
    Revision,
    SealedStore,
    StateBackend,
    StoreError,
    StoreKind,
    StoreSpec,
    open_backend,
)

LEASE_SECONDS = 5
"""The controller's lease on its lead: a paused or cut-off controller stops acting within it
(etcd 3.4 grants leases of 2 s and more by default)."""

# Member fields re-learnt from the next heartbeat or halted report; writing them would cost a
# store round trip per heartbeat.
VOLATILE_MEMBER_FIELDS = (
    "last_seen",
    "timings",
    "step_age",
    "waiting",
    "busy",
    "committed",
    "claims",
    "last_commit_t",
)
VOLATILE_JOB_FIELDS = ("hang_timeout", "straggler_rounds")


def durable_view(job: JobState) -> dict[str, Any]:
    """The part of ``job`` a controller taking over needs (see the module doc)."""
    data = job.to_dict()
    for field in VOLATILE_JOB_FIELDS:
        data.pop(field, None)
    for member in data["members"].values():
        for field in VOLATILE_MEMBER_FIELDS:
            member.pop(field, None)
    for node in data["nodes"].values():
        node.pop("last_seen", None)
    return data


def relearnt(job: JobState, message: Report | NodeReport) -> bool:
    """Whether handling ``message`` (not yet handled) changes only what a leader learns again,
    so that a transition that then acts on nothing needs no write (the next one that acts
    writes the whole state, this change included):

    - what :func:`durable_view` leaves out: a node's heartbeat, or a process's progress report
      of a step the job has committed already;
    - the progress of the recovery in flight: a survivor's halt or a phase done. A new leader
      asks the survivors to halt again and plans anew (:mod:`torchrelay.control.takeover`).

    Building the view to compare costs O(members), 84 ms with its JSON at 16,384 of them,
    under the controller's lock; every process heartbeats twice a second and reports 4 times
    per recovery."""
    if isinstance(message, NodeHeartbeat | Halted | PhaseDone):
        return True
    return isinstance(message, Progress) and message.step <= job.highest_committed


def restore(data: dict[str, Any], hang_timeout: float, now: float) -> JobState:
    """The :class:`JobState` of a durable view, what is re-learnt from heartbeats starting
    afresh at ``now`` (see :mod:`torchrelay.control.takeover` for the rest)."""
    data = {**data, "hang_timeout": hang_timeout}
    data["members"] = {p: {**m, "last_seen": now} for p, m in data["members"].items()}
    data["nodes"] = {n: {**e, "last_seen": now} for n, e in data["nodes"].items()}
    return JobState.from_dict(data)


class StatePersister:
    """Compare-and-swap writes of one job's durable state, fenced by ``leadership``."""

    def __init__(self, store: SealedStore, leadership: Leadership) -> None:
        self._store = store
        self._leadership = leadership
        self._revision: Revision = 0
        self._written: bytes | None = None

    @property
    def where(self) -> str:
        return self._store.backend.where

    @property
    def lead_lost(self) -> bool:
        """Whether this controller may no longer be the leader (its lease may have run out)."""
        return not self._leadership.is_leader()

    def close(self) -> None:
        """Give up the lead (the job ended) and release the connection."""
        try:
            self._leadership.resign()
        finally:
            self._store.backend.close()

    def claim(self) -> None:
        """Take the store's state slot for a new job: empty, or left by a job that ended.

        Raises :class:`StoreError` if it holds a running job's state (another launcher uses
        this key prefix) or a state this job's token cannot authenticate.
        """
        current, revision = self._store.get_state()
        if current is not None:
            previous = json.loads(current)
            if previous.get("phase") in (JobPhase.RUNNING.value, JobPhase.FINISHING.value):
                raise StoreError(
                    f"{self.where} holds the state of a running job (generation "
                    f"{previous.get('generation')}); give this job its own key prefix"
                )
        self._revision = revision

    def resume(self) -> dict[str, Any] | None:
        """Carry on from the stored state (a standby that won the lead): its durable view, or
        ``None`` when there is no running job to take over (none stored, or it ended)."""
        current, self._revision = self._store.get_state()
        self._written = None
        if current is None:
            return None
        data: dict[str, Any] = json.loads(current)
        return None if JobPhase(data["phase"]) in ENDED else data

    def publish(self, where: Endpoint) -> None:
        """Tell every process where this leader serves (see :mod:`torchrelay.control.endpoint`).

        Raises :class:`StoreError` if the lead is lost or the store does not answer."""
        endpoint.publish(self._store.backend, self._store.token, where, self._leadership)

    @property
    def term(self) -> int:
        return self._leadership.revision

    def save(self, job: JobState) -> None:
        """Write ``job``'s durable state if it changed since the last write.

        Raises :class:`StoreError` (nothing written) if the lead is lost, the store does not
        answer, or another writer got in between.
        """
        data = json.dumps(durable_view(job), sort_keys=True, separators=(",", ":")).encode()
        if data == self._written:
            return
        if not self._leadership.is_leader():
            raise StoreError(f"this controller lost its lead on {self.where}")
        _, revision, written = self._store.set_state(data, self._revision, self._leadership)
        if not written:
            raise StoreError(
                f"another controller wrote the job state in {self.where} (revision {revision})"
            )
        self._revision, self._written = revision, data


def take_lead(spec: StoreSpec, token: str, candidate: str) -> StatePersister | None:
    """Lead the job in ``spec``'s store and claim its state slot; ``None`` for ``memory``.

    Waits up to two lease lengths for the lead (a crashed earlier launcher's lease runs out
    by then). Raises :class:`StoreError` (one line) if the store does not answer, another
    controller keeps the lead, or the slot holds a running job's state.
    """
    if spec.kind is StoreKind.MEMORY:
        return None
    return lead(open_backend(spec), token, candidate)


def lead(backend: StateBackend, token: str, candidate: str) -> StatePersister:
    """Lead the job in ``backend`` and claim its state slot (see :func:`take_lead`); on any
    :class:`StoreError` the backend is given back (lead resigned, connection closed)."""
    try:
        leadership = backend.campaign(candidate, LEASE_SECONDS, timeout=2.0 * LEASE_SECONDS)
    except StoreError:
        backend.close()
        raise
    persister = StatePersister(SealedStore(backend, token), leadership)
    try:
        persister.claim()
    except StoreError:
        persister.close()
        raise
    return persister
