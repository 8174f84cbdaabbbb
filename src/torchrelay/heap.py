"""The heap every process of a job starts with: glibc's tunables, set by the node agent.

Two settings go into ``GLIBC_TUNABLES`` of the template, every worker and every spare (read
once, by the dynamic loader, when a process starts; processes forked from the template inherit
its allocator as it is), each added to the tunables already there:

- ``glibc.malloc.hugetlb=1``: ``malloc`` asks the kernel for transparent huge pages
  (``madvise(MADV_HUGEPAGE)``) on the memory it maps: the CPU tensors torch allocates, the
  interpreter's heap. The kernel's teardown of a killed process, the floor under failure
  detection (nobody learns of a death before the dead process's memory is unmapped), then
  unmaps 2 MiB pages instead of 4 KiB ones: ~70 ms a resident GiB becomes about a tenth of
  that (``bench.exit_floor``; bench/analysis.md, "Sixteenth pass"). It does nothing where the
  kernel's THP mode is ``never``, and a glibc before 2.35 ignores it.
  ``TORCHRELAY_HUGEPAGES=0`` leaves it out, for hosts where THP's costs show: with the usual
  ``madvise`` setting of ``/sys/kernel/mm/transparent_hugepage/defrag``, a page fault in an
  advised region may wait for the kernel to compact fragmented memory, and a sparsely touched
  region holds 2 MiB where it held 4 KiB.
- ``glibc.malloc.tcache_count=0``: no per-thread cache of small freed blocks, so that a worker
  can keep its large freed blocks in its heap (:mod:`torchrelay.runtime.allocator`, which
  keeps them only where this is set). torch allocates tensors 64-byte aligned; glibc frees the
  few bytes an aligned block leaves over into that cache, where they keep the block from
  merging with its free neighbour, so a freed large block was too small for the next request
  of the same size and the heap grew by one such block a time until the cache's 7 places a
  size were full: a 48 MB block allocated and freed 40 times left 555-603 MB resident in 4 runs
  of 7, where the others and every run with the cache off held 267-315 MB
  (``tests/test_allocator.py``, bench/analysis.md, "Twentieth pass").
  ``TORCHRELAY_KEEP_LARGE_BLOCKS=0`` leaves it out.

A tunable the user already set is the user's choice and is kept as it is.
"""

from __future__ import annotations

from collections.abc import Mapping

HUGEPAGES_SWITCH = "TORCHRELAY_HUGEPAGES"
KEEP_LARGE_BLOCKS_SWITCH = "TORCHRELAY_KEEP_LARGE_BLOCKS"
TUNABLES = "GLIBC_TUNABLES"
HUGETLB = "glibc.malloc.hugetlb"
TCACHE_COUNT = "glibc.malloc.tcache_count"
# Each tunable added, with the switch that leaves it out and the value it is given.
SETTINGS = {HUGETLB: (HUGEPAGES_SWITCH, "1"), TCACHE_COUNT: (KEEP_LARGE_BLOCKS_SWITCH, "0")}


def _items(env: Mapping[str, str]) -> list[str]:
    """``env``'s ``GLIBC_TUNABLES`` as its ``name=value`` items, in order."""
    return [item for item in env.get(TUNABLES, "").split(":") if item]


def tunables(env: Mapping[str, str]) -> dict[str, str]:
    """The glibc tunables ``env`` sets, by name (a later setting of a name wins, as in glibc)."""
    return {name: value for name, _, value in (item.partition("=") for item in _items(env))}


def keeps_large_blocks(env: Mapping[str, str]) -> bool:
    """Whether a process started with ``env`` may keep its large freed blocks: not switched off,
    and glibc's per-thread cache off (see the module doc)."""
    return env.get(KEEP_LARGE_BLOCKS_SWITCH, "1") != "0" and tunables(env).get(TCACHE_COUNT) == "0"


def heap_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What to add to ``env`` for the processes started with it (see the module doc): ``{}``
    when both settings are switched off or already set by the user, else ``GLIBC_TUNABLES``
    with the missing ones appended to the tunables it had."""
    own = tunables(env)
    added = [
        f"{name}={value}"
        for name, (switch, value) in SETTINGS.items()
        if env.get(switch, "1") != "0" and name not in own
    ]
    if not added:
        return {}
    return {TUNABLES: ":".join([*_items(env), *added])}
