"""The ``torchrelay simulate`` subcommand: ``add_parser`` registers it, ``run`` executes it."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from torchrelay.simulate import presets
from torchrelay.simulate.analytic import Model, closed_form
from torchrelay.simulate.errors import ScenarioError
from torchrelay.simulate.measured import RunMeasurement, measure_run
from torchrelay.simulate.params import Scenario
from torchrelay.simulate.settings import merge, read_settings, scenario_from_dict

EXIT_BAD_INPUT = 2

DESCRIPTION = """\
What interruptions cost at cluster scale: effective training time ratio (ETTR) and dollars
lost with checkpoint-restart versus live recovery onto hot spares, from a closed form and a
seeded Monte Carlo simulation that must agree.

Settings layer as: --preset < --config YAML < flags. Examples:
  torchrelay simulate --preset claim-307k --model first-order
  torchrelay simulate --gpus 16384 --checkpoint-interval-h 1.5 --plot ettr.png
  torchrelay simulate --config scenario.yaml --from-run runs/job1 --json
See docs/simulate.md for the model, formulas and presets."""


@dataclass(frozen=True)
class _Flag:
    option: str
    section: str
    key: str
    type: Any
    help: str
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        return f"{self.section}.{self.key}"


_AUTO = "auto"


def _spare_count(text: str) -> int | str:
    return text if text == _AUTO else int(text)


_FLAGS = (
    _Flag("--gpus", "cluster", "gpus", int, "GPUs in the job"),
    _Flag("--price", "cluster", "price_per_gpu_h", float, "dollars per GPU-hour"),
    _Flag(
        "--mttf-h",
        "failures",
        "mttf_h",
        float,
        "job MTTF in hours at --gpus (overrides --calibration; per-GPU rate held at other sizes)",
    ),
    _Flag(
        "--calibration",
        "failures",
        "calibration",
        str,
        "published MTTF calibration, interpolated log-log between points",
        tuple(presets.CALIBRATIONS),
    ),
    _Flag(
        "--process", "failures", "process", str, "failure arrival process", ("poisson", "weibull")
    ),
    _Flag("--weibull-shape", "failures", "weibull_shape", float, "Weibull shape k (<1: bursty)"),
    _Flag("--mix", "failures", "mix", str, "failure-class mix", tuple(presets.MIXES)),
    _Flag(
        "--checkpoint-interval-h",
        "checkpoint",
        "interval_h",
        float,
        "hours between checkpoints (default: Young/Daly sqrt(2*save*MTTF))",
    ),
    _Flag("--checkpoint-save-s", "checkpoint", "save_s", float, "blocking save cost, seconds"),
    _Flag("--detect-s", "restart", "detect_s", float, "restart: failure detection, seconds"),
    _Flag("--replace-s", "restart", "replace_s", float, "restart: getting a replacement, s"),
    _Flag("--restore-s", "restart", "restore_s", float, "restart: loading the checkpoint, s"),
    _Flag("--startup-s", "restart", "startup_s", float, "restart: job start-up, seconds"),
    _Flag("--live-recovery-s", "live", "recovery_s", float, "live recovery pause, seconds"),
    _Flag("--coverage", "live", "coverage", float, "share of curable failures cured live"),
    _Flag(
        "--overhead",
        "live",
        "overhead",
        float,
        "steady-state throughput overhead of live "
        "recovery (default 0.01; a ledger 'bench' event wins with --from-run)",
    ),
    _Flag(
        "--warning-share",
        "live",
        "warning_share",
        float,
        "share of curable failures with warning signs (migrated proactively)",
    ),
    _Flag(
        "--spares",
        "spares",
        "count",
        _spare_count,
        "spare GPUs, or 'auto': smallest pool with blocking <= --target-blocking",
    ),
    _Flag(
        "--spare-source",
        "spares",
        "source",
        str,
        "idle pool or borrowed from a lower-priority job",
        ("idle", "borrowed"),
    ),
    _Flag("--repair-h", "spares", "repair_h", float, "hours until a used spare returns"),
    _Flag(
        "--target-blocking",
        "spares",
        "target_blocking",
        float,
        "auto-sized pool: acceptable share of failures finding it short",
    ),
    _Flag(
        "--preempt-gpu-h",
        "spares",
        "preempt_gpu_h",
        float,
        "borrowed spares: lower-priority GPU-hours lost per GPU taken",
    ),
    _Flag("--replications", "simulation", "replications", int, "Monte Carlo runs (0: skip)"),
    _Flag("--run-days", "simulation", "run_days", float, "length of each simulated run, days"),
    _Flag("--seed", "simulation", "seed", int, "Monte Carlo seed"),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``simulate`` subcommand and its flags on ``subparsers``."""
    parser = subparsers.add_parser(
        "simulate",
        help="what failures cost: checkpoint-restart vs live recovery, in ETTR and dollars",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(func=run)
    source = parser.add_argument_group("scenario source")
    claims = "; ".join(f"{name}: {p.claim}" for name, p in sorted(presets.SCENARIOS.items()))
    claims = claims.replace("%", "%%")  # argparse %-formats help strings
    source.add_argument(
        "--preset", choices=sorted(presets.SCENARIOS), help=f"scenario preset ({claims})"
    )
    source.add_argument("--config", type=Path, help="YAML scenario file")
    source.add_argument(
        "--from-run",
        type=Path,
        metavar="RUN_DIR",
        help="take recovery time, coverage, overhead from RUN_DIR/ledger.jsonl",
    )
    source.add_argument(
        "--burst-share",
        type=float,
        default=0.0,
        help="share of interruptions that are correlated bursts (rack, power)",
    )
    source.add_argument("--burst-gpus", type=int, default=32, help="GPUs lost per burst")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for flag in _FLAGS:
        group = groups.setdefault(flag.section, parser.add_argument_group(flag.section))
        metavar = None if flag.choices else flag.option.lstrip("-").upper().replace("-", "_")
        group.add_argument(
            flag.option,
            dest=flag.dest,
            type=flag.type,
            choices=flag.choices,
            metavar=metavar,
            help=flag.help,
        )
    output = parser.add_argument_group("output")
    output.add_argument(
        "--model",
        choices=[m.value for m in Model],
        default=Model.EXACT.value,
        help="closed form used for the dollar columns (table shows both ETTRs)",
    )
    output.add_argument("--json", action="store_true", help="print JSON instead of the table")
    output.add_argument("--plot", type=Path, metavar="PNG", help="write ETTR vs cluster size")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    settings: dict[str, Any] = read_settings(args.config) if args.config else {}
    if args.preset:
        settings["preset"] = args.preset
    overrides: dict[str, dict[str, Any]] = {}
    for flag in _FLAGS:
        value = getattr(args, flag.dest)
        if value is not None:
            overrides.setdefault(flag.section, {})[flag.key] = None if value == _AUTO else value
    # Choosing a calibration on the command line means: stop using any explicit MTTF.
    failures = overrides.get("failures", {})
    if "calibration" in failures and "mttf_h" not in failures:
        failures["mttf_h"] = None
    return merge(settings, overrides)


def _scenario(args: argparse.Namespace) -> tuple[Scenario, RunMeasurement | None]:
    scenario = scenario_from_dict(_settings(args))
    if args.burst_share:
        scenario = replace(
            scenario, failures=scenario.failures.with_burst(args.burst_share, args.burst_gpus)
        )
    if args.from_run is None:
        return scenario, None
    measurement = measure_run(args.from_run, default_overhead=scenario.live.overhead)
    try:
        live = measurement.applied_to(scenario.live)
    except ScenarioError as err:
        raise ScenarioError(f"--from-run {args.from_run}: measured {err}") from None
    return replace(scenario, live=live), measurement


def run(args: argparse.Namespace) -> int:
    """Execute ``simulate``; 0 on success, 2 with a one-line reason on bad input."""
    # numpy, matplotlib and rich load here, not when the parser is built (``--help``).
    from rich.console import Console

    from torchrelay.simulate.montecarlo import monte_carlo
    from torchrelay.simulate.report import Results, plot_ettr, print_report, to_dict
    from torchrelay.simulate.sweep import DEFAULT_MC_SIZES, DEFAULT_SIZES, sweep

    try:
        scenario, measurement = _scenario(args)
        results = Results(
            scenario=scenario,
            exact=closed_form(scenario, Model.EXACT),
            first_order=closed_form(scenario, Model.FIRST_ORDER),
            monte_carlo=monte_carlo(scenario) if scenario.simulation.replications else None,
            measurement=measurement,
        )
        if args.json:
            print(json.dumps(to_dict(results), indent=2))
        else:
            print_report(Console(), results, Model(args.model))
        if args.plot:
            points = sweep(scenario, (*DEFAULT_SIZES, scenario.cluster.gpus), DEFAULT_MC_SIZES)
            title = (
                f"MTTF: {_calibration_label(scenario)}; checkpoint "
                f"{_interval_label(scenario)}; live recovery {scenario.live.recovery_s:g} s, "
                f"coverage {scenario.live.coverage:.0%}, overhead {scenario.live.overhead:.0%}"
            )
            plot_ettr(points, args.plot, title)
    except ScenarioError as err:
        print(f"torchrelay simulate: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as err:
        print(
            f"torchrelay simulate: error: cannot write {err.filename}: {err.strerror}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    return 0


def _calibration_label(scenario: Scenario) -> str:
    failures = scenario.failures
    if failures.mttf_h is not None:
        return f"{failures.mttf_h:g} h at {scenario.cluster.gpus:,} GPUs, per-GPU rate held"
    if isinstance(failures.calibration, str):
        return f"{failures.calibration} (log-log)"
    return "custom calibration (log-log)"


def _interval_label(scenario: Scenario) -> str:
    interval = scenario.checkpoint.interval_h
    return f"every {interval:g} h" if interval else "at Young/Daly optimum"
