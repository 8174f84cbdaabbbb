"""Which heartbeats mean hung, stalled or a lost collective (pure rules, no processes)."""

from torchrelay.control.detection import Beat, judge

TIMEOUT, FRESH = 10.0, 2.0


def test_a_training_job_is_healthy():
    beats = [Beat(0, 0.3, step_age=0.2, waiting=0.1), Beat(1, 0.1, step_age=0.2, waiting=None)]
    assert judge(beats, TIMEOUT, FRESH).healthy


def test_silence_past_the_timeout_is_a_hang():
    verdict = judge([Beat(0, 0.3, 0.5, 0.4), Beat(1, 10.5, 0.1, None)], TIMEOUT, FRESH)
    assert list(verdict.hung) == [1]
    assert "silent for 10.5 s" in verdict.hung[1]
    assert not verdict.stalled and verdict.lost_collective is None


def test_a_rank_stuck_outside_any_collective_while_its_peers_wait_is_stalled():
    beats = [Beat(0, 0.2, 11.0, 10.8), Beat(1, 0.4, 11.0, None), Beat(2, 0.1, 11.2, 10.9)]
    verdict = judge(beats, TIMEOUT, FRESH)
    assert list(verdict.stalled) == [1]
    assert verdict.lost_collective is None, "the peers wait on the staller, not on the network"


def test_step_age_is_extrapolated_by_the_silence_since_the_report():
    assert judge([Beat(0, 1.5, 9.0, None)], TIMEOUT, FRESH).stalled
    assert judge([Beat(0, 0.5, 9.0, None)], TIMEOUT, FRESH).healthy


def test_a_quiet_rank_is_not_called_stalled_on_stale_evidence():
    # Its last report is 5 s old: it may be SIGSTOPped; the silence rule decides, later.
    verdict = judge([Beat(0, 5.0, 8.0, None), Beat(1, 0.1, 13.0, 12.9)], TIMEOUT, FRESH)
    assert verdict.healthy


def test_everyone_waiting_on_a_collective_past_the_timeout_is_a_lost_collective():
    beats = [Beat(0, 0.2, 12.0, 11.5), Beat(1, 0.3, 12.0, 10.5)]
    verdict = judge(beats, TIMEOUT, FRESH)
    assert not verdict.hung and not verdict.stalled
    assert verdict.lost_collective is not None and "10.8 s" in verdict.lost_collective


def test_no_lost_collective_while_one_rank_is_not_yet_in_the_collective():
    beats = [Beat(0, 0.2, 12.0, 11.5), Beat(1, 0.3, 0.5, None)]
    assert judge(beats, TIMEOUT, FRESH).healthy


def test_no_lost_collective_while_one_rank_is_between_steps():
    # A rank that is recovering or done reports no step: the others wait on it legitimately.
    beats = [Beat(0, 0.2, 12.0, 11.5), Beat(1, 0.3, None, None)]
    assert judge(beats, TIMEOUT, FRESH).healthy


def test_a_hang_takes_precedence_over_a_lost_collective():
    beats = [Beat(0, 0.2, 12.0, 11.5), Beat(1, 11.0, 1.0, 0.9)]
    verdict = judge(beats, TIMEOUT, FRESH)
    assert list(verdict.hung) == [1] and verdict.lost_collective is None


def test_declared_busy_work_is_neither_a_stall_nor_a_lost_collective():
    # Rank 1 evaluates inside relay.busy(...) while rank 0 waits in the next all-reduce.
    beats = [Beat(0, 0.2, 30.0, 29.0), Beat(1, 0.3, 30.0, None, busy=True)]
    assert judge(beats, TIMEOUT, FRESH).healthy
    beats = [Beat(0, 0.2, 30.0, 29.0), Beat(1, 0.3, 30.0, 29.5, busy=True)]
    assert judge(beats, TIMEOUT, FRESH).healthy
    # Busy or not, silence is a hang.
    assert judge([Beat(0, 12.0, 1.0, None, busy=True)], TIMEOUT, FRESH).hung


def test_every_slot_silent_at_once_waits_longer_before_it_is_a_hang():
    """The controller starved of CPU sees everyone silent; fencing all would end the job."""
    together = [Beat(0, 10.5, None, None), Beat(1, 12.0, None, None), Beat(2, 29.0, None, None)]
    assert judge(together, TIMEOUT, FRESH).healthy
    for_long = [Beat(0, 30.5, None, None), Beat(1, 31.0, None, None)]
    assert sorted(judge(for_long, TIMEOUT, FRESH).hung) == [0, 1]
    # A lone worker is judged by the plain rule: nothing is gained by waiting for it.
    assert list(judge([Beat(0, 10.5, None, None)], TIMEOUT, FRESH).hung) == [0]
