"""A real Slurm cluster on this machine for tests: munged, slurmctld and a slurmd per node.

Node ``i`` is named ``127.0.0.<i+1>``, a loopback address of its own (all of 127/8 is
loopback), so a job of several nodes sees a real nodelist (``127.0.0.[1-2]``) whose first
host every node can reach. Everything the daemons read or write lives in a temporary directory
(slurm.conf, the munge key and socket, state, spools, logs, pid files) and they listen on free
ports, so the cluster neither needs nor touches a system Slurm. It runs as root
(``SlurmUser=root``), with the plugins that need no cgroups and no database:
``proctrack/linuxproc``, ``task/none``, no accounting. Job ids start at a random number, so
that clusters of concurrent test sessions derive different rendezvous ports from them.
Readiness and shutdown are events -- the munge socket appears, ``sinfo`` reports every node idle,
``squeue`` runs empty -- with generous timeouts as safety nets only.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "squeue", "scancel")

CONF = """\
ClusterName=torchrelay
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
FirstJobId={first_job}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/spool/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
NODE = "NodeName={name} NodeHostname=localhost Port={port} CPUs={cpus} RealMemory=1000"


def require_slurm() -> None:
    """Skip the test where Slurm cannot run here; under CI=true that is a failure instead."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    why = f"Slurm is not installed (missing {', '.join(missing)})" if missing else None
    if why is None and os.geteuid() != 0:
        why = "the local Slurm cluster runs its daemons as root"
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must provide it (scripts/setup.sh installs slurm-wlm, munge)")
        pytest.skip(why)


@dataclass
class SlurmCluster:
    root: Path
    env: dict[str, str]  # os.environ plus SLURM_CONF: what Slurm's commands need

    def command(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def logs(self) -> str:
        """The daemons' logs, for a failing assertion's message."""
        parts = []
        for log in sorted((self.root / "log").iterdir()):
            lines = log.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def wait_until(
        self,
        what: str,
        ready: Callable[[], bool],
        daemons: list[subprocess.Popen[bytes]],
        timeout: float = 120,
    ) -> None:
        """Poll ``ready()`` until it holds; fail at once if a daemon exits meanwhile."""
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [d.args[0] for d in daemons if d.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise AssertionError(f"Slurm: {what} never happened (exited: {dead})\n"
                                     + self.logs())  # fmt: skip
            time.sleep(0.2)


@contextlib.contextmanager
def local_slurm(root: Path, nodes: int) -> Iterator[SlurmCluster]:
    """A running cluster of ``nodes`` nodes in ``root``; every daemon and job is gone on exit."""
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir(mode=0o700, parents=True)
    key = root / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    ctld_port, *ports = _free_ports(1 + nodes)
    names = [f"127.0.0.{i + 1}" for i in range(nodes)]
    lines = [
        NODE.format(name=n, port=p, cpus=os.cpu_count() or 1)
        for n, p in zip(names, ports, strict=True)
    ]
    conf = root / "slurm.conf"
    conf.write_text(
        CONF.format(
            root=root,
            ctld_port=ctld_port,
            first_job=random.randrange(10_000, 1_000_000),
            nodes="\n".join(lines),
        )
    )
    cluster = SlurmCluster(root, {**os.environ, "SLURM_CONF": str(conf)})
    munge_socket = root / "munge" / "munge.socket"
    daemons: list[subprocess.Popen[bytes]] = []
    ready = False
    try:
        daemons.append(
            _start(
                cluster,
                "munged",
                "munged",
                "--foreground",
                "--force",  # the socket's directory is private, as munge's own check dislikes
                f"--key-file={key}",
                f"--socket={munge_socket}",
                f"--pid-file={root}/munge/munged.pid",
                f"--seed-file={root}/munge/seed",
                f"--log-file={root}/log/munged.log",
            )
        )
        cluster.wait_until("munged listening", munge_socket.exists, daemons)
        daemons.append(_start(cluster, "slurmctld", "slurmctld", "-D"))
        for name in names:
            daemons.append(_start(cluster, f"slurmd-{name}", "slurmd", "-D", "-N", name))
        idle = ["idle"] * nodes
        cluster.wait_until("every node idle", lambda: _node_states(cluster) == idle, daemons)
        ready = True
        yield cluster
    finally:
        if ready:
            _cancel_jobs(cluster, daemons)
        for daemon in reversed(daemons):
            _stop(daemon)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on every loopback address right now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _start(cluster: SlurmCluster, name: str, *argv: str) -> subprocess.Popen[bytes]:
    out = (cluster.root / "log" / f"{name}.out").open("wb")
    with out:  # the child holds its own descriptor
        return subprocess.Popen(
            argv, env=cluster.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _node_states(cluster: SlurmCluster) -> list[str]:
    done = cluster.command("sinfo", "--noheader", "--Node", "--format=%T", timeout=30)
    return done.stdout.split() if done.returncode == 0 else []


def _cancel_jobs(cluster: SlurmCluster, daemons: list[subprocess.Popen[bytes]]) -> None:
    """Cancel whatever a test left queued or running and wait for the queue to empty: a job's
    processes outlive slurmd by design, so they must go before the daemons do."""
    if any(d.poll() is not None for d in daemons):  # no cluster left to ask
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        cluster.command("scancel", "--user", "root", timeout=30)

    def empty() -> bool:
        done = cluster.command("squeue", "--noheader", timeout=30)
        return done.returncode == 0 and not done.stdout.strip()

    with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
        cluster.wait_until("the queue empty", empty, daemons, timeout=60)


def _stop(daemon: subprocess.Popen[bytes]) -> None:
    """SIGTERM the daemon's process group, then SIGKILL whatever is left of it (a helper such
    as slurmscriptd, or a daemon that lingers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(daemon.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        daemon.wait(timeout=15.0)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(daemon.pid, signal.SIGKILL)
    daemon.wait(timeout=15.0)
