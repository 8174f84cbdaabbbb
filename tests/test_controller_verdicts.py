"""The controller's endings, driven by hand (no processes, no sockets): jobs that can never
work stop at once with the reason, success waits for clean exits, a recovery with no spare on
its way or one that overruns its deadline never waits in silence."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.fsm import join_to, report_to
from torchrelay.config import JobConfig
from torchrelay.control.controller import Controller
from torchrelay.exits import EXIT_COMMUNICATOR_STUCK
from torchrelay.ledger import Ledger, read_ledger


class FakeAgent:
    def __init__(self) -> None:
        self.spares_started = 0
        self.signalled: list[str] = []

    def start_spare(self) -> None:
        self.spares_started += 1

    def kill(self, process: str, signum: int = 9, stacks: bool = False) -> None:
        self.signalled.append(process)


@pytest.fixture
def make(tmp_path):
    built: list[Controller] = []

    def build(**overrides) -> Controller:
        options = {"spares": 1, "spare_timeout": 60, "halt_timeout": 60, **overrides}
        config = JobConfig(
            script="train.py", script_args=[], nproc_per_node=2, run_dir=tmp_path, **options
        )
        built.append(Controller(config, Ledger(tmp_path / "ledger.jsonl"), FakeAgent()))
        return built[-1]

    yield build
    for controller in built:
        controller.stop("test over")  # its recovery thread ends before the ledger closes
        controller.ledger.close()


def until(predicate: Callable[[], object], timeout: float = 60.0) -> None:
    """Wait for a state the controller reaches in its own threads (a safety net, no pacing)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the controller never got there"
        time.sleep(0.01)


def events(controller: Controller, name: str) -> list[dict]:
    return [e for e in read_ledger(controller.ledger.path) if e["event"] == name]


MAX_STEPS = 5  # every job here runs steps 0..4 (``done`` at 4)


def start(controller: Controller, steps: int = -1, spare: bool = True) -> None:
    """Two workers (and a ready spare) that committed up to ``steps``."""
    for slot in (0, 1):
        join_to(controller, f"worker{slot}", "worker", 100 + slot, "node0", slot)
        if steps >= 0:
            declared = {"generation": 0, "max_steps": max(MAX_STEPS, steps + 2)}
            report_to(controller, f"worker{slot}", "max_steps", declared)
            report_to(controller, f"worker{slot}", "progress", {"generation": 0, "step": steps})
    if spare:
        join_to(controller, "spare0", "spare", 200, "node0", None)
        report_to(controller, "spare0", "ready", {})


# ------------------------------------------------------------------ item 3: broken scripts
def test_a_worker_that_exits_before_joining_stops_the_job_with_its_traceback(make, tmp_path):
    controller = make()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "worker1.log").write_text(
        "starting\nTraceback (most recent call last):\n  File x\nImportError: no module foo\n"
    )
    join_to(controller, "worker0", "worker", 100, "node0", 0)
    controller.on_exit("worker1", 1)
    outcome = controller.outcome
    assert outcome is not None and outcome["status"] == "failed"
    reason = outcome["reason"]
    assert "rank 1 (worker1) failed (exit code 1) before calling torchrelay.init()" in reason
    assert outcome["traceback"].endswith("ImportError: no module foo")
    (failure,) = events(controller, "failure")
    assert failure["slot"] == 1 and failure["kind"] == "exception"


def test_a_bug_after_commits_no_heartbeat_reported_yet_is_retried_as_a_bug(make):
    # Failing in step 4 it had committed 3, though no heartbeat since step -1 said so: the
    # error report carries it, so the verdict is "a bug, retried up to --max-restarts", not
    # "a bug before any step was committed".
    controller = make(max_restarts=3)
    start(controller, steps=-1)
    for slot in (0, 1):
        declared = {"generation": 0, "max_steps": MAX_STEPS}
        report_to(controller, f"worker{slot}", "max_steps", declared)
    report_to(controller, "worker1", "error", {"step": 4, "traceback": "ValueError: step 4"})
    controller.on_exit("worker1", 1)
    until(lambda: events(controller, "recovery_start") != [])  # started by its own thread
    assert controller.outcome is None  # a recovery, not a stop
    assert controller.status()["steps_committed"] == 4


