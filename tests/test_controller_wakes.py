"""Which transitions wake the controller's waiters (the coordinator, the monitor, the
launcher's wait for the end): every one but a heartbeat that decided nothing
(:func:`torchrelay.control.membership.wakes`)."""

from __future__ import annotations

import threading

from torchrelay.config import JobConfig
from torchrelay.control import membership
from torchrelay.control.actions import Record
from torchrelay.control.controller import Controller
from torchrelay.control.protocol import Halted, JoinRequest, MaxSteps, Progress, Ready
from torchrelay.events import SpareReady
from torchrelay.ledger import Ledger


class CountingCondition(threading.Condition):
    def __init__(self) -> None:
        super().__init__()
        self.wakes = 0

    def notify_all(self) -> None:
        self.wakes += 1
        super().notify_all()


class FakeAgent:
    def start_spare(self) -> None:
        pass

    def kill(self, process: str, signum: int = 9, stacks: bool = False) -> None:
        pass


def test_a_heartbeat_that_decides_nothing_wakes_no_waiter():
    beat = Progress(generation=0, step=4, step_age=0.01)
    first = Progress(generation=1, step=5, first_after_recovery=True, t=1.0)
    assert not membership.wakes(beat, [])
    assert membership.wakes(beat, [Record(SpareReady(process="spare0"))])
    assert membership.wakes(first, [])
    assert membership.wakes(Halted(generation=0, committed=4, in_flight=5), [])
    assert membership.wakes(Ready(), [])


def test_the_controller_wakes_its_waiters_on_a_halt_not_on_heartbeats(tmp_path):
    config = JobConfig(
        script="train.py", script_args=[], nproc_per_node=2, run_dir=tmp_path, spares=1
    )
    ledger = Ledger(tmp_path / "ledger.jsonl")
    controller = Controller(config, ledger, FakeAgent())
    cond = controller._cond = CountingCondition()
    try:
        for slot in (0, 1):
            controller.join(
                f"worker{slot}", JoinRequest(role="worker", pid=1, node="node0", slot=slot)
            )
        controller.join("spare0", JoinRequest(role="spare", pid=1, node="node0"))
        controller.report("spare0", Ready())
        for worker in ("worker0", "worker1"):
            controller.report(worker, MaxSteps(generation=0, max_steps=10))
            controller.report(worker, Progress(generation=0, step=3))
        woken = cond.wakes
        for step in (3, 3, 3):  # heartbeats of a step already committed
            assert controller.report("worker0", Progress(generation=0, step=step)) is not None
        assert cond.wakes == woken
        controller.on_exit("worker1", -9)
        assert cond.wakes > woken
        woken = cond.wakes
        controller.report("worker0", Halted(generation=0, committed=3, in_flight=4))
        assert cond.wakes > woken
        assert controller.wait_until(lambda: controller.generation == 1, timeout=30)
    finally:
        controller.stop("test over")
        ledger.close()
