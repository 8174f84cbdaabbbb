"""Inputs: YAML and dict loading, presets, MTTF scaling, and clear errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchrelay.simulate import (
    CalibrationPoint,
    Failures,
    LiveRecovery,
    ScenarioError,
    closed_form,
    load_scenario,
    scenario_from_dict,
)
from torchrelay.simulate.scaling import method, mttf_at
from torchrelay.simulate.spares import blocking, smallest_pool


def test_yaml_file_overrides_its_preset(tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(
        "preset: claim-16k\n"
        "cluster: {gpus: 4096}\n"
        "failures:\n"
        "  calibration:\n"
        "    - {gpus: 1024, per_gpu_failures_per_h: 1e-4}\n"
        "    - {gpus: 16384, mttf_h: 1.8}\n"
        "live: {coverage: 0.9}\n"
    )
    scenario = load_scenario(path)
    assert scenario.cluster.gpus == 4096
    assert scenario.cluster.price_per_gpu_h == 3.0  # from the preset
    assert scenario.checkpoint.interval_h == 1.5  # from the preset
    assert scenario.live.coverage == 0.9
    assert scenario.live.overhead == 0.0  # from the preset
    low = 1 / (1024 * 1e-4)  # "1e-4" is a string to YAML 1.1; it is accepted as a number
    assert scenario.mttf_h == pytest.approx((low * 1.8) ** 0.5)  # log-log midpoint


def test_mttf_scaling_interpolates_log_log_and_holds_per_gpu_rate_outside() -> None:
    points = ((1024, 7.9), (16384, 1.8))
    assert mttf_at(points, 1024) == 7.9
    assert mttf_at(points, 16384) == 1.8
    assert mttf_at(points, 4096) == pytest.approx(7.9 * (1.8 / 7.9) ** 0.5)
    assert mttf_at(points, 512) == pytest.approx(15.8)
    assert mttf_at(points, 65536) == pytest.approx(0.45)
    assert "interpolation" in method(points, 4096)
    assert "1/N" in method(points, 65536)


def test_explicit_mttf_keeps_its_per_gpu_rate_at_other_sizes() -> None:
    scenario = scenario_from_dict({"cluster": {"gpus": 1024}, "failures": {"mttf_h": 8.0}})
    assert scenario.at_size(4096).mttf_h == pytest.approx(2.0)


def test_erlang_b_special_case_of_kaufman_roberts() -> None:
    # One class of single-GPU arrivals: Erlang B(2 servers, 1 Erlang) = 0.5 / 2.5 = 0.2.
    assert blocking([(1.0, 1)], 2) == [pytest.approx(0.2)]
    assert smallest_pool([(1.0, 1)], 0.2, limit=100) == 2
    assert blocking([(1.0, 1), (0.5, 4)], 3)[1] == 1.0  # a 4-GPU event never fits in 3


def test_llama3_mix_is_the_published_breakdown() -> None:
    classes = Failures(mix="llama3-405b").classes()
    counts = {c.name: c.weight for c in classes}
    assert sum(counts.values()) == 419
    gpu = ("faulty-gpu", "gpu-hbm3", "gpu-sram", "gpu-system-processor")
    gpu += ("silent-data-corruption", "gpu-thermal")
    gpu_share = sum(counts[name] for name in gpu) / 419
    # Meta's table lists 30.1% for 148 faulty-GPU events (148 / 419 = 35.3%); by count the
    # GPU share is 64%, while the text's 58.7% matches the percentage column.
    assert gpu_share == pytest.approx(268 / 419)
    assert counts["gpu-hbm3"] / 419 == pytest.approx(0.172, abs=0.001)


def test_warning_share_turns_uncovered_failures_into_live_ones() -> None:
    base = {"preset": "claim-16k", "live": {"coverage": 0.5}, "spares": {"count": 100_000}}
    plain = closed_form(scenario_from_dict(base)).live_recovery
    warned = closed_form(
        scenario_from_dict({**base, "live": {"coverage": 0.5, "warning_share": 0.5}})
    ).live_recovery
    assert plain.live_share == pytest.approx(0.5)
    assert warned.live_share == pytest.approx(0.75)
    assert warned.ettr > plain.ettr


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"failures": {"mttf_h": -1}}, "failures.mttf_h: must be a finite number > 0"),
        ({"live": {"coverage": 1.2}}, "live.coverage: must be in [0, 1]"),
        ({"live": {"coverage": -0.1}}, "live.coverage: must be in [0, 1]"),
        ({"live": {"warning_share": 2}}, "live.warning_share: must be in [0, 1]"),
        ({"live": {"overhead": 1.0}}, "live.overhead: must be in [0, 1)"),
        ({"cluster": {"price_per_gpu_h": -3}}, "cluster.price_per_gpu_h: must be"),
        ({"cluster": {"gpus": 0}}, "cluster.gpus: must be an integer >= 1"),
        ({"cluster": {"gpus": "many"}}, "cluster.gpus: expected an integer"),
        ({"spares": {"repair_h": 0}}, "spares.repair_h: must be a finite number > 0"),
        ({"restart": {"detect_s": -5}}, "restart.detect_s: must be a finite number >= 0"),
        (
            {"failures": {"calibration": [{"gpus": 8, "per_gpu_failures_per_h": -1e-4}]}},
            "failures.calibration[0].per_gpu_failures_per_h: must be a finite number > 0",
        ),
        ({"failures": {"calibration": "nope"}}, "unknown calibration preset 'nope'; known:"),
        ({"failures": {"mix": "nope"}}, "unknown mix preset 'nope'; known:"),
        ({"preset": "nope"}, "unknown scenario preset 'nope'; known: claim-16k"),
        ({"failures": {"process": "gamma"}}, "expected one of 'poisson', 'weibull'"),
        ({"live": {"coverag": 0.5}}, "live.coverag: unknown key; valid keys:"),
        ({"checkpoint": {"save_s": 0}}, "checkpoint.interval_h: not set and save_s is 0"),
        ({"simulation": {"replications": 1}}, "simulation.replications: must be 0 (skip)"),
        ({"failures": {"mix": [{"name": "x"}]}}, "failures.mix[0]: missing required key"),
        ({"live": [1, 2]}, "live: expected a mapping"),
    ],
)
def test_bad_input_names_the_field_and_the_rule(settings: dict, message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        closed_form(scenario_from_dict(settings))
    assert message in str(caught.value)


def test_python_api_validates_too() -> None:
    with pytest.raises(ScenarioError, match=r"coverage: must be in \[0, 1\]"):
        LiveRecovery(coverage=3.0)
    with pytest.raises(ScenarioError, match="mttf_h: must be given"):
        CalibrationPoint(gpus=8)


def test_malformed_yaml_reports_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("cluster:\n  gpus: 1024\nlive: {coverage: 0.9\n")
    with pytest.raises(ScenarioError, match=r"bad.yaml: malformed YAML at line \d+, column \d+"):
        load_scenario(path)


@pytest.mark.parametrize(("text", "message"), [("- 1\n- 2\n", "expected a mapping of sections")])
def test_yaml_that_is_not_a_mapping_is_rejected(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "list.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(path)


def test_missing_yaml_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read scenario file"):
        load_scenario(tmp_path / "absent.yaml")


def test_unreachable_spare_target_asks_for_an_explicit_count() -> None:
    settings = {
        "cluster": {"gpus": 16},
        "failures": {"mttf_h": 0.1},
        "spares": {"repair_h": 100, "target_blocking": 1e-6},
    }
    with pytest.raises(ScenarioError, match=r"set spares\.count explicitly"):
        closed_form(scenario_from_dict(settings))
