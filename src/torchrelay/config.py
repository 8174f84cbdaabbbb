"""Job configuration shared by the launcher, the controller and the agent."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torchrelay.chaos import ChaosEvent
from torchrelay.checkpoints import Choice, Every
from torchrelay.control.store.url import StoreSpec
from torchrelay.health.policy import HealthPolicy


@dataclass(frozen=True)
class PoolSpec:
    """``torchrelay run --pool ADDR``: where the pool is, its token, and how this job
    attaches (``name``, ``priority``: higher is more important; ``parkable``: the job may
    park whole when it cannot shrink, see :mod:`torchrelay.control.parking`)."""

    address: str
    token: str
    name: str
    priority: int = 0
    parkable: bool = True


@dataclass
class JobConfig:
    """Everything that defines one torchrelay job on this launcher.

    ``max_restarts`` mirrors torchrun: how many times a failure that looks like a bug in the
    script (a Python exception, a non-zero exit) is answered by handing the slot to a
    replacement before the job stops. Hardware-like failures (killed by a signal) are recovered
    as long as spares exist. ``spare_timeout`` bounds how long a recovery waits for a spare;
    ``halt_timeout`` bounds how long it waits for survivors to stop their step in flight.
    A process whose heartbeats stop for ``max(hang_floor, hang_factor x median step time)``
    is declared hung and fenced (the same timeout applies to a process stuck inside one step,
    see :mod:`torchrelay.control.detection`). A remote node agent unheard of for
    ``node_timeout`` seconds is declared lost, and an agent cut off from the controller that
    long kills its own workers. A rank whose compute time per step exceeds ``straggler_ratio``
    times its peers' median is reported as a straggler.
    """

    script: str
    script_args: list[str]
    nproc_per_node: int
    run_dir: Path
    module: bool = False  # -m: ``script`` is a module, run as ``python -m script``
    # The job's id, given to the script as torchrun gives it (TORCHELASTIC_RUN_ID); "": the
    # run directory's name.
    run_id: str = ""
    role: str = "default"  # the workers' ROLE_NAME, as torchrun's --role gives it
    spares: int = 1
    # Workers and spares forked from a per-node template that has imported torch
    # (agent/template.py); False: each is a fresh interpreter.
    template: bool = True
    nnodes: int = 1
    node_rank: int = 0
    max_restarts: int = 3
    spare_timeout: float = 300.0
    halt_timeout: float = 120.0
    collective_timeout: float = 300.0
    hang_floor: float = 10.0
    hang_factor: float = 10.0
    node_timeout: float = 10.0
    straggler_ratio: float = 1.5
    drain_stragglers: int = 0  # hand a straggler's slot over after this many rounds; 0: never
    # --elastic: a lost slot with no spare in sight is hosted by a survivor (docs/elastic.md)
    # as long as at least ``min_nproc`` processes remain.
    elastic: bool = False
    min_nproc: int = 1
    # --pool: the pool this job takes its spares from (docs/pool.md); None: none.
    pool: PoolSpec | None = None
    chaos: list[ChaosEvent] = field(default_factory=list)
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    # Local ranks (a slot's index on its node) whose processes' output the console shows with a
    # prefix (agent/console.py); None: every process's, spares' included; empty: none (--quiet).
    # Every line is in RUN_DIR/logs/ either way.
    console_ranks: frozenset[int] | None = None
    state: StoreSpec = field(default_factory=StoreSpec)
    metrics_port: int = 0  # Prometheus metrics on master_addr:metrics_port; 0: none
    # Seconds between two polls of each node's device health (NVML, injected readings);
    # 0: not polled. The policy judges the readings (docs/health.md).
    health_poll: float = 0.0
    health_policy: HealthPolicy = field(default_factory=HealthPolicy)
    checkpoint_dir: Path | None = None  # durable checkpoints (docs/checkpoints.md); None: none
    checkpoint_every: Every | None = None
    transparent: bool = False  # --transparent: an unmodified script (docs/transparent.md)
    resume: Choice | None = None  # --resume: the checkpoint chosen to go on from
    fallback: tuple[int, str] | None = (
        None  # a restart from it: (attempt, why live recovery failed)
    )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def rendezvous_timeout(self) -> float:
        """How long a recovery's communicator may take to connect once its members have met
        on the store: a quarter of ``halt_timeout`` (at most ``collective_timeout``). Nothing
        interrupts gloo's rendezvous, so a member dying inside it holds the others that long;
        they must still be able to halt for the next plan within ``halt_timeout``."""
        return min(self.collective_timeout, self.halt_timeout / 4)
