"""The health judge: hysteresis (a warning must persist, a flag must clear), faults at once,
and the rate limit (per window, and a fraction of the slots at once). Pure: no processes."""

from __future__ import annotations

from torchrelay.health.judge import HealthJudge, MigrationAdvice, finished, judge
from torchrelay.health.policy import HealthPolicy, Severity
from torchrelay.health.readings import Reading, Source

HOT, COOL = 95.0, 60.0


def read(node: str, device: int, t: float, temperature: float = HOT, **more) -> Reading:
    return Reading(
        node=node, device=device, source=Source.NVML, t=t, temperature_c=temperature, **more
    )


def polls(state: HealthJudge, node: str, device: int, temps: list[float], t0: float = 0.0):
    """Poll one device with ``temps`` at 5 s intervals; the state and every advice given."""
    advice: list[MigrationAdvice] = []
    for i, temperature in enumerate(temps):
        t = t0 + 5.0 * i
        state, given = judge(state, [read(node, device, t, temperature, slot=device)], t)
        advice += given
    return state, advice


def fresh(world_size: int = 8, **policy) -> HealthJudge:
    return HealthJudge(HealthPolicy(**policy), world_size)


def test_a_warning_must_persist_for_k_polls():
    state, advice = polls(fresh(), "node0", 2, [HOT, HOT])
    assert advice == [] and not state.tracks[("node0", 2)].flagged
    state, advice = polls(state, "node0", 2, [HOT], t0=10.0)
    (given,) = advice
    assert (given.node, given.device, given.slot) == ("node0", 2, 2)
    assert given.severity is Severity.WARNING and given.reason == "temperature 95 C >= 90 C"
    assert given.since == 0.0 and given.t == 10.0  # lead time counts from the first warning
    assert given.trigger.t == 10.0 and given.trigger.temperature_c == HOT


def test_one_noisy_reading_never_triggers():
    state, advice = polls(fresh(), "node0", 0, [HOT, HOT, COOL, HOT, HOT, COOL, HOT])
    assert advice == []  # never three in a row
    track = state.tracks[("node0", 0)]
    assert track.warn_streak == 1 and track.since == 30.0  # a new episode began at the last


def test_persist_polls_is_the_policys():
    _, advice = polls(fresh(persist_polls=1), "node0", 0, [HOT])
    assert len(advice) == 1
    _, advice = polls(fresh(persist_polls=5), "node0", 0, [HOT] * 4)
    assert advice == []


def test_a_flag_is_advised_once_and_clears_after_k_clean_polls():
    state, advice = polls(fresh(), "node0", 0, [HOT] * 6)
    assert len(advice) == 1  # still hot: advised once, not at every poll
    state = finished(state, "node0", 0)
    state, advice = polls(state, "node0", 0, [COOL, COOL, HOT], t0=30.0)
    assert advice == [] and state.tracks[("node0", 0)].flagged  # two clean: not yet cleared
    state, advice = polls(state, "node0", 0, [COOL, COOL], t0=45.0)
    assert state.tracks[("node0", 0)].flagged  # the hot reading restarted the clean count
    state, advice = polls(state, "node0", 0, [COOL], t0=55.0)
    assert not state.tracks[("node0", 0)].flagged and advice == []
    state, advice = polls(state, "node0", 0, [HOT] * 3, t0=200.0)
    assert len(advice) == 1 and advice[0].since == 200.0  # a new episode, advised again


def test_a_fault_triggers_at_once():
    state = fresh()
    state, advice = judge(state, [read("node1", 3, 1.0, COOL, xid=(79,), process="spare2")], 1.0)
    (given,) = advice
    assert given.severity is Severity.FAULT and given.reason == "critical Xid 79"
    assert (given.process, given.since) == ("spare2", 1.0)


def test_a_fault_after_warnings_keeps_the_episodes_start():
    state, _ = polls(fresh(), "node0", 0, [HOT])
    state, advice = judge(state, [read("node0", 0, 5.0, gpu_lost=True)], 5.0)
    assert advice[0].severity is Severity.FAULT and advice[0].since == 0.0


def test_no_news_is_not_a_clean_poll():
    state, _ = polls(fresh(), "node0", 0, [HOT, HOT])
    state, advice = judge(state, [read("node1", 0, 10.0, COOL)], 10.0)  # another node's poll
    assert advice == [] and state.tracks[("node0", 0)].warn_streak == 2
    state, advice = polls(state, "node0", 0, [HOT], t0=15.0)
    assert len(advice) == 1