@pytest.mark.parametrize(
    ("returncode", "kind", "stops"),
    [(EXIT_COMMUNICATOR_STUCK, "communicator", False), (1, "exit", True)],
)
def test_a_stuck_communicator_is_not_counted_as_a_bug_in_the_script(make, returncode, kind, stops):
    # A worker that left because gloo never ended an aborted send (runtime/collective.py)
    # follows another loss: it is replaced even with no restart left; an exit of the script's
    # own is not.
    controller = make(max_restarts=0)
    start(controller, steps=3)
    controller.on_exit("worker1", returncode)
    if not stops:
        until(lambda: events(controller, "recovery_start") != [])
    assert (controller.outcome is not None) is stops
    [failure] = [e for e in events(controller, "failure") if e["slot"] == 1]
    assert failure["kind"] == kind


def test_a_worker_that_exits_zero_without_init_stops_the_job(make):
    controller = make()
    controller.on_exit("worker0", 0)
    assert controller.outcome is not None
    assert "without ever calling torchrelay.init()" in controller.outcome["reason"]


def test_a_script_bug_before_the_first_commit_is_not_retried(make):
    controller = make(max_restarts=3)
    start(controller)
    report_to(controller, "worker1", "error", {"step": 0, "traceback": "ValueError: bad shape"})
    controller.on_exit("worker1", 1)
    outcome = controller.outcome
    assert outcome is not None and outcome["status"] == "failed"
    assert outcome["reason"].startswith("rank 1 (worker1) failed in step 0 (exit code 1)")
    assert "failed 4 times" not in outcome["reason"] and outcome["traceback"].endswith("shape")
    assert controller.agent.spares_started == 0 and not events(controller, "recovery_start")


def test_a_spare_killed_before_joining_is_replaced(make):
    controller = make()
    start(controller, spare=False)
    controller.on_exit("spare0", -9)
    assert controller.outcome is None and controller.agent.spares_started == 1


# ------------------------------------------------------------------ item 5: after the loop
def done(controller: Controller, step: int) -> None:
    for slot in (0, 1):
        report_to(controller, f"worker{slot}", "done", {"generation": 0, "step": step})


def test_success_waits_for_every_slot_to_exit_zero(make):
    controller = make()
    start(controller, steps=3)
    done(controller, 4)
    assert controller.outcome is None and events(controller, "training_done")
    controller.on_exit("spare0", 0)
    controller.on_exit("worker1", 0)
    assert controller.outcome is None  # worker0 still saves its model
    controller.on_exit("worker0", 0)
    assert controller.outcome == {"status": "succeeded", "steps_committed": 5}


def test_a_failure_after_the_training_loop_fails_the_job(make):
    controller = make()
    start(controller, steps=3)
    done(controller, 4)
    controller.on_exit("worker1", 0)
    tb = "Traceback (most recent call last):\nOSError: disk full"
    report_to(controller, "worker0", "error", {"generation": 0, "step": None, "traceback": tb})
    controller.on_exit("worker0", 1)
    outcome = controller.outcome
    assert outcome is not None and outcome["status"] == "failed"
    assert "rank 0 (worker0) failed after its last step (exit code 1)" in outcome["reason"]
    assert outcome["traceback"] == tb


