"""Every process the node agent starts, forked from its template or not, keeps its heap in
transparent huge pages with glibc's per-thread cache off (``torchrelay.heap``), unless a switch
or the user's own tunable says otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs import printed_lines
from torchrelay.agent.agent import NodeAgent
from torchrelay.config import JobConfig
from torchrelay.heap import (
    HUGEPAGES_SWITCH,
    KEEP_LARGE_BLOCKS_SWITCH,
    TUNABLES,
    heap_environment,
    keeps_large_blocks,
)

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# 64 MiB written through malloc, then how much of this process's memory is in huge pages, and
# whether its environment lets runtime.allocator keep large blocks.
_WORKER = """
import os, re, signal
from torchrelay.heap import keeps_large_blocks
data = bytearray(b"\\x01") * (64 << 20)
rollup = open("/proc/self/smaps_rollup").read()
huge = re.search(r"AnonHugePages:\\s+(\\d+) kB", rollup).group(1)
print(huge, int(keeps_large_blocks(os.environ)), flush=True)
signal.pause()
"""


def _thp_mode() -> str:
    """The kernel's THP mode (``always``, ``madvise`` or ``never``), bracketed in the file."""
    text = THP_MODE.read_text() if THP_MODE.exists() else "[never]"
    return text.split("[", 1)[1].split("]", 1)[0]


BOTH = "glibc.malloc.hugetlb=1:glibc.malloc.tcache_count=0"


def test_the_tunables_are_added_to_the_users_own():
    assert heap_environment({}) == {TUNABLES: BOTH}
    assert heap_environment({TUNABLES: "glibc.malloc.arena_max=2"}) == {
        TUNABLES: f"glibc.malloc.arena_max=2:{BOTH}"
    }


def test_a_switch_or_the_users_setting_leaves_its_tunable_out():
    assert heap_environment({HUGEPAGES_SWITCH: "0"}) == {TUNABLES: "glibc.malloc.tcache_count=0"}
    assert heap_environment({KEEP_LARGE_BLOCKS_SWITCH: "0"}) == {TUNABLES: "glibc.malloc.hugetlb=1"}
    assert heap_environment({HUGEPAGES_SWITCH: "0", KEEP_LARGE_BLOCKS_SWITCH: "0"}) == {}
    users = "glibc.malloc.hugetlb=0:glibc.malloc.tcache_count=3"
    assert heap_environment({TUNABLES: users}) == {}


def test_large_blocks_are_kept_only_with_the_cache_off_and_the_switch_on():
    assert keeps_large_blocks({TUNABLES: BOTH})
    assert not keeps_large_blocks({TUNABLES: BOTH, KEEP_LARGE_BLOCKS_SWITCH: "0"})
    assert not keeps_large_blocks({})  # started without the agent's environment
    assert not keeps_large_blocks({TUNABLES: "glibc.malloc.tcache_count=3"})


@pytest.mark.skipif(_thp_mode() == "never", reason="the kernel's THP mode is never")
@pytest.mark.parametrize("template", [True, False], ids=["forked", "spawned"])
@pytest.mark.parametrize("switch", ["1", "0"])
def test_a_workers_heap_is_in_huge_pages_and_keeps_large_blocks(
    tmp_path, monkeypatch, template, switch
):
    if switch == "0" and _thp_mode() == "always":
        pytest.skip("with THP always on, every heap has huge pages")
    monkeypatch.setenv(HUGEPAGES_SWITCH, switch)
    monkeypatch.delenv(TUNABLES, raising=False)
    script = tmp_path / "heap.py"
    script.write_text(_WORKER)
    config = JobConfig(
        str(script),
        [],
        nproc_per_node=1,
        run_dir=tmp_path,
        console_ranks=frozenset(),
        template=template,
    )
    agent = NodeAgent(config, "node0", on_exit=lambda process, code: None)
    agent.configure(1, "127.0.0.1:1", "token")
    try:
        agent.start_workers()
        huge, keeps = map(int, printed_lines(agent.log_dir, ["worker0"])["worker0"].split())
    finally:
        agent.kill_all()
    assert keeps == 1  # the other switch: each leaves only its own tunable out
    if switch == "1":
        assert huge >= 32 << 10, f"only {huge} KiB of a 64 MiB heap in huge pages"
    else:
        assert huge == 0
