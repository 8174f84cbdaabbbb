"""The stable process group as torch.distributed's default (WORLD) group.

Ordinary torch.distributed code asks the default group for everything it is not handed
explicitly: ``DistributedSampler(dataset)``, ``dist.get_rank()``, ``dist.get_world_size()``,
``dist.all_reduce(t)``, ``dist.barrier()``, ``dist.destroy_process_group()``. :func:`install`
registers the :class:`StableProcessGroup` in c10d's world the way ``init_process_group`` does
for its own group, so that code runs unchanged and its collectives follow the communicator
through every generation (a failed one poisons the step like any other).

Contract:

- the world size is the job's; ``dist.get_rank()`` is the slot. On a spare that has no slot
  yet it answers 0: the spare runs its setup as a local stand-in (collectives answer locally,
  see :mod:`facade`). ``relay.is_spare`` tells the two apart; ``relay.steps`` fixes the rank
  of the ``DistributedSampler`` of a loader it is given (see :mod:`data`).
- ``dist.init_process_group(...)`` after ``torchrelay.init()`` does nothing: the default group
  exists already (its arguments, backend included, are ignored; the relay chose the device).
  Called under a name bound before ``torchrelay.init()`` (``from torch.distributed import
  init_process_group``), c10d itself refuses it; the worker's excepthook then adds one line
  saying to remove the call.
- ``dist.destroy_process_group()`` unregisters the group only: the relay keeps its
  communicator to the job's end (the training loop has already waited for it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from torchrelay.runtime.facade import StableProcessGroup

BACKEND = "torchrelay"
GROUP_NAME = "0"  # what init_process_group names the default group
REINIT_ADVICE = (
    "torchrelay: torchrelay.init() already set up the default process group; remove the "
    "init_process_group(...) call (or call it as dist.init_process_group, which then does "
    "nothing)"
)


class DefaultGroupError(RuntimeError):
    """The default process group was set up by someone else; the message says what to do."""


def install(group: StableProcessGroup, store: dist.Store) -> None:
    """Make ``group`` the default process group (raises :class:`DefaultGroupError` if the
    script created one itself before ``torchrelay.init()``)."""
    if dist.is_initialized():
        raise DefaultGroupError(
            "torchrelay.init() sets up the default process group itself: remove the "
            "init_process_group(...) call that comes before it"
        )
    world = c10d._world
    world.pg_map[group] = (BACKEND, store)
    world.pg_names[group] = GROUP_NAME
    world.pg_backend_config[group] = BACKEND
    world.pg_group_ranks[group] = {r: r for r in range(group.size())}
    world.tags_to_pg.setdefault("", []).append(group)
    world.tags_to_pg.setdefault(f"ptd:{GROUP_NAME}", []).append(group)
    world.pg_to_tag[group] = f"ptd:{GROUP_NAME}"
    group._set_group_name(GROUP_NAME)
    c10d._register_process_group(GROUP_NAME, group)
    c10d._update_default_pg(group)
    for module in (dist, c10d):
        if not getattr(module.init_process_group, "_torchrelay", False):
            module.init_process_group = _ignored_when_relayed(module.init_process_group)


def set_store(group: StableProcessGroup, store: dist.Store | None) -> None:
    """Replace the store c10d's world keeps for the default group (transparent mode drops it
    while the process is copied: it holds a socket)."""
    c10d._world.pg_map[group] = (BACKEND, store)  # type: ignore[assignment]


def _ignored_when_relayed(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if isinstance(c10d._world.default_pg, StableProcessGroup):
            return None  # the relay's group is the default group already
        return original(*args, **kwargs)

    init_process_group._torchrelay = True  # type: ignore[attr-defined]
    return init_process_group


def is_reinit_error(exc: BaseException) -> bool:
    """Whether ``exc`` is c10d refusing a second ``init_process_group`` (see module doc)."""
    return isinstance(exc, ValueError) and "default process group twice" in str(exc)
