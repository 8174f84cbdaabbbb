"""An operator's requests to a running job (``torchrelay chaos``): drills, drains and
releases, each carried out as one transition of the controller (its mixin, as
:class:`~torchrelay.control.pool_side.PoolSide` is). A request that cannot be honoured raises
:class:`~torchrelay.control.errors.ProtocolError` with one line, and changes nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torchrelay.config import JobConfig
from torchrelay.control import drills, elastic, handover
from torchrelay.control.actions import Action
from torchrelay.control.errors import ProtocolError
from torchrelay.control.state import JobState


class OperatorSide:
    """Controller mixin: the operator's entry points (each one transition)."""

    job: JobState
    config: JobConfig
    _transition: Callable[..., Any]
    _apply: Callable[[list[Action]], None]
    _cond: Any

    def inject(self, fault: str, target: str, seconds: float = 0.0) -> dict[str, Any]:
        """An operator's drill (``torchrelay chaos``), carried out by the target's node agent.

        ``kill`` and ``hang`` send SIGKILL / SIGSTOP to the process ``target``; ``partition``
        and ``kill-node`` act on the node ``target`` (see :mod:`torchrelay.control.drills`).
        A node drill returns once the node's agent said what it does, or after 10 s.
        ``shrink`` releases the slot of process ``target`` (:meth:`release`); ``add-spare``
        starts a spare (an --elastic job's hosted slot regrows onto it once it is ready).
        """
        if fault == "shrink":
            with self._cond:
                slots = [m.slot for m in self.job.slot_members() if m.process == target]
            if not slots or slots[0] is None:
                raise ProtocolError(f"{target} holds no slot of its own to release")
            return self.release(slots[0])
        with self._transition():
            if fault == "drain":
                return self._drain(target)
            if fault == "add-spare":
                actions, in_sight = elastic.add_spare(self.job)
                self._apply(actions)
                return {"spares_in_sight": in_sight, "hosted": sorted(self.job.hosted)}
            if fault in drills.PROCESS_FAULTS:
                self._apply(drills.inject_process(self.job, fault, target))
                member = self.job.members[target]
                return {"process": target, "node": member.node, "pid": member.pid}
            self._apply(drills.inject_node(self.job, fault, target, seconds))
            entry = self.job.nodes[target]
            self._cond.wait_for(lambda: entry.chaos_notice is not None, timeout=10.0)
            return {
                "node": target,
                "fault": fault,
                "node_timeout": self.config.node_timeout,
                "notice": entry.chaos_notice,
            }

    def _drain(self, target: str) -> dict[str, Any]:
        """Hand the slot of process ``target``, or every slot of node ``target``, to spares
        at a step boundary, or in a --transparent job move its worker into a CRIU copy (see
        :mod:`torchrelay.control.handover`)."""
        job, now = self.job, time.time()
        slots = [m.slot for m in job.slot_members() if target in (m.node, m.process)]
        if not slots:
            raise ProtocolError(f"{target} holds no slot (processes and nodes can be drained)")
        reason = f"drain of {target} asked by an operator"
        self._apply(handover.request(job, slots, reason, now, now))  # type: ignore[arg-type]
        return {"drain": target, "slots": slots}

    def release(self, slot: int) -> dict[str, Any]:
        """Give ``slot``'s process up at the next step boundary, a survivor hosting the slot
        (an --elastic job; what a pool asks of a lender, see :mod:`torchrelay.control.elastic`).
        :class:`ProtocolError` (one line) if refused."""
        with self._transition():
            self._apply(elastic.release(self.job, self.config, slot, time.time()))
            return {"shrink": slot, "process": self.job.assignments[slot]}
