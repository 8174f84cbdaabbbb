"""Named inputs: published calibration points, a published failure mix, and the vendor claims.

Presets are plain data in the same shape a YAML scenario file uses, so one loader validates
both. Every published number carries its source; every number that is *not* published (a
blast radius, whether a class is curable, a split of the restart time) is labelled an
assumption in ``docs/simulate.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchrelay.simulate.errors import ScenarioError

KOKOLIS_2024 = (
    "Kokolis et al., 'Revisiting Reliability in Large-Scale Machine Learning Research "
    "Clusters', HPCA 2025, arXiv:2410.21680 (Meta RSC clusters)"
)
LLAMA3_2024 = (
    "Llama Team, AI @ Meta, 'The Llama 3 Herd of Models', arXiv:2407.21783, Sec. 3.3.4 and "
    "Table 5 (Llama 3 405B pre-training, 16,384 H100 GPUs, 54 days)"
)


@dataclass(frozen=True)
class CalibrationPreset:
    """Published (cluster size in GPUs, job mean time to failure in hours) points and source."""

    points: tuple[tuple[int, float], ...]
    source: str


@dataclass(frozen=True)
class MixPreset:
    """A failure-class mix: (name, relative weight, GPUs lost per event, curable by a spare)."""

    classes: tuple[tuple[str, float, int, bool], ...]
    source: str


@dataclass(frozen=True)
class ScenarioPreset:
    """A whole scenario as YAML-shaped settings, plus the claim it is meant to reproduce."""

    settings: Mapping[str, Any]
    claim: str


CALIBRATIONS: Mapping[str, CalibrationPreset] = {
    # Job MTTF measured for 1,024-GPU jobs and projected for 16,384-GPU jobs on RSC-1.
    "kokolis2024": CalibrationPreset(points=((1024, 7.9), (16384, 1.8)), source=KOKOLIS_2024),
    # 419 unexpected interruptions in 54 days on 16,384 GPUs: 54 * 24 / 419 = 3.09 h.
    "llama3-405b": CalibrationPreset(points=((16384, 54 * 24 / 419),), source=LLAMA3_2024),
}

MIXES: Mapping[str, MixPreset] = {
    "single-gpu": MixPreset(
        classes=(("gpu", 1.0, 1, True),),
        source="default: every interruption is one curable GPU failure",
    ),
    # Interruption counts from Llama 3 Table 5 (they sum to 419). Blast radius (1 GPU for a
    # GPU component, 8 = one server for host and link faults) and curability (a spare cannot
    # fix a software bug, an unexplained watchdog timeout, or corruption found after the fact)
    # are this simulator's assumptions, not Meta's.
    "llama3-405b": MixPreset(
        classes=(
            ("faulty-gpu", 148, 1, True),
            ("gpu-hbm3", 72, 1, True),
            ("software-bug", 54, 1, False),
            ("network-switch-cable", 35, 8, True),
            ("host-maintenance", 32, 8, True),
            ("gpu-sram", 19, 1, True),
            ("gpu-system-processor", 17, 1, True),
            ("nic", 7, 8, True),
            ("nccl-watchdog-timeout", 7, 1, False),
            ("silent-data-corruption", 6, 1, False),
            ("gpu-thermal", 6, 1, True),
            ("ssd", 3, 8, True),
            ("power-supply", 3, 8, True),
            ("server-chassis", 2, 8, True),
            ("io-expansion-board", 2, 8, True),
            ("dependency", 2, 1, False),
            ("cpu", 2, 8, True),
            ("system-memory", 2, 8, True),
        ),
        source=LLAMA3_2024,
    ),
}

# The vendor claims, as inputs only: the numbers they quote are computed, never stored here.
_VENDOR_CHECKPOINT: Mapping[str, Any] = {"interval_h": 1.5, "save_s": 0.0}

SCENARIOS: Mapping[str, ScenarioPreset] = {
    "claim-307k": ScenarioPreset(
        settings={
            "checkpoint": _VENDOR_CHECKPOINT,
            "cluster": {"gpus": 1024, "price_per_gpu_h": 3.0},
            "failures": {"mttf_h": 7.9},
        },
        claim="about $307K/month wasted at 1,024 GPUs",
    ),
    "claim-6m": ScenarioPreset(
        settings={
            "checkpoint": _VENDOR_CHECKPOINT,
            "cluster": {"gpus": 2048, "price_per_gpu_h": 3.0},
            # Assumption: the job MTTF stays at the published 1,024-GPU value.
            "failures": {"mttf_h": 7.9},
        },
        claim="over $6M/year wasted at 2,048 GPUs",
    ),
    "claim-16k": ScenarioPreset(
        settings={
            "checkpoint": _VENDOR_CHECKPOINT,
            "cluster": {"gpus": 16384, "price_per_gpu_h": 3.0},
            "failures": {"calibration": "kokolis2024"},
            "live": {"recovery_s": 90.0, "coverage": 1.0, "overhead": 0.0},
        },
        claim="ETTR near 40% with checkpoint-restart, 98-99% with 60-120 s live recovery",
    ),
}


def lookup(table: Mapping[str, Any], kind: str, name: str) -> Any:
    """The preset ``name`` from ``table``; an unknown name is a ``ScenarioError`` listing all."""
    try:
        return table[name]
    except KeyError:
        known = ", ".join(sorted(table))
        raise ScenarioError(f"unknown {kind} preset {name!r}; known: {known}") from None
