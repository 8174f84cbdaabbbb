"""The controller's durable state (control/persistence.py) over the in-memory backend: written
ahead of the actions, only when it changed, never without the lead; a controller that cannot
record a decision ends the job instead of acting on it."""

from __future__ import annotations

import json
import signal

import pytest

from tests.fsm import Driver, join_to
from torchrelay.control import departures, liveness, membership, nodes, recovery_steps
from torchrelay.control.controller import Controller
from torchrelay.control.persistence import StatePersister, durable_view, lead, relearnt, restore
from torchrelay.control.protocol import Halted, NodeHeartbeat, PhaseDone, Progress, Report
from torchrelay.control.state import JobPhase
from torchrelay.control.store import SealedStore, StateTampered, StoreError
from torchrelay.control.store.memory import MemoryBackend
from torchrelay.control.takeover import take_over
from torchrelay.control.wire import new_token
from torchrelay.ledger import Ledger, read_ledger

TOKEN = new_token()


def _persister(backend: MemoryBackend, token: str = TOKEN) -> StatePersister:
    return lead(backend, token, "me")


def _stored(backend: MemoryBackend) -> tuple[dict, int]:
    raw, revision = SealedStore(backend, TOKEN).get_state()
    assert raw is not None
    return json.loads(raw), revision


def test_a_decision_is_written_and_heartbeats_are_not(tmp_path):
    driver, backend = Driver(tmp_path), MemoryBackend()
    persister = _persister(backend)
    driver.start(steps=2)
    persister.save(driver.job)
    state, revision = _stored(backend)
    assert state == json.loads(json.dumps(durable_view(driver.job)))
    assert state["highest_committed"] == 2 and set(state["members"]) == {
        "worker0",
        "worker1",
        "spare0",
    }
    # Heartbeats that report nothing new change nothing durable: no write.
    driver.now += 1
    driver.report("worker0", "progress", step=2, step_seconds=0.1)
    persister.save(driver.job)
    assert _stored(backend)[1] == revision
    # A failure is a decision: written before anything acts on it.
    driver.exit("worker1", -signal.SIGKILL)
    persister.save(driver.job)
    state, later = _stored(backend)
    assert later > revision and state["members"]["worker1"]["state"] == "dead"


def _view(job) -> dict:
    """The durable view as stored: a snapshot, whatever changes in ``job`` afterwards."""
    return json.loads(json.dumps(durable_view(job)))


def test_a_heartbeat_changes_nothing_durable(tmp_path):
    """The controller skips the durable view entirely for a heartbeat (``relearnt``), so a
    heartbeat must leave the view as it was; a new committed step changes it."""
    driver = Driver(tmp_path)
    driver.start(steps=2)
    driver.take(nodes.join_node(driver.job, "node1", driver.now))

    def handled(report) -> tuple[bool, bool]:
        """(classed a heartbeat, the durable view unchanged) for one report."""
        before, classed = _view(driver.job), relearnt(driver.job, report)
        driver.now += 0.5
        if isinstance(report, NodeHeartbeat):
            departures.node_report(driver.job, driver.config, "node1", report, driver.now, str)
        else:
            body = report.to_wire()
            driver.report("worker0", body.pop("kind"), **body)
        return classed, _view(driver.job) == before

    beats = [
        Progress(step=2, step_seconds=0.1, compute_seconds=0.08, step_age=0.3, busy="save"),
        Progress(step=2, waiting=0.2, step_age=1.5),
        NodeHeartbeat(),
    ]
    assert [handled(report) for report in beats] == [(True, True)] * 3
    assert handled(Progress(step=3)) == (False, False)  # a new committed step
    assert not relearnt(driver.job, Progress(step=4, first_after_recovery=True))


def test_a_monitor_round_that_finds_nothing_changes_nothing_durable(tmp_path):
    """The monitor skips the durable view for a round without actions (every 0.25 s)."""
    driver = Driver(tmp_path)
    driver.start(steps=2)
    for process, seconds in (("worker0", 0.1), ("worker1", 0.5)):  # worker1 lags 5x
        driver.report(process, "progress", step=2, step_seconds=seconds, compute_seconds=seconds)
    rounds = []
    for _ in range(3):
        before = _view(driver.job)
        driver.now += 0.25
        actions = liveness.tick(driver.job, driver.config, driver.now, lambda _: "")
        rounds.append((bool(actions), _view(driver.job) == before))
    assert rounds == [(True, False), (False, True), (False, True)]  # the straggler, then none
    assert driver.job.straggler_rounds["worker1"] == 3


