"""The controller's durable state (control/persistence.py) over the in-memory backend: written
ahead of the actions, only when it changed, never without the lead; a controller that cannot
record a decision ends the job instead of acting on it."""

from __future__ import annotations

import json
import signal

import pytest

from tests.fsm import Driver, join_to
from torchrelay.control.controller import Controller
from torchrelay.control.persistence import StatePersister, durable_view, lead
from torchrelay.control.state import JobPhase
from torchrelay.control.store import SealedStore, StateTampered, StoreError
from torchrelay.control.store.memory import MemoryBackend
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
