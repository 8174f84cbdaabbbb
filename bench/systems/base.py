"""What a system is given (:class:`RunSpec`) and what it hands back (:class:`RunOutput`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class RunSpec:
    """One job: the workload, the failure schedule and a fresh directory for its files."""

    model: str
    steps: int
    world: int
    kill_steps: tuple[int, ...]
    kill_rank: int
    workdir: Path
    timeout_s: float

    @property
    def progress_file(self) -> Path:
        return self.workdir / "progress.txt"

    @property
    def weights_file(self) -> Path:
        return self.workdir / "weights.pt"

    def worker_args(self) -> list[str]:
        """The shared worker flags (see ``bench.workload.worker_args``)."""
        return [
            "--model",
            self.model,
            "--steps",
            str(self.steps),
            "--progress-file",
            str(self.progress_file),
            "--out",
            str(self.weights_file),
            "--kill-rank",
            str(self.kill_rank),
            "--kill-steps",
            ",".join(map(str, self.kill_steps)),
            "--marker-dir",
            str(self.workdir),
        ]


@dataclass
class RunOutput:
    """Where a finished job left its results. ``wall_s`` is launch to exit of the job."""

    wall_s: float
    returncode: int
    ledger: Path | None = None
    notes: list[str] = field(default_factory=list)


class System(Protocol):
    """A way to run the workload. ``run`` returns after the job ended (or raises)."""

    name: str
    label: str
    tolerates_failures: bool

    def run(self, spec: RunSpec) -> RunOutput: ...