def _successor(view: dict, driver: Driver, *then: tuple[str, Report]) -> dict:
    """The durable view of the job a new leader on node2 makes of ``view``, once ``then``
    (process, report) reached it and its recovery moved on."""
    job = restore(view, driver.config.hang_floor, driver.now)
    take_over(job, driver.config, "node2", 2, "h:1", "h:2", driver.now, lambda _: "")
    for process, report in then:
        membership.report(job, process, report, driver.now)
    recovery_steps.advance(job, driver.config, driver.now)
    return _view(job)


def test_a_recoverys_progress_is_learnt_again_by_a_new_leader(tmp_path):
    """A survivor's halt and a phase done go unwritten when they act on nothing: a leader
    taking over from the state before either makes the same job as from the state after,
    once the survivor has halted again (it does on reaching the new leader)."""
    driver = Driver(tmp_path)
    driver.take(nodes.join_node(driver.job, "node1", driver.now))
    for slot in (0, 1):
        driver.join(f"worker{slot}", slot=slot, node="node1")
        driver.report(f"worker{slot}", "max_steps", max_steps=5)
        driver.report(f"worker{slot}", "progress", step=2)
    driver.join("spare0", role="spare", node="node1")
    driver.report("spare0", "ready")
    driver.exit("worker1", -signal.SIGKILL)
    driver.advance()
    halted = Halted(generation=0, committed=2, in_flight=3, last_commit_t=999.5)
    before = _view(driver.job)
    assert relearnt(driver.job, halted)
    assert driver.report("worker0", "halted", **_body(halted)) == []
    after = _view(driver.job)
    assert after != before
    again = ("worker0", halted)
    assert _successor(before, driver, again) == _successor(after, driver, again)

    driver.advance()  # every survivor halted: the plan goes out
    (planned,) = driver.events("recovery_planned")
    done = PhaseDone(generation=planned["generation"], phase="comm_ready", t=driver.now)
    before = _view(driver.job)
    assert relearnt(driver.job, done)
    assert driver.report("worker0", "phase", **_body(done)) == []
    after = _view(driver.job)
    assert after != before
    assert _successor(before, driver, again) == _successor(after, driver, again)
    # Not so a new committed step: a successor of the state before it would not know it.
    before = _view(driver.job)
    driver.report("worker0", "progress", step=3)
    assert _successor(before, driver, again) != _successor(_view(driver.job), driver, again)


def _body(report: Report) -> dict:
    body = report.to_wire()
    del body["kind"]
    return body


def test_a_deposed_leader_writes_nothing(tmp_path):
    driver, backend = Driver(tmp_path), MemoryBackend()
    persister = _persister(backend)
    driver.start()
    persister.save(driver.job)
    before = _stored(backend)
    persister.close()  # resigned: the lead may be someone else's now
    driver.exit("worker1", -signal.SIGKILL)
    with pytest.raises(StoreError, match="lost its lead"):
        persister.save(driver.job)
    assert _stored(backend) == before


def test_a_new_job_refuses_a_running_jobs_state_and_reuses_an_ended_one(tmp_path):
    driver, backend = Driver(tmp_path), MemoryBackend()
    first = _persister(backend)
    driver.start()
    first.save(driver.job)
    first.close()  # its launcher died: the lease ran out, the state says "running"
    with pytest.raises(StoreError, match=r"state of a running job .* its own key prefix"):
        _persister(backend)
    with pytest.raises(StateTampered, match="failed authentication"):
        _persister(backend, token=new_token())  # another job's token: never acted on

    ended, driver = MemoryBackend(), Driver(tmp_path)
    last = _persister(ended)
    driver.start()
    driver.job.phase = JobPhase.SUCCEEDED
    last.save(driver.job)
    last.close()
    _persister(ended).close()  # an ended job's slot may be reused


class _Agent:
    def start_spare(self) -> None:
        raise AssertionError("nothing may be acted on")

    def kill(self, process: str, signum: int = signal.SIGKILL, stacks: bool = False) -> None:
        raise AssertionError("nothing may be acted on")


def test_a_controller_that_cannot_record_ends_the_job_without_acting(tmp_path):
    driver, backend = Driver(tmp_path), MemoryBackend()
    persister = _persister(backend)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    controller = Controller(driver.config, ledger, _Agent(), persister=persister)
    join_to(controller, "worker0", "worker", 1, "node0", 0)
    persister.close()  # the lease is gone (etcd unreachable, or this process was paused)
    join_to(controller, "worker1", "worker", 2, "node0", 1)
    outcome = controller.outcome
    assert outcome is not None and outcome["status"] == "failed"
    assert "could not be recorded" in outcome["reason"] and "lost its lead" in outcome["reason"]
    joined = [e["process"] for e in read_ledger(ledger.path) if e["event"] == "process_join"]
    assert joined == ["worker0"]  # the second join was decided but never acted on
    assert controller.outbox("worker1").pending() == []
