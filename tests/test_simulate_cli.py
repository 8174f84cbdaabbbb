"""The command line and ``--from-run``: exit codes, table, JSON, plot, measured figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchrelay.cli.main import main
from torchrelay.simulate import measure_run

QUICK = ["--replications", "4", "--run-days", "5"]


def _ledger(run_dir: Path, lines: list[str]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "ledger.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


def _failure(t: float, slot: int) -> str:
    return json.dumps(
        {
            "t": t,
            "event": "failure",
            "slot": slot,
            "process": f"worker{slot}",
            "last_reported_step": 3,
            "cause": "killed by SIGKILL",
            "kind": "signal",
            "detected_by": "process exit",
        }
    )


def _recovered(t: float, seconds: float, lost_steps: int) -> str:
    fields = {"slots": [0], "failures": [], "target_step": 3, "timeline": {}}
    cost = {"bytes_transferred": 0, "lost_steps": lost_steps, "recomputed_steps": 0}
    times = {"recovery_seconds": seconds, "stall_seconds": seconds}
    return json.dumps({"t": t, "event": "recovery_done", **fields, **times, **cost})


LEDGER = [
    '{"t": 1.0, "event": "job_start", "world_size": 8}',
    _failure(2.0, 3),
    _recovered(4.3, 2.3, 0),
    _failure(9.0, 1),
    _recovered(13.0, 4.0, 0),
    _failure(20.0, 5),
    _recovered(29.0, 9.0, 3),
    _failure(30.0, 6),
    "[1, 2]",
    '{"t": 31.0, "event": "recovery_done", "recovery_seconds": "fast"}',  # malformed: skipped
    '{"t": 35.0, "event": "from_a_newer_version", "x": 1}',  # unknown: skipped
    '{"t": 40.0, "event": "job_end"}',
    '{"t": 41.0, "event": "recov',  # torn last line: the launcher crashed mid-write
]


def test_from_run_measures_median_coverage_and_default_overhead(tmp_path: Path) -> None:
    measured = measure_run(_ledger(tmp_path / "run", LEDGER), default_overhead=0.03)
    assert measured.failures == 4
    assert measured.recoveries == 3  # the malformed one is not counted
    assert measured.recovery_s == pytest.approx(4.0)  # median of 2.3, 4.0, 9.0
    assert measured.coverage == pytest.approx(2 / 4)  # lost_steps 0, per failure
    assert measured.overhead == 0.03
    assert not measured.overhead_measured


def test_from_run_bench_event_sets_overhead(tmp_path: Path) -> None:
    lines = [*LEDGER[:-1], '{"t": 50.0, "event": "bench", "overhead": 0.021}']
    measured = measure_run(_ledger(tmp_path / "run", lines), default_overhead=0.01)
    assert measured.overhead == pytest.approx(0.021)
    assert measured.overhead_measured


def test_from_run_without_failures_is_an_error(tmp_path: Path, capsys) -> None:
    run_dir = _ledger(tmp_path / "run", ['{"t": 1.0, "event": "job_end"}'])
    assert main(["simulate", "--from-run", str(run_dir), *QUICK]) == 2
    assert "no 'failure' events" in capsys.readouterr().err


def test_cli_json_uses_the_measured_run(tmp_path: Path, capsys) -> None:
    run_dir = _ledger(tmp_path / "run", LEDGER)
    argv = ["simulate", "--preset", "claim-16k", "--from-run", str(run_dir), "--json", *QUICK]
    assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    live = document["scenario"]["live"]
    assert live == {"recovery_s": 4.0, "coverage": 0.5, "overhead": 0.0, "warning_share": 0.0}
    exact = document["closed_form"]["exact"]
    assert exact["checkpoint-restart"]["ettr"] == pytest.approx(0.532, abs=0.002)
    assert document["closed_form"]["first-order"]["checkpoint-restart"]["ettr"] == pytest.approx(
        0.398, abs=0.001
    )
    assert document["monte_carlo"]["replications"] == 4
    assert document["measured_run"]["failures"] == 4


def test_cli_table_reproduces_the_307k_claim(capsys) -> None:
    argv = ["simulate", "--preset", "claim-307k", "--model", "first-order", "--replications", "0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "$307.52K" in out
    assert "1,024 GPUs" in out


def test_cli_flags_override_preset_and_calibration_clears_explicit_mttf(capsys) -> None:
    argv = ["simulate", "--preset", "claim-6m", "--calibration", "kokolis2024", "--json"]
    assert main([*argv, "--gpus", "4096", "--spares", "auto", *QUICK]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["scenario"]["cluster"]["gpus"] == 4096
    assert document["scenario"]["failures"]["mttf_h"] is None
    assert document["mttf_h"] == pytest.approx((7.9 * 1.8) ** 0.5)


def test_cli_burst_class_needs_spares_for_the_whole_burst(capsys) -> None:
    argv = ["simulate", "--gpus", "16384", "--burst-share", "0.1", "--burst-gpus", "64"]
    assert main([*argv, "--spares", "32", "--coverage", "1", "--json", *QUICK]) == 0
    document = json.loads(capsys.readouterr().out)
    live = document["closed_form"]["exact"]["live-recovery"]
    assert live["live_share"] <= 0.9 + 1e-9  # bursts of 64 never fit in 32 spares


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--coverage", "1.5"], "live.coverage: must be in [0, 1]"),
        (["--mttf-h", "-2"], "failures.mttf_h: must be a finite number > 0"),
        (["--from-run", "/nonexistent/run"], "no ledger.jsonl there"),
        (["--burst-share", "1.0"], "burst share: must be in [0, 1)"),
    ],
)
def test_cli_bad_input_exits_2_with_a_reason(argv: list[str], message: str, capsys) -> None:
    assert main(["simulate", *argv, *QUICK]) == 2
    assert message in capsys.readouterr().err


def test_cli_malformed_yaml_exits_2(tmp_path: Path, capsys) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("live: {coverage: [\n")
    assert main(["simulate", "--config", str(config), *QUICK]) == 2
    assert "malformed YAML at line" in capsys.readouterr().err


def test_cli_unknown_preset_is_rejected_by_argparse(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["simulate", "--preset", "nope"])
    assert exited.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_cli_writes_the_plot(tmp_path: Path) -> None:
    target = tmp_path / "ettr.png"
    assert main(["simulate", "--preset", "claim-16k", "--plot", str(target), *QUICK]) == 0
    assert target.read_bytes().startswith(b"\x89PNG")


def test_cli_help_lists_presets_and_flags(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["simulate", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "claim-16k: ETTR near 40%" in out
    assert "--checkpoint-interval-h" in out
