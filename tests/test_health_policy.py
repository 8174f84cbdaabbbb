"""The health policy: what each reading breaks under the defaults, and the policy file's
one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from torchrelay.health.policy import (
    CRITICAL_XIDS,
    Finding,
    HealthPolicy,
    PolicyError,
    Severity,
    findings,
    load_policy,
)
from torchrelay.health.readings import Reading, ReadingError, RecoveryAction, Source, Throttle

W, F = Severity.WARNING, Severity.FAULT


def reading(**fields) -> Reading:
    return Reading(node="node0", device=0, source=Source.NVML, t=0.0, **fields)


def severities(**fields) -> list[Severity]:
    return [f.severity for f in findings(HealthPolicy(), reading(**fields))]


def test_a_healthy_or_unknown_reading_breaks_nothing():
    assert severities() == []  # nothing known is not a finding either way
    assert (
        severities(
            temperature_c=75.0,
            slowdown_margin_c=15.0,
            throttle=(Throttle.SW_POWER_CAP,),  # a busy GPU at its power limit: normal
            ecc_volatile_uncorrected=0,
            ecc_aggregate_uncorrected=3,  # off by default: the device's whole life
            remapped_rows_pending=False,
            remapped_rows_failed=False,
            recovery_action=RecoveryAction.NONE,
            xid=(13, 31, 43),  # application faults
        )
        == []
    )


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"temperature_c": 90.0}, [W]),
        ({"temperature_c": 89.9}, []),
        ({"slowdown_margin_c": 5.0}, [W]),
        ({"slowdown_margin_c": 5.1}, []),
        ({"throttle": (Throttle.HW_THERMAL,)}, [W]),
        ({"throttle": (Throttle.SW_THERMAL,)}, [W]),
        ({"throttle": (Throttle.HW_SLOWDOWN,)}, [W]),
        ({"throttle": (Throttle.HW_POWER_BRAKE,)}, [W]),
        ({"ecc_volatile_uncorrected": 1}, [W]),
        ({"remapped_rows_pending": True}, [W]),
        ({"remapped_rows_failed": True}, [F]),
        ({"recovery_action": RecoveryAction.GPU_RESET}, [F]),
        ({"recovery_action": RecoveryAction.DRAIN_AND_RESET}, [F]),
        ({"recovery_action": RecoveryAction.UNKNOWN}, [F]),
        ({"gpu_lost": True}, [F]),
        ({"xid": (79,)}, [F]),
        ({"xid": (13, 94)}, [F]),
        ({"temperature_c": 95.0, "slowdown_margin_c": 0.0, "xid": (48,)}, [F, W, W]),
    ],
)
def test_each_default_threshold(fields, expected):
    assert severities(**fields) == expected


def test_every_critical_xid_is_a_fault():
    for xid in CRITICAL_XIDS:
        assert findings(HealthPolicy(), reading(xid=(xid,))) == [Finding(F, f"critical Xid {xid}")]


def test_reasons_say_what_was_read_against_what():
    (finding,) = findings(HealthPolicy(), reading(temperature_c=93.4))
    assert finding.reason == "temperature 93 C >= 90 C"
    (finding,) = findings(HealthPolicy(), reading(throttle=(Throttle.HW_THERMAL,)))
    assert finding.reason == "clocks held down: hw_thermal"
    (finding,) = findings(HealthPolicy(), reading(recovery_action=RecoveryAction.NODE_REBOOT))
    assert finding.reason == "the driver asks for recovery action node_reboot"


def test_a_policy_moves_the_thresholds():
    policy = HealthPolicy(
        max_temperature_c=80.0,
        throttle=(Throttle.SW_POWER_CAP,),
        max_ecc_aggregate_uncorrected=2,
        remap_pending=False,
        critical_xids=(13,),
    )
    assert [f.severity for f in findings(policy, reading(temperature_c=85.0))] == [W]
    assert findings(policy, reading(throttle=(Throttle.HW_THERMAL,))) == []
    assert len(findings(policy, reading(throttle=(Throttle.SW_POWER_CAP,)))) == 1
    assert len(findings(policy, reading(ecc_aggregate_uncorrected=3))) == 1
    assert findings(policy, reading(remapped_rows_pending=True)) == []
    assert findings(policy, reading(xid=(79,))) == []
    assert len(findings(policy, reading(xid=(13,)))) == 1


def test_concurrency_is_a_fraction_of_the_slots_but_at_least_one():
    assert HealthPolicy().concurrent(4) == 1
    assert HealthPolicy().concurrent(16) == 4
    assert HealthPolicy(max_fraction=0.5).concurrent(5) == 2


def test_a_policy_file_in_toml_or_json(tmp_path):
    toml = tmp_path / "health.toml"
    toml.write_text(
        'max_temperature_c = 85\nthrottle = ["hw_thermal"]\npersist_polls = 5\n'
        "critical_xids = [79, 48]\nmax_fraction = 0.5\n"
    )
    policy = load_policy(toml)
    assert policy.max_temperature_c == 85.0 and isinstance(policy.max_temperature_c, float)
    assert policy.throttle == (Throttle.HW_THERMAL,)
    assert (policy.persist_polls, policy.critical_xids, policy.max_fraction) == (5, (79, 48), 0.5)
    assert policy.clear_polls == 3  # left out: the default
    js = tmp_path / "health.json"
    js.write_text(json.dumps(policy.to_plain()))
    assert load_policy(js) == policy  # the JSON form of a policy reads back the same


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("p.toml", "max_temprature_c = 85\n", "unknown key 'max_temprature_c' (known: "),
        ("p.toml", "persist_polls = 0\n", "persist_polls 0 is not a number of polls"),
        ("p.toml", 'max_temperature_c = "hot"\n', "max_temperature_c 'hot' is not a float"),
        ("p.toml", 'throttle = ["warm"]\n', "throttle ['warm'] is not a list of one of"),
        ("p.toml", "max_fraction = 1.5\n", "max_fraction 1.5 is not a fraction in (0, 1]"),
        ("p.toml", "max_temperature_c = \n", "does not parse"),
        ("p.json", "[1, 2]", "expected an object of thresholds"),
        ("p.json", "{", "does not parse"),
        ("p.yaml", "a: 1", "expected a .toml or .json file"),
    ],
)
def test_a_bad_policy_file_is_one_line_naming_the_file(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    error = str(caught.value)
    assert message in error and str(path) in error and "\n" not in error


def test_a_missing_policy_file_is_one_line(tmp_path):
    with pytest.raises(PolicyError, match=r"cannot read health policy .*: No such file"):
        load_policy(tmp_path / "absent.toml")


def test_readings_refuse_bad_wire_values_with_one_line():
    good = reading(throttle=(Throttle.HW_THERMAL,), recovery_action=RecoveryAction.GPU_RESET)
    wire = good.to_wire()
    assert wire["throttle"] == ["hw_thermal"] and wire["recovery_action"] == "gpu_reset"
    assert json.loads(json.dumps(wire)) == wire
    assert "temperature_c" not in wire  # unknown fields stay off the wire
    for field, value, says in [
        ("throttle", ["hot"], "throttle ['hot'] is not a list of one of 'sw_power_cap'"),
        ("recovery_action", "panic", "recovery_action 'panic' is not one of 'none'"),
        ("device", -1, "device -1 is not a device index"),
        ("ecc_volatile_uncorrected", -2, "is not a count"),
        ("temperature_c", "95", "temperature_c '95' is not a float or null"),
        ("source", "guess", "source 'guess' is not one of 'nvml', 'injected'"),
    ]:
        with pytest.raises(ReadingError, match=r"^Reading: ") as caught:
            Reading.from_wire({**wire, field: value})
        assert says in str(caught.value)


def test_the_documented_policy_file_loads(tmp_path):
    docs = (Path(__file__).resolve().parents[1] / "docs" / "health.md").read_text()
    example = tmp_path / "health.toml"
    example.write_text(re.search(r"```toml\n(.*?)```", docs, re.S).group(1))
    policy = load_policy(example)
    assert policy.max_fraction == 0.125 and policy.throttle == (
        Throttle.HW_THERMAL,
        Throttle.HW_SLOWDOWN,
    )
