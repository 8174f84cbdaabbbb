"""A real one-node Slurm cluster for tests: munged, slurmctld and slurmd in a temporary directory.

Everything the daemons read or write lives under that directory (slurm.conf, the munge key and
socket, state, spool, logs, pid files) and they listen on free ports, so the cluster neither
needs nor touches a system Slurm. It runs as root (``SlurmUser=root``), with the plugins that
need no cgroups and no database: ``proctrack/linuxproc``, ``task/none``, no accounting.
Readiness and shutdown are events -- the munge socket appears, ``sinfo`` reports the node idle,
``squeue`` runs empty -- with generous timeouts as safety nets only.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.jobs import free_port_pair

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "squeue", "scancel")

CONF = """\
ClusterName=torchrelay
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
NodeName=localhost CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


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
def local_slurm(root: Path) -> Iterator[SlurmCluster]:
    """A running one-node cluster in ``root``; every daemon and job is gone on exit."""
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir(mode=0o700, parents=True)
    key = root / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    port = free_port_pair()
    conf = root / "slurm.conf"
    conf.write_text(
        CONF.format(root=root, ctld_port=port, slurmd_port=port + 1, cpus=os.cpu_count() or 1)
    )
    cluster = SlurmCluster(root, {**os.environ, "SLURM_CONF": str(conf)})
    socket = root / "munge" / "munge.socket"
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        daemons.append(
            _start(
                cluster,
                "munged",
                "--foreground",
                "--force",  # the socket's directory is private, as munge's own check dislikes
                f"--key-file={key}",
                f"--socket={socket}",
                f"--pid-file={root}/munge/munged.pid",
                f"--seed-file={root}/munge/seed",
                f"--log-file={root}/log/munged.log",
            )
        )
        cluster.wait_until("munged listening", socket.exists, daemons)
        daemons.append(_start(cluster, "slurmctld", "-D"))
        daemons.append(_start(cluster, "slurmd", "-D", "-N", "localhost"))
        cluster.wait_until("the node idle", lambda: _node_state(cluster) == "idle", daemons)
        yield cluster
    finally:
        _cancel_jobs(cluster, daemons)
        for daemon in reversed(daemons):
            _stop(daemon)


def _start(cluster: SlurmCluster, *argv: str) -> subprocess.Popen[bytes]:
    out = (cluster.root / "log" / f"{argv[0]}.out").open("wb")
    with out:  # the child holds its own descriptor
        return subprocess.Popen(
            argv, env=cluster.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _node_state(cluster: SlurmCluster) -> str:
    done = cluster.command("sinfo", "--noheader", "--Node", "--format=%T", timeout=30)
    return done.stdout.strip() if done.returncode == 0 else ""


def _cancel_jobs(cluster: SlurmCluster, daemons: list[subprocess.Popen[bytes]]) -> None:
    """Cancel whatever a test left queued or running and wait for the queue to empty: a job's
    processes outlive slurmd by design, so they must go before the daemons do."""
    if len(daemons) < 3 or any(d.poll() is not None for d in daemons):
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
