"""Processes started by the agent die with the launcher, and only with it (not with the
thread that happened to start them): :mod:`torchrelay.agent.spawn`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from tests import procs
from torchrelay.agent.spawn import TRAMPOLINE, await_group_end, signal_group, spawn

# Answers each line on stdin with its pid: proof of life, paced by our own writes.
ECHO = [sys.executable, "-c", "import os, sys\nfor _ in sys.stdin: print(os.getpid(), flush=True)"]


def test_a_process_started_by_a_thread_that_ends_lives_on():
    # Spares are started from recovery and RPC threads; Linux sends the parent-death signal
    # when the thread that forked a child exits. The child must not go with that thread.
    started: list[subprocess.Popen] = []
    native: list[int] = []

    def start() -> None:
        native.append(threading.get_native_id())
        proc = spawn(ECHO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        started.append(proc)
        _ping(proc)  # past the trampoline: its parent-death signal is armed

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    (proc,) = started
    try:
        # The kernel has sent any parent-death signal once the thread is fully gone.
        assert _gone_task(native[0])
        _ping(proc)
        assert os.getpgid(proc.pid) == proc.pid  # it leads a process group of its own
    finally:
        proc.kill()
        proc.wait()


def _ping(proc: subprocess.Popen) -> None:
    try:
        proc.stdin.write("alive?\n")
        proc.stdin.flush()
    except BrokenPipeError:
        raise AssertionError(f"it died: {proc.wait()}") from None
    assert proc.stdout.readline().strip() == str(proc.pid), f"it died: {proc.wait()}"


def _gone_task(tid: int) -> bool:
    deadline = time.monotonic() + 30.0
    while Path(f"/proc/self/task/{tid}").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_processes_die_with_the_process_that_started_them_even_stopped(tmp_path):
    parent = textwrap.dedent(
        """
        import os, signal, subprocess, sys
        from torchrelay.agent.spawn import spawn
        sleeper = [sys.executable, "-c", "import time; print(flush=True); time.sleep(600)"]
        children = [spawn(sleeper, stdout=subprocess.PIPE) for _ in range(2)]
        for child in children:
            child.stdout.readline()  # it runs the command now, past the trampoline
        os.kill(children[1].pid, signal.SIGSTOP)
        print(*(c.pid for c in children), flush=True)
        signal.pause()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", parent],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    children = [int(pid) for pid in proc.stdout.readline().split()]
    assert len(children) == 2
    proc.kill()
    proc.wait()
    assert all(procs.await_gone(pid) for pid in children), (
        "a child outlived the process that started it"
    )


def test_a_launcher_dead_before_the_request_takes_its_process_with_it():
    # The trampoline finds its parent is not the launcher (it died between fork and prctl).
    not_the_parent = 1
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(TRAMPOLINE), str(not_the_parent), "/bin/true"],
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL


def test_a_group_ends_when_its_last_member_has_gone_not_when_its_leader_has():
    """What a process leaves in its group (its exit holder, data loader workers) is waited
    for: the leader reaped, a member that outlives it keeps the group."""
    script = "import subprocess, sys\nprint(subprocess.Popen(['cat']).pid, flush=True)\n"
    leader = spawn([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert leader.stdout is not None and leader.stdin is not None
    member = int(leader.stdout.readline())  # `cat`, reading the pipe we hold open
    assert leader.wait(timeout=60) == 0  # the leader is gone; `cat` is still in its group
    assert not await_group_end(leader.pid, timeout=0.2)
    signal_group(leader.pid, signal.SIGKILL)
    assert await_group_end(leader.pid, timeout=60)
    assert procs.await_gone(member)  # at once: the group is empty
    leader.stdin.close()


def test_a_group_whose_members_are_all_zombies_has_ended():
    """A member that exited but is not reaped yet (an orphaned exit holder waits for init,
    which in a container may reap late or never) holds no memory and no descriptor: the
    group has ended, although signalling it still succeeds."""
    leader = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    while procs.state(leader.pid) != "Z":  # exited, not reaped
        time.sleep(0.01)
    os.killpg(leader.pid, 0)  # the group still answers
    assert await_group_end(leader.pid, timeout=60)
    assert leader.wait(timeout=60) == 0
