"""Planned handovers, as pure transitions: request, boundary, plan, retire, done; and the
ways they give up or yield to a failure."""

from __future__ import annotations

import dataclasses

import pytest

from tests.fsm import Driver
from torchrelay.control import handover, liveness, membership
from torchrelay.control.actions import QuarantineDevice
from torchrelay.control.claims import OPEN_ENDED
from torchrelay.control.errors import ProtocolError
from torchrelay.control.health_intake import HealthIntake
from torchrelay.control.protocol import JoinRequest
from torchrelay.control.state import MemberState
from torchrelay.health.policy import HealthPolicy

LONG = 100


def started(tmp_path, spare: bool = True, step_seconds: float = 0.05) -> Driver:
    """Two workers at step 10 of a 100-step job, timed; a ready spare if ``spare``."""
    driver = Driver(tmp_path, spares=1 if spare else 0)
    for slot in (0, 1):
        driver.join(f"worker{slot}", slot=slot)
        driver.report(f"worker{slot}", "max_steps", max_steps=LONG)
        driver.report(f"worker{slot}", "progress", step=10, step_seconds=step_seconds)
    if spare:
        driver.join("spare0", role="spare")
        driver.report("spare0", "ready")
    return driver


def drain(driver: Driver, slots: list[int]) -> float | None:
    driver.take(handover.request(driver.job, slots, "drain", driver.now, driver.now))
    return driver.advance()


def test_a_handover_halts_every_rank_at_one_boundary_and_retires_the_old_process(tmp_path):
    driver = started(tmp_path)
    wake = drain(driver, [1])
    # 0.75 s of 50 ms steps past the last report, and two more: step 10 + 17.
    told = {"type": "handover", "generation": 0, "step": 27}
    assert driver.sent("worker0") == [told] and driver.sent("worker1") == [told]
    assert wake == driver.now + driver.job.hang_timeout
    (start,) = driver.events("handover_start")
    assert start["boundary"] == 27 and start["slots"] == [1]

    driver.now += 1
    driver.report("worker0", "halted", committed=27)
    assert driver.advance() is not None and not driver.events("recovery_planned")
    driver.report("worker1", "halted", committed=27)
    driver.advance()
    (planned,) = driver.events("recovery_planned")
    assert planned["target_step"] == 27 and planned["replaced"] == {"1": "spare0"}
    assert planned["sources"] == [0] and planned["receivers"] == [1]
    assert driver.sent("worker1")[-1] == {"type": "retire"}
    assert driver.job.members["worker1"].state is MemberState.RETIRED

    driver.now += 1
    for process in ("worker0", "spare0"):
        driver.report(process, "progress", step=28, first_after_recovery=True, t=driver.now)
    assert driver.advance() is None
    (done,) = driver.events("handover_done")
    assert done["retired"] == ["worker1"] and done["replaced"] == {"1": "spare0"}
    assert done["recomputed_steps"] == 0 and done["lost_steps"] == 0
    assert done["lead_seconds"] == 2.0 and done["stall_seconds"] == 1.0
    # The retired process leaves with status 0: no failure, nothing to recover.
    driver.exit("worker1", 0)
    assert not driver.events("failure") and driver.job.recovery.current is None


def test_a_rank_told_too_late_is_aborted_and_its_step_in_flight_counted(tmp_path):
    driver = started(tmp_path)
    drain(driver, [1])
    driver.report("worker1", "halted", committed=27)
    driver.now += driver.job.hang_timeout
    driver.advance()  # worker0 passed the boundary and waits in step 28's collective
    assert driver.sent("worker0")[-1] == {"type": "abort", "generation": 0}
    driver.report("worker0", "halted", committed=27, in_flight=28)
    driver.advance()
    driver.now += 1
    for process in ("worker0", "spare0"):
        driver.report(process, "progress", step=28, first_after_recovery=True, t=driver.now)
    driver.advance()
    (done,) = driver.events("handover_done")
    assert done["recomputed_steps"] == 1


def test_a_rank_that_says_it_was_told_too_late_is_aborted_at_once(tmp_path):
    driver = started(tmp_path)
    drain(driver, [1])
    driver.report("worker0", "told_late", step=27)  # committed 27, then heard: inside 28
    assert driver.advance() is not None and driver.sent("worker0")[-1]["type"] == "handover"
    (late,) = driver.events("handover_late")
    assert (late["process"], late["slot"], late["step"]) == ("worker0", 0, 27)
    driver.report("worker1", "halted", committed=27)  # its peer halted: 28 never completes
    driver.advance()  # no hang timeout passed
    assert driver.sent("worker0")[-1] == {"type": "abort", "generation": 0}
    assert driver.sent("worker1")[-1]["type"] == "handover"  # the halted rank is left be
    driver.report("worker0", "halted", committed=27, in_flight=28)
    driver.advance()
    (planned,) = driver.events("recovery_planned")
    assert planned["target_step"] == 27


def test_ranks_all_told_too_late_halt_together_at_their_next_step(tmp_path):
    driver = started(tmp_path)
    drain(driver, [1])
    for process in ("worker0", "worker1"):
        driver.report(process, "told_late", step=27)
    driver.report("worker1", "halted", committed=28)  # they committed 28 together
    driver.advance()
    assert driver.sent("worker0")[-1]["type"] == "handover"  # not stuck: no abort
    driver.report("worker0", "halted", committed=28)
    driver.advance()
    (planned,) = driver.events("recovery_planned")
    assert planned["target_step"] == 28


