"""Drive the controller's pure transitions by hand: no threads, no sockets, no processes.

:class:`Driver` keeps a :class:`JobState` and the actions every transition returned, with the
clock as a plain number that the test moves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchrelay.config import JobConfig
from torchrelay.control import departures, membership, recovery_steps
from torchrelay.control.actions import Action, EndJob, Record, Send
from torchrelay.control.controller import Controller
from torchrelay.control.protocol import JoinRequest, decode_report
from torchrelay.control.state import JobState

MAX_STEPS = 5


class Driver:
    def __init__(self, run_dir: Path, **options: Any) -> None:
        self.config = JobConfig(
            script="train.py",
            script_args=[],
            run_dir=run_dir,
            **{
                "nproc_per_node": 2,
                "spares": 1,
                "spare_timeout": 60,
                "halt_timeout": 60,
                **options,
            },
        )
        self.job = JobState(
            local_node="node0",
            hang_timeout=self.config.hang_floor,
            spares_launching={"node0": self.config.spares},
        )
        self.now = 1000.0
        self.actions: list[Action] = []
        self.tails: dict[str, str] = {}

    def take(self, actions: list[Action]) -> list[Action]:
        self.actions += actions
        return actions

    def join(
        self, process: str, role: str = "worker", slot: int | None = None, node: str = "node0"
    ) -> None:
        request = JoinRequest(role=role, pid=1, node=node, slot=slot)
        self.take(membership.join(self.job, self.config, process, request, self.now))

    def report(self, process: str, kind: str, **body: Any) -> list[Action]:
        """A report as the server hands it over: decoded from its wire body."""
        body.setdefault("generation", self.job.members[process].generation)
        message = decode_report({"kind": kind, **body})
        return self.take(membership.report(self.job, process, message, self.now))

    def exit(self, process: str, returncode: int) -> list[Action]:
        actions = departures.on_exit(
            self.job, self.config, process, returncode, "cause", self.now, self.tails.get
        )
        return self.take(actions)

    def advance(self) -> float | None:
        actions, wake = recovery_steps.advance(self.job, self.config, self.now)
        self.take(actions)
        return wake

    def start(self, steps: int = 2, spare: bool = True) -> None:
        """Two workers that committed up to ``steps`` and, if ``spare``, a ready spare."""
        for slot in (0, 1):
            self.join(f"worker{slot}", slot=slot)
            self.report(f"worker{slot}", "max_steps", max_steps=MAX_STEPS)
            self.report(f"worker{slot}", "progress", step=steps)
        if spare:
            self.join("spare0", role="spare")
            self.report("spare0", "ready")

    def events(self, name: str) -> list[dict[str, Any]]:
        """The fields of every ``name`` event recorded (with ``t`` where the event set one)."""
        return [fields(a) for a in self.actions if isinstance(a, Record) and name == a.event.TAG]

    def sent(self, process: str) -> list[dict[str, Any]]:
        """What went on ``process``'s watch stream, as on the wire."""
        return [
            a.message.to_wire()
            for a in self.actions
            if isinstance(a, Send) and a.process == process
        ]

    def outcome(self) -> dict[str, Any] | None:
        ends = [a.outcome for a in self.actions if isinstance(a, EndJob)]
        assert len(ends) <= 1, "the job ended twice"
        return ends[0] if ends else None


def fields(record: Record) -> dict[str, Any]:
    """A recorded event's fields as its ledger line has them, less ``event`` (and ``t`` when
    the line gets the time of writing)."""
    line = record.event.to_plain()
    del line["event"]
    if line["t"] is None:
        del line["t"]
    return line


def report_to(controller: Controller, process: str, kind: str, body: dict[str, Any]) -> None:
    """Hand ``controller`` a report as its server would: decoded from the wire body."""
    controller.report(process, decode_report({"kind": kind, **body}))


def join_to(
    controller: Controller, process: str, role: str, pid: int, node: str, slot: int | None
) -> None:
    controller.join(process, JoinRequest(role=role, pid=pid, node=node, slot=slot))
