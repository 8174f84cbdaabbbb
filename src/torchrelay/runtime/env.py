"""What ``torchrelay run`` tells a process through its environment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class NotLaunchedError(RuntimeError):
    """The script was started without ``torchrelay run``."""


@dataclass(frozen=True)
class RelayEnv:
    """Identity and addresses of one process of a torchrelay job."""

    control: str
    token: str
    process: str
    role: str
    node: str
    run_dir: Path
    master_addr: str
    master_port: int
    world_size: int
    rank: int | None
    local_rank: int
    state: str = ""  # the job's state store (--state): where a new leader is announced
    elastic: bool = False  # --elastic: this process may host other ranks (runtime.hosting)
    forked: bool = False  # forked by the node's template (agent.template), not spawned

    @classmethod
    def from_environ(cls) -> RelayEnv:
        env = os.environ
        if "TORCHRELAY_CONTROL" not in env:
            raise NotLaunchedError(
                "torchrelay.init() needs the environment set by the launcher: start the script "
                "with `torchrelay run --nproc-per-node N --spares 1 script.py`"
            )
        return cls(
            control=env["TORCHRELAY_CONTROL"],
            token=env["TORCHRELAY_TOKEN"],
            process=env["TORCHRELAY_PROCESS"],
            role=env["TORCHRELAY_ROLE"],
            node=env.get("TORCHRELAY_NODE", "node0"),
            run_dir=Path(env["TORCHRELAY_RUN_DIR"]),
            master_addr=env["MASTER_ADDR"],
            master_port=int(env["MASTER_PORT"]),
            world_size=int(env["WORLD_SIZE"]),
            rank=int(env["RANK"]) if env.get("TORCHRELAY_ROLE") == "worker" else None,
            local_rank=int(env.get("LOCAL_RANK", "0")),
            state=env.get("TORCHRELAY_STATE", ""),
            elastic=env.get("TORCHRELAY_ELASTIC") == "1",
            forked="TORCHRELAY_TEMPLATE_PID" in env,
        )


def host_pid() -> int:
    """This process's PID as its node sees it (what an operator can signal or inspect). A
    transparent-mode worker runs in a PID namespace of its own, where it is PID 2, but shares
    the node's ``/proc``, whose ``self`` is named by the node's PID."""
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):  # no /proc (not Linux): no namespace either
        return os.getpid()