def test_a_claim_of_lateness_before_the_boundary_changes_nothing(tmp_path):
    driver = started(tmp_path)
    drain(driver, [1])
    driver.report("worker0", "told_late", step=20)  # the boundary is 27: it is not late
    driver.report("worker1", "halted", committed=27)
    driver.advance()
    assert driver.sent("worker0")[-1]["type"] == "handover" and not driver.events("handover_late")


def test_a_failure_during_the_handover_goes_first_and_the_handover_is_asked_again(tmp_path):
    driver = started(tmp_path)
    drain(driver, [1])
    driver.exit("worker0", -9)
    driver.advance()
    current = driver.job.recovery.current
    assert current.handover is None and current.slots == [0]  # the crash path, for slot 0
    assert driver.job.recovery.handovers[1]["process"] == "worker1"


def test_a_handover_gives_up_without_a_spare_or_before_the_end(tmp_path):
    driver = started(tmp_path, spare=False)
    assert drain(driver, [1]) is None
    (gave_up,) = driver.events("handover_abandoned")
    assert "no spare" in gave_up["reason"] and not driver.events("handover_start")

    late = started(tmp_path / "late", step_seconds=0.005)  # 0.75 s is 150 steps: past 100
    drain(late, [0])
    (gave_up,) = late.events("handover_abandoned")
    assert "ends before" in gave_up["reason"]
    assert late.job.recovery.current is None


def test_a_handover_is_refused_for_every_slot_or_a_slot_that_is_gone(tmp_path):
    driver = started(tmp_path)
    with pytest.raises(ProtocolError, match="replica that stays"):
        handover.request(driver.job, [0, 1], "drain", driver.now, driver.now)
    with pytest.raises(ProtocolError, match="slot 5"):
        handover.request(driver.job, [5], "drain", driver.now, driver.now)
    assert not driver.events("handover_requested") and not driver.job.recovery.handovers


def test_a_hot_gpu_read_three_polls_in_a_row_asks_for_its_slot_to_be_handed_over(tmp_path):
    driver = started(tmp_path)
    intake = HealthIntake(HealthPolicy(), world_size=2)
    hot = {"node": "node0", "device": 1, "source": "nvml", "process": "worker1"}
    for poll in range(3):
        reading = {**hot, "t": driver.now + poll, "temperature_c": 97.0}
        actions = driver.take(intake.readings(driver.job, "node0", (reading,), driver.now + poll))
        assert bool(actions) == (poll == 2)  # hysteresis: the third hot poll in a row
    assert QuarantineDevice("node0", 1, "temperature 97 C >= 90 C on node0 device 1") in actions
    (asked,) = driver.events("handover_requested")
    assert asked["slots"] == [1] and asked["since"] == driver.now  # the first hot poll
    assert asked["trigger"]["temperature_c"] == 97.0
    with pytest.raises(ProtocolError, match="node1"):
        intake.readings(driver.job, "node0", ({**hot, "node": "node1", "t": 1.0},), driver.now)


def test_a_rank_that_stays_a_straggler_is_handed_over_when_the_policy_says_so(tmp_path):
    driver = started(tmp_path)
    driver.config = dataclasses.replace(driver.config, drain_stragglers=3)
    driver.report("worker1", "progress", step=11, compute_seconds=0.5)
    driver.report("worker0", "progress", step=11, compute_seconds=0.1)
    for _ in range(3):
        assert not driver.events("handover_requested")
        driver.take(liveness.tick(driver.job, driver.config, driver.now, driver.tails.get))
    (asked,) = driver.events("handover_requested")
    assert asked["slots"] == [1] and "straggler: 5.0x" in asked["reason"]
    assert len(driver.events("straggler")) == 1


def test_a_worker_killed_on_a_device_quarantines_it_and_an_exception_does_not(tmp_path):
    driver = Driver(tmp_path, nproc_per_node=3)
    for slot in (0, 1, 2):
        request = JoinRequest(role="worker", pid=1, node="node0", slot=slot, device=slot)
        driver.take(membership.join(driver.job, driver.config, f"worker{slot}", request, 1.0))
        driver.report(f"worker{slot}", "max_steps", max_steps=LONG)
        driver.report(f"worker{slot}", "progress", step=3)
    killed = driver.exit("worker1", -9)
    assert QuarantineDevice("node0", 1, "worker1 died on it (cause)") in killed
    crashed = driver.exit("worker2", 1)  # the script's own error: says nothing of the GPU
    assert not [a for a in crashed if isinstance(a, QuarantineDevice)]


def test_a_handover_whose_boundary_the_training_never_reaches_is_abandoned_at_its_end(tmp_path):
    """A --transparent job's length is its script's: the controller cannot refuse a boundary
    past it. The ranks report their training done before the boundary; the handover is given
    up and the job ends, instead of waiting for a step that never comes."""
    driver = Driver(tmp_path, spares=1)
    for slot in (0, 1):
        driver.join(f"worker{slot}", slot=slot)
        driver.report(f"worker{slot}", "max_steps", max_steps=OPEN_ENDED)  # as transparent
        driver.report(f"worker{slot}", "progress", step=10, step_seconds=0.05)
    driver.join("spare0", role="spare")
    driver.report("spare0", "ready")
    drain(driver, [1])
    (start,) = driver.events("handover_start")
    assert start["boundary"] == 27
    driver.report("worker0", "done", step=20)
    assert driver.advance() is None
    (gave_up,) = driver.events("handover_abandoned")
    assert gave_up["reason"] == (
        "the training ended at step 20, before the handover's boundary (step 27)"
    )
    assert driver.job.recovery.current is None and driver.outcome() is None
    driver.report("worker1", "done", step=20)
    assert {"type": "finish"} in driver.sent("worker0") and not driver.events("recovery_planned")
