"""The controller's side of device health: readings in, handovers and quarantine out.

Node agents poll their health sources (:mod:`torchrelay.health.poller`) and send each poll's
readings (``HealthReport``). :class:`HealthIntake` keeps the judge's state (hysteresis and rate
limit, :func:`torchrelay.health.judge.judge`) and turns its advice into a planned handover of the
slot on the device (:func:`torchrelay.control.handover.request`) and a quarantine of the device.

Failure behaviour: a malformed reading refuses the whole report (``ProtocolError``, one line);
advice for a device that runs no slot (an idle spare's) only quarantines it; a handover that
cannot be asked for (no replica would stay) is recorded as abandoned. The judge's state is not
part of the durable state: a controller that takes over starts its hysteresis afresh.
"""

from __future__ import annotations

from typing import Any

from torchrelay import events
from torchrelay.control import handover
from torchrelay.control.actions import Action, QuarantineDevice, Record
from torchrelay.control.errors import ProtocolError
from torchrelay.control.state import JobState
from torchrelay.health.judge import HealthJudge, MigrationAdvice, finished, judge
from torchrelay.health.policy import HealthPolicy
from torchrelay.health.readings import Reading, ReadingError


class HealthIntake:
    """Readings -> advice -> actions, for one job."""

    def __init__(self, policy: HealthPolicy, world_size: int) -> None:
        self.judge = HealthJudge(policy, world_size)

    def readings(
        self, job: JobState, node: str, wire: tuple[dict[str, Any], ...], now: float
    ) -> list[Action]:
        """One poll of ``node``'s readings; the actions its advice calls for."""
        try:
            readings = [Reading.from_wire(r) for r in wire]
        except ReadingError as exc:
            raise ProtocolError(f"health report of {node}: {exc}") from None
        others = sorted({r.node for r in readings} - {node})
        if others:
            raise ProtocolError(f"health report of {node} names another node: {others[0]}")
        self.judge, advice = judge(self.judge, readings, now)
        actions: list[Action] = []
        for one in advice:
            actions += self._act(job, one, now)
            # Counted against the rate limit already; the handover's own progress is the
            # controller's, so the judge does not hold a place for it.
            self.judge = finished(self.judge, one.node, one.device)
        return actions

    def _act(self, job: JobState, advice: MigrationAdvice, now: float) -> list[Action]:
        reason = f"{advice.reason} on {advice.node} device {advice.device}"
        actions: list[Action] = [QuarantineDevice(advice.node, advice.device, reason)]
        slot = advice.slot
        if slot is None and advice.process in job.members:
            slot = job.members[advice.process].slot
        if slot is None or slot not in job.assignments:
            return actions  # an idle spare's device: kept out of use, nothing to move
        trigger = advice.trigger.to_wire()
        try:
            actions += handover.request(job, [slot], reason, advice.since, now, trigger=trigger)
        except ProtocolError as exc:
            gave_up = events.HandoverAbandoned(slots=(slot,), reason=str(exc))
            actions.append(Record(gave_up))
        return actions