def test_several_sources_of_one_device_are_one_poll_unhealthy_if_any_is():
    state = fresh()
    for t in (0.0, 5.0, 10.0):
        nvml = read("node0", 1, t, COOL)
        injected = Reading(node="node0", device=1, source=Source.INJECTED, t=t, temperature_c=99)
        state, advice = judge(state, [nvml, injected], t)
    assert state.tracks[("node0", 1)].warn_streak == 3
    assert advice[0].trigger.source is Source.INJECTED


def test_at_most_one_migration_per_window():
    state = fresh(max_fraction=1.0)
    batch = [read("node0", d, t=0.0) for d in range(3)]
    for t in (0.0, 5.0, 10.0):
        state, advice = judge(state, [read("node0", d, t) for d in range(3)], t)
    assert [a.device for a in advice] == [0]  # the earliest warned, then the lowest key
    state, advice = judge(state, [], 69.0)
    assert advice == []  # 59 s after the first: still inside the 60 s window
    state, advice = judge(state, [], 70.0)
    assert [a.device for a in advice] == [1]
    state, advice = judge(state, batch, 130.0)
    assert [a.device for a in advice] == [2]


def test_no_more_than_a_fraction_of_slots_migrate_at_once():
    state = fresh(world_size=8, max_migrations=10, max_fraction=0.25)  # 2 at once
    for t in (0.0, 5.0, 10.0):
        state, advice = judge(state, [read(f"node{n}", 0, t) for n in range(4)], t)
    assert [a.node for a in advice] == ["node0", "node1"]
    state, advice = judge(state, [], 11.0)
    assert advice == [] and len(state.in_flight) == 2  # a bad rack does not drain the job
    state = finished(state, "node1", 0)
    state, advice = judge(state, [], 12.0)
    assert [a.node for a in advice] == ["node2"]


def test_faults_skip_the_rate_limit_and_go_first_but_count():
    state = fresh(world_size=4)  # one migration per 60 s, one at once
    for t in (0.0, 5.0, 10.0):
        state, advice = judge(state, [read("node0", 0, t)], t)
    assert len(advice) == 1 and len(state.in_flight) == 1
    state, advice = judge(state, [read("node1", 0, 11.0), read("node2", 0, 11.0, xid=(48,))], 11)
    assert [(a.node, a.severity) for a in advice] == [("node2", Severity.FAULT)]
    assert len(state.advised_at) == 2 and len(state.in_flight) == 2
    for t in (16.0, 21.0):
        state, advice = judge(state, [read("node1", 0, t)], t)
    assert advice == []  # node1's warning waits: the window and the in-flight cap are full
    state = finished(finished(state, "node0", 0), "node2", 0)
    state, advice = judge(state, [], 72.0)
    assert [a.node for a in advice] == ["node1"]


def test_a_fault_on_a_warned_device_waiting_for_the_limit_jumps_the_queue():
    state = fresh(world_size=4)
    for t in (0.0, 5.0, 10.0):
        state, advice = judge(state, [read("node0", 0, t), read("node1", 0, t)], t)
    assert [a.node for a in advice] == ["node0"]
    state, advice = judge(state, [read("node1", 0, 15.0, remapped_rows_failed=True)], 15.0)
    assert [(a.node, a.severity, a.since) for a in advice] == [("node1", Severity.FAULT, 0.0)]


def test_judge_never_mutates_the_state_it_was_given():
    before = fresh()
    after, _ = polls(before, "node0", 0, [HOT] * 3)
    assert before.tracks == {} and before.advised_at == () and before.in_flight == frozenset()
    assert after.in_flight == {("node0", 0)}


def test_the_earliest_warned_goes_first_even_from_time_zero():
    state = fresh(world_size=4)
    state, _ = judge(state, [read("node1", 0, 0.0)], 0.0)  # node1 warned first, at t = 0
    for t in (5.0, 10.0, 15.0):
        state, advice = judge(state, [read("node0", 0, t), read("node1", 0, t)], t)
        if advice:
            break
    assert [a.node for a in advice] == ["node1"] and advice[0].since == 0.0


def test_a_device_is_not_advised_twice_while_its_handover_runs():
    state, advice = polls(fresh(clear_polls=1), "node0", 0, [HOT] * 3)
    assert len(advice) == 1
    state, advice = polls(state, "node0", 0, [COOL] + [HOT] * 3, t0=100.0)
    assert advice == [] and state.tracks[("node0", 0)].flagged  # cleared, flagged anew
    state = finished(state, "node0", 0)
    state, advice = judge(state, [], 200.0)
    assert len(advice) == 1 and advice[0].since == 105.0
