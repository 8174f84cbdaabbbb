"""Transparent huge pages for the heap of every process the node agent starts.

glibc's ``glibc.malloc.hugetlb=1`` tunable makes ``malloc`` ask the kernel for transparent huge
pages (``madvise(MADV_HUGEPAGE)``) on the memory it maps: the CPU tensors torch allocates, the
interpreter's heap. The kernel's teardown of a killed process, the floor under failure
detection (nobody learns of a death before the dead process's memory is unmapped), then
unmaps 2 MiB pages instead of 4 KiB ones: ~70 ms a resident GiB becomes about a tenth of that
(``bench.exit_floor``; bench/analysis.md, "Sixteenth pass"). A steady step is not faster
(``bench.steady_ab``): :mod:`torchrelay.runtime.allocator` already keeps a worker's freed
heap mapped, so steps take no page faults either way.

The setting is read once, by the dynamic loader when a process starts, so it goes in the
environment the template and every worker and spare start with; processes forked from the
template inherit its allocator as it is. It does nothing where the kernel's THP mode is
``never``, and a glibc that lacks the tunable (before 2.35) ignores it.

``TORCHRELAY_HUGEPAGES=0`` leaves the environment as it is, for hosts where THP's costs show:
with the usual ``madvise`` setting of ``/sys/kernel/mm/transparent_hugepage/defrag``, a page
fault in an advised region may wait for the kernel to compact fragmented memory, and a
sparsely touched region holds 2 MiB where it held 4 KiB. A ``GLIBC_TUNABLES`` that already
sets ``glibc.malloc.hugetlb`` is the user's choice and is kept as it is.
"""

from __future__ import annotations

from collections.abc import Mapping

SWITCH = "TORCHRELAY_HUGEPAGES"
TUNABLES = "GLIBC_TUNABLES"
HUGETLB = "glibc.malloc.hugetlb"


def hugepage_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What to add to ``env`` so that the processes started with it use huge pages for their
    heap: ``{}`` when switched off or when ``env`` already sets the tunable, else
    ``GLIBC_TUNABLES`` with ``glibc.malloc.hugetlb=1`` appended to the tunables it had."""
    if env.get(SWITCH, "1") == "0":
        return {}
    tunables = [item for item in env.get(TUNABLES, "").split(":") if item]
    if any(item.partition("=")[0] == HUGETLB for item in tunables):
        return {}
    return {TUNABLES: ":".join([*tunables, f"{HUGETLB}=1"])}
