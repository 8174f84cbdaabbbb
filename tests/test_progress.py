"""Progress lines of long operations, throttled by an injected clock (no waiting): a state
transfer's bytes and a recovery's wait for a spare; and the recovery view they read."""

from __future__ import annotations

from torchrelay.control.job_view import describe_recovery
from torchrelay.control.observer import JobObserver, SpareWait
from torchrelay.control.planner import RecoveryPlan
from torchrelay.control.state import RecoveryState, RecoveryStep, Round
from torchrelay.progress import MB, ByteProgress, bytes_line


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_short_transfer_says_nothing():
    lines: list[str] = []
    clock = FakeClock()
    progress = ByteProgress("receiving state", 4 * MB, lines.append, clock)
    for _ in range(4):
        clock.now += 0.2
        progress.add(MB)
    assert lines == []


def test_a_long_transfer_says_where_it_is_once_a_second_and_when_done():
    lines: list[str] = []
    clock = FakeClock()
    progress = ByteProgress("rank 1 receiving state", 64 * MB, lines.append, clock)
    for _ in range(64):  # 64 chunks of 1 MB, 1/16 s each: 4 s in all
        clock.now += 1 / 16
        progress.add(MB)
    # Due at 1 s, then every second, and the last line when it completes.
    assert lines == [
        "rank 1 receiving state: 16/64 MB (25 %, 1 s)",
        "rank 1 receiving state: 32/64 MB (50 %, 2 s)",
        "rank 1 receiving state: 48/64 MB (75 %, 3 s)",
        "rank 1 receiving state: 64/64 MB (100 %, 4 s)",
    ]


def test_small_sizes_keep_a_decimal():
    assert bytes_line("x", MB // 2, 3 * MB, 1.4) == "x: 0.5/3.0 MB (17 %, 1 s)"
    assert bytes_line("x", 0, 0, 0.0) == "x: 0.0/0.0 MB (100 %, 0 s)"


def waiting(detected: float, seconds: float, step: str = "spares") -> dict:
    return {
        "step": step,
        "slots": [1, 2],
        "detected": detected,
        "seconds_in_step": seconds,
        "step_limit": 300.0,
    }


def test_a_wait_for_a_spare_is_said_after_a_second_then_every_five():
    lines: list[str] = []
    wait = SpareWait(lines.append)
    for seconds in (0.0, 0.5, 1.2, 1.7, 3.0, 6.1, 6.3, 11.4):
        wait.update(waiting(50.0, seconds))
    wait.update(waiting(50.0, 12.0, step="halt"))  # the spare came
    wait.update(None)
    assert lines == [
        f"torchrelay: recovery of slot(s) 1, 2 is waiting for a spare ({s} s; gives up after "
        "300 s, see --spare-timeout)"
        for s in (1, 6, 11)
    ]
    wait.update(waiting(80.0, 1.0))  # the next recovery starts its own count
    assert len(lines) == 4 and "(1 s;" in lines[-1]


def test_the_observer_feeds_each_snapshot_to_the_spare_wait_and_stops_at_the_outcome():
    lines: list[str] = []
    snapshots = [
        {"recovery": waiting(1.0, 2.0), "outcome": None},
        {"recovery": None, "outcome": {"status": "succeeded"}},
    ]
    observer = JobObserver(lambda: snapshots.pop(0), emit=lines.append, interval=0.001)
    observer.run()  # what its thread runs: it returns at the outcome, asking nothing more
    assert snapshots == []
    assert len(lines) == 1 and "waiting for a spare (2 s" in lines[0]


def test_the_recovery_view_names_the_step_the_plan_and_the_phases_done():
    recovery = RecoveryState()
    assert describe_recovery(recovery, 10.0) is None
    current = Round([{"slot": 1}], detected=4.0, slots=[1], survivors=["worker0"], step_since=6.0)
    current.step_limit = 120.0
    recovery.current = current
    view = describe_recovery(recovery, 10.0)
    assert view is not None
    assert (view["step"], view["seconds"], view["seconds_in_step"]) == ("spares", 6.0, 4.0)
    assert view["generation"] is None and view["receivers"] == []
    current.step = RecoveryStep.DONE
    current.plan = RecoveryPlan(
        generation=2,
        target_step=7,
        assignments={0: "worker0", 1: "spare0"},
        sources=(0,),
        receivers=(1,),
        replaced={1: "worker1"},
        lost_steps=0,
    )
    current.phases = {"comm_ready": {1: {"t": 9.0}, 0: {"t": 9.1}}}
    view = describe_recovery(recovery, 10.0)
    assert view is not None
    assert (view["step"], view["generation"], view["target_step"]) == ("done", 2, 7)
    assert view["receivers"] == [1] and view["phases"] == {"comm_ready": [0, 1]}
