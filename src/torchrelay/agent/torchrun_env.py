"""The environment torchrun gives a worker, as a torchrelay node gives it.

A script written for torchrun reads these (``init_process_group``'s ``env://``, a node count
from ``GROUP_WORLD_SIZE``, a resume decision from ``TORCHELASTIC_RESTART_COUNT``), so every
process of the job gets them, with the values torchrun would give. ``RANK`` and ``ROLE_RANK``
are each process's own (a spare gets them with its slot); ``TORCHELASTIC_USE_AGENT_STORE`` is
left out: torchrelay's default process group is its own (:mod:`runtime.default_group`).
"""

from __future__ import annotations

from torchrelay.config import JobConfig


def torchrun_environment(config: JobConfig, store_host: str, store_port: int) -> dict[str, str]:
    """The variables torchrun sets that are the same for every process of this node."""
    return {
        "MASTER_ADDR": store_host,
        "MASTER_PORT": str(store_port),
        "WORLD_SIZE": str(config.world_size),
        "LOCAL_WORLD_SIZE": str(config.nproc_per_node),
        "GROUP_RANK": str(config.node_rank),
        "GROUP_WORLD_SIZE": str(config.nnodes),
        "ROLE_NAME": config.role,
        "ROLE_WORLD_SIZE": str(config.world_size),
        "TORCHELASTIC_RUN_ID": config.run_id or config.run_dir.name,
        "TORCHELASTIC_MAX_RESTARTS": str(config.max_restarts),
        # torchrun counts restarts of the whole group; here only a restart from a durable
        # checkpoint is one (a replacement is not).
        "TORCHELASTIC_RESTART_COUNT": str(config.fallback[0] if config.fallback else 0),
    }