# ------------------------------------------------------------------ item 6: no spare
def test_no_spare_on_its_way_stops_at_once_naming_the_step_in_flight(make):
    controller = make(spares=0, spare_timeout=300)
    start(controller, steps=39, spare=False)
    controller.on_exit("worker1", -9)
    # The survivor was aborted; its halted report tells the exact last commit.
    until(lambda: "abort" in [m["type"] for m in controller.outbox("worker0").pending()])
    report_to(controller, "worker0", "halted", {"generation": 0, "committed": 39, "in_flight": 40})
    outcome = controller.wait_finished(timeout=30)
    assert outcome is not None and outcome["status"] == "failed"
    assert outcome["reason"].startswith("rank(s) [1] lost in step 40 (rank 1: SIGKILL)")
    assert "none will come" in outcome["reason"]
    (abandoned,) = events(controller, "recovery_abandoned")
    assert abandoned["step"] == 40 and abandoned["slots"] == [1]


def test_a_spare_still_launching_is_waited_for(make):
    controller = make(spares=1)
    start(controller, steps=5, spare=False)  # the launcher started spare0; it has not joined
    controller.on_exit("worker1", -9)
    report_to(controller, "worker0", "halted", {"generation": 0, "committed": 5, "in_flight": 6})
    until(lambda: events(controller, "recovery_start") != [])
    assert controller.outcome is None
    join_to(controller, "spare0", "spare", 200, "node0", None)
    report_to(controller, "spare0", "ready", {})
    until(lambda: controller.generation == 1)


def test_more_failures_than_spares_start_more_spares_instead_of_giving_up(make):
    controller = make(spares=1)
    start(controller, steps=5)
    controller.on_exit("worker1", -9)
    controller.on_exit("worker0", -9)  # two slots lost, one spare ready: one more is started
    until(lambda: controller.agent.spares_started == 1)
    assert controller.outcome is None and not events(controller, "recovery_abandoned")


# ------------------------------------------------------------------ item 6b: deadline
def test_a_recovery_past_its_deadline_is_replanned_then_stops_with_the_reason(make):
    # Deadline halt_timeout + hang timeout = 0.5 + 1.5 = 2 s per plan; one re-plan allowed.
    controller = make(halt_timeout=0.5, hang_floor=1.5, max_restarts=1, spares=1)
    start(controller, steps=7)
    controller.on_exit("worker1", -9)
    report_to(controller, "worker0", "halted", {"generation": 0, "committed": 7, "in_flight": 8})
    until(lambda: controller.generation == 1)
    # Nobody carries the plan out: it is aborted everywhere when overdue and planned again.
    until(lambda: events(controller, "recovery_failed") != [])
    (overdue,) = events(controller, "recovery_failed")
    assert overdue["reason"].startswith("the recovery into generation 1 did not finish within 2 s")
    assert "rank 1 (spare0) never reported comm_ready" in overdue["reason"]
    for process in ("worker0", "spare0"):
        outbox = controller.outbox(process)
        until(lambda: {"type": "abort", "generation": 1} in outbox.pending())  # noqa: B023
        report_to(
            controller, process, "halted", {"generation": 1, "committed": 7, "in_flight": None}
        )
    until(lambda: controller.generation == 2)
    # ... and when that one overruns too, the job stops with the reason: no silent wait.
    outcome = controller.wait_finished(timeout=60)
    assert outcome is not None and outcome["status"] == "failed"
    assert "recovery failed 2 times in a row" in outcome["reason"]
    assert "generation 2 did not finish" in outcome["reason"]


# ------------------------------------------------------------------ item 19b: survivor gap
def test_recovery_done_carries_each_survivors_gap_between_commits(make):
    controller = make()
    start(controller, steps=7)
    controller.on_exit("worker1", -9)
    report_to(
        controller,
        "worker0",
        "halted",
        {"generation": 0, "committed": 7, "in_flight": 8, "last_commit_t": 1000.0},
    )
    until(lambda: controller.generation == 1)
    for process, t in (("worker0", 1000.75), ("spare0", 1000.7)):
        body = {"generation": 1, "step": 8, "first_after_recovery": True, "t": t}
        report_to(controller, process, "progress", body)
    until(lambda: events(controller, "recovery_done") != [])
    (done_event,) = events(controller, "recovery_done")
    assert done_event["survivor_gap_seconds"] == {"0": pytest.approx(0.75)}
