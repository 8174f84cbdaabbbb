"""Verdicts on exits, missing spares and stuck recoveries (pure rules, no processes)."""

from __future__ import annotations

import pytest

from torchrelay.control.verdicts import (
    after_loop_reason,
    describe_exit,
    fails_before_first_step,
    finish_verdict,
    first_step_bug_reason,
    last_traceback,
    lost_in_setup,
    missing_spares,
    never_joined,
    no_spare_reason,
    overdue_reason,
    recovery_deadline,
    spare_node,
    step_in_flight,
    survivor_gaps,
    unjoined_failure,
    worker_slot,
)

TORCHRUN_OUTPUT = """\
Traceback (most recent call last):
  File "train.py", line 16, in <module>
    dist.init_process_group("gloo")
torch.distributed.DistNetworkError: The server socket has failed to listen on any local \
network address. port: 40809, useIpv6: false, code: -98, name: EADDRINUSE"""


def test_exits_are_described_by_signal_or_code():
    assert describe_exit(-9) == "SIGKILL"
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-200) == "signal 200"


def test_workers_have_slots_spares_do_not():
    assert worker_slot("worker12") == 12
    assert worker_slot("spare0") is None and worker_slot("node1-spare3") is None
    assert spare_node("node1-spare3") == "node1"
    assert spare_node("spare0") == "node0"


def test_the_last_traceback_is_cut_from_the_output():
    output = "noise\nTraceback (most recent call last):\n old\nValueError: a\nmore\n" + (
        "Traceback (most recent call last):\n  File x\nKeyError: 'b'\n"
    )
    assert last_traceback(output) == "Traceback (most recent call last):\n  File x\nKeyError: 'b'"
    assert last_traceback("\n".join(str(i) for i in range(100)), max_lines=3) == "97\n98\n99"
    assert last_traceback("") == ""


def test_a_worker_that_never_joined_stops_the_job_whatever_killed_it():
    reason = never_joined("worker1", 1, "Traceback (most recent call last):\nValueError: x")
    assert reason is not None and reason.startswith("rank 1 (worker1) failed (exit code 1)")
    assert "before calling torchrelay.init()" in reason and "not a hardware failure" in reason
    assert "\n" not in reason
    killed = never_joined("worker0", -9, "")
    assert killed is not None and "SIGKILL" in killed


def test_exit_zero_without_init_is_named_as_such():
    reason = never_joined("worker0", 0, "hello\n")
    assert reason is not None and "status 0 without ever calling torchrelay.init()" in reason


def test_a_spare_killed_before_joining_is_no_verdict_on_the_script():
    assert never_joined("spare0", -9, "") is None
    assert never_joined("node1-spare0", -15, "") is None
    assert never_joined("spare0", 1, "Traceback (most recent call last):\nKeyError") is not None


@pytest.mark.parametrize("process", ["worker0", "spare0"])
def test_an_unmodified_torchrun_script_is_recognised_from_its_output(process):
    reason = never_joined(process, 1, TORCHRUN_OUTPUT)
    assert reason is not None and "unmodified torchrun script" in reason
    assert "needs torchrelay.init()" in reason and "torchrelay run --transparent" in reason
    spare = "environment variable RANK expected, but not set (env:// rendezvous)"
    assert "unmodified torchrun" in (never_joined("spare0", 1, spare) or "")


def test_script_failures_before_the_first_commit_are_bugs_not_hardware():
    assert fails_before_first_step("exception", -1)
    assert fails_before_first_step("exit", -1)
    assert not fails_before_first_step("signal", -1)
    assert not fails_before_first_step("stall", -1)
    assert not fails_before_first_step("exception", 0)


def test_a_script_failure_after_a_hardware_loss_in_set_up_blames_the_loss():
    killed = {"slot": 1, "process": "worker1", "cause": "SIGKILL", "kind": "signal", "t": 2.0}
    raised = {"slot": 2, "process": "worker2", "cause": "exit code 1", "kind": "exit", "t": 1.0}
    assert lost_in_setup({2: raised}) is None
    assert lost_in_setup({1: killed, 2: raised}) == killed
    reason = first_step_bug_reason(2, "worker2", 0, "exit code 1", killed)
    assert reason.startswith("rank 1 (worker1) was lost (SIGKILL)") and "\n" not in reason
    assert "a bug in the script" not in reason


def test_the_step_in_flight_is_the_one_after_the_last_commit():
    assert step_in_flight(39) == 40
    assert step_in_flight(-1) == 0
    assert step_in_flight(39, error_step=41) == 41


def test_success_needs_every_slot_to_exit_zero_after_its_last_step():
    assert finish_verdict({0: None, 1: 0}) == ("wait", None)
    assert finish_verdict({0: 0, 1: 0}) == ("succeeded", None)
    assert finish_verdict({0: 1, 1: None}) == ("failed", 0)
    assert finish_verdict({0: 0, 1: -9}) == ("failed", 1)


def test_a_recovery_without_any_spare_on_its_way_is_hopeless():
    assert missing_spares(1, ready=0, starting=0, launching=0)
    assert not missing_spares(1, ready=0, starting=0, launching=1)
    assert not missing_spares(1, ready=0, starting=1, launching=0)
    assert missing_spares(2, ready=1, starting=0, launching=0)
    assert not missing_spares(0, ready=0, starting=0, launching=0)


def test_the_recovery_deadline_covers_a_halt_and_a_step():
    assert recovery_deadline(halt_timeout=120.0, hang_timeout=10.0) == 130.0


def test_an_overdue_recovery_names_who_is_stuck_where():
    reason = overdue_reason(
        3,
        12.0,
        {0: "worker0", 1: "spare0", 2: "worker2"},
        {"comm_ready": {0, 1, 2}, "transfer_done": {0, 2}, "first_step": {2}},
    )
    assert reason.startswith("the recovery into generation 3 did not finish within 12 s")
    assert "rank 0 (worker0) never reported first_step" in reason
    assert "rank 1 (spare0) never reported transfer_done" in reason
    assert "rank 2" not in reason and "\n" not in reason


def test_survivor_gaps_run_from_the_last_commit_before_to_the_first_after():
    gaps = survivor_gaps({0: 100.0, 2: 100.5, 1: None}, {0: 100.3, 1: 100.4, 2: 100.9})
    assert gaps == pytest.approx({0: 0.3, 2: 0.4})


def test_a_worker_that_never_joined_is_a_failure_in_step_zero():
    failure = unjoined_failure("worker2", 1, "Traceback (most recent call last):\nKeyError")
    assert failure is not None
    assert (failure["slot"], failure["step"], failure["kind"]) == (2, 0, "exception")
    assert unjoined_failure("worker2", -9, "")["kind"] == "signal"  # type: ignore[index]
    assert unjoined_failure("worker2", 0, "")["traceback"] is None  # type: ignore[index]
    assert unjoined_failure("spare1", 1, "") is None


def test_reasons_are_one_line_and_name_rank_step_and_cause():
    reasons = [
        first_step_bug_reason(1, "worker1", 0, "exit code 1"),
        after_loop_reason(0, "worker0", -9),
        no_spare_reason({1: "SIGKILL", 0: "SIGKILL"}, 40, 0),
    ]
    assert all("\n" not in r for r in reasons)
    assert reasons[0].startswith("rank 1 (worker1) failed in step 0 (exit code 1)")
    assert "rank 0 (worker0) failed after its last step (SIGKILL)" in reasons[1]
    assert reasons[2].startswith("rank(s) [0, 1] lost in step 40 (rank 0: SIGKILL, rank 1: ")
    assert "(--spares 0), so none will come" in reasons[2]


def test_a_transparent_job_is_not_told_to_add_spares():
    reason = no_spare_reason({1: "SIGKILL"}, 6, 0, transparent=True)
    assert "\n" not in reason and reason.startswith("rank(s) [1] lost in step 6 (rank 1: ")
    assert "--spares" not in reason and "could not clone a live replica" in reason
