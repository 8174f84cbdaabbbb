"""Where a launcher sits in a Slurm job, read from the environment ``srun`` gives each task.

``srun --ntasks-per-node=1 torchrelay run --nproc-per-node N train.py`` starts one launcher per
node with no per-node flags: this module derives them, as pure functions over the environment.

- A *Slurm step* is recognised by ``SLURM_JOB_ID`` and ``SLURM_STEP_ID`` (``srun`` sets both; a
  batch script or an ``salloc`` shell has no step id, and there Slurm is ignored: one node).
- ``--nnodes``: ``SLURM_STEP_NUM_NODES`` (else ``SLURM_NNODES``, else ``SLURM_JOB_NUM_NODES``).
- ``--node-rank``: ``SLURM_NODEID``, this node's index in the step.
- ``--rdzv-endpoint`` (several nodes only): the first host of ``SLURM_STEP_NODELIST`` (else
  ``SLURM_JOB_NODELIST``) -- node 0 of the step -- and :func:`default_port` of the job id. One
  node keeps the default, a free loopback port: nothing else needs to reach it.
- ``--run-dir``: ``runs/slurm-<jobid>`` (``runs/slurm-<jobid>.<step>`` for a later step of the
  same job), relative to the working directory, which ``srun`` gives every node alike. Node 0
  claims it (:mod:`torchrelay.agent.rundir`); the others only add their logs.

Explicit flags win; a flag that contradicts the step (``--nnodes 3`` in a step of 2 nodes) is an
error. Slurm must start one task per node: torchrelay starts the workers itself. Every problem is
a :class:`SlurmError` whose message is one actionable line. The job token is not Slurm's concern:
a job of several nodes reads it from ``$TORCHRELAY_JOB_TOKEN``, which the batch script exports
and ``srun`` propagates (:func:`torchrelay.agent.launcher.job_token`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import product
from pathlib import Path

PORT_BASE = 20000
PORT_PAIRS = 6000
""":func:`default_port` stays in ``[PORT_BASE, PORT_BASE + 2 * PORT_PAIRS)`` = 20000..31999:
below Linux's ephemeral range (32768 and up), so no outgoing connection holds it by chance."""

MAX_HOSTS = 1 << 20  # a hostlist expanding to more is a typo, not a cluster


class SlurmError(ValueError):
    """The Slurm environment cannot place this launcher; the message says why, in one line."""


@dataclass(frozen=True)
class SlurmStep:
    """This task's place in a Slurm job step, as plain data."""

    job_id: int
    step_id: int
    nnodes: int
    node_rank: int
    rdzv_host: str  # the step's first node: node 0, which hosts the store and the controller

    @property
    def rdzv_endpoint(self) -> str:
        return f"{self.rdzv_host}:{default_port(self.job_id)}"

    @property
    def run_dir(self) -> Path:
        suffix = f".{self.step_id}" if self.step_id else ""
        return Path("runs") / f"slurm-{self.job_id}{suffix}"


@dataclass(frozen=True)
class Placement:
    """Where this launcher sits in its job; ``None`` where nothing said (then the CLI's
    defaults apply)."""

    nnodes: int | None = None
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    run_dir: Path | None = None


def default_port(job_id: int) -> int:
    """The store's port of Slurm job ``job_id`` when ``--rdzv-endpoint`` is not given:
    ``20000 + 2 * (job_id mod 6000)``. Even, so that the controller's port (this + 1) is the
    pair's odd half: jobs whose ids differ by less than 6000 never share a port pair on a node.
    """
    return PORT_BASE + 2 * (job_id % PORT_PAIRS)


def place(flags: Placement, step: SlurmStep | None) -> Placement:
    """Fill in what ``flags`` left out from ``step``; :class:`SlurmError` on a contradiction."""
    if step is None:
        return flags
    for flag, given, found in (
        ("--nnodes", flags.nnodes, step.nnodes),
        ("--node-rank", flags.node_rank, step.node_rank),
    ):
        if given is not None and given != found:
            raise SlurmError(
                f"{flag} {given} contradicts this Slurm step ({found}, from srun's environment); "
                "drop the flag or change the srun options"
            )
    endpoint = flags.rdzv_endpoint
    if endpoint is None and step.nnodes > 1:
        endpoint = step.rdzv_endpoint
    return Placement(step.nnodes, step.node_rank, endpoint, flags.run_dir or step.run_dir)


def slurm_step(environ: Mapping[str, str]) -> SlurmStep | None:
    """This task's :class:`SlurmStep`, or ``None`` outside an ``srun`` step."""
    if "SLURM_JOB_ID" not in environ or "SLURM_STEP_ID" not in environ:
        return None
    job_id = _number(environ, "SLURM_JOB_ID")
    step_id = _number(environ, "SLURM_STEP_ID")
    nnodes = _number(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    node_rank = _number(environ, "SLURM_NODEID")
    if not 0 <= node_rank < nnodes:
        raise SlurmError(f"SLURM_NODEID={node_rank} is outside this step's {nnodes} nodes")
    tasks = _tasks_per_node(environ)
    if max(tasks, default=1) > 1:
        raise SlurmError(
            f"Slurm started {max(tasks)} tasks on a node, but torchrelay starts the workers "
            "itself: use `srun --ntasks-per-node=1` and give the workers per node with "
            "`--nproc-per-node`"
        )
    name = _first("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", environ=environ)
    hosts = parse_hostlist(environ[name])
    if len(hosts) < nnodes:
        raise SlurmError(f"{name}={environ[name]!r} names fewer than the step's {nnodes} nodes")
    return SlurmStep(job_id, step_id, nnodes, node_rank, hosts[0])


def _first(*names: str, environ: Mapping[str, str]) -> str:
    for name in names:
        if environ.get(name):
            return name
    raise SlurmError(f"this Slurm step sets none of {', '.join(names)}")


def _number(environ: Mapping[str, str], *names: str) -> int:
    name = _first(*names, environ=environ)
    value = environ[name].strip()
    if not value.isdecimal():
        raise SlurmError(f"{name}={value!r} is not a number (is this a Slurm step?)")
    return int(value)


_TASKS = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def _tasks_per_node(environ: Mapping[str, str]) -> list[int]:
    """Tasks on each node, from Slurm's compact form: ``2(x3),1`` is ``[2, 2, 2, 1]``."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        if environ.get(name):
            counts: list[int] = []
            for item in environ[name].split(","):
                match = _TASKS.fullmatch(item.strip())
                if match is None:
                    raise SlurmError(f"{name}={environ[name]!r} is not a Slurm task count")
                counts += [int(match[1])] * int(match[2] or 1)
            return counts
    return []


def parse_hostlist(expression: str) -> list[str]:
    """Expand a Slurm hostlist expression, in Slurm's order.

    ``gpu[01-03,7],cpu5`` is ``gpu01 gpu02 gpu03 gpu7 cpu5``: a range keeps the width of its
    lower bound (``[08-10]`` gives ``08 09 10``, ``[8-10]`` gives ``8 9 10``), and a name with
    several bracket groups is their product, the first group varying slowest
    (``r[1-2]n[1-2]`` is ``r1n1 r1n2 r2n1 r2n2``). Raises :class:`SlurmError` for anything
    else: unbalanced or nested brackets, an empty name or range, a range running backwards.
    """
    hosts: list[str] = []
    for item in _split_top_level(expression):
        if not item:
            raise SlurmError(f"hostlist {expression!r} has an empty name")
        hosts += _expand_name(item, expression)
        if len(hosts) > MAX_HOSTS:
            raise SlurmError(f"hostlist {expression!r} names more than {MAX_HOSTS} hosts")
    return hosts


def _split_top_level(expression: str) -> list[str]:
    """Split at the commas outside brackets (those inside separate ranges)."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(expression):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if depth not in (0, 1):
            raise SlurmError(f"hostlist {expression!r} has unbalanced or nested brackets")
        if char == "," and depth == 0:
            items.append(expression[start:i])
            start = i + 1
    if depth:
        raise SlurmError(f"hostlist {expression!r} has an unclosed bracket")
    items.append(expression[start:])
    return [item.strip() for item in items]


def _expand_name(name: str, expression: str) -> list[str]:
    """One name with zero or more ``[ranges]`` groups -> every host it stands for."""
    parts = re.split(r"\[([^\]]*)\]", name)  # literal, group, literal, group, ..., literal
    if any("[" in p or "]" in p for p in parts[::2]):
        raise SlurmError(f"hostlist {expression!r} has a misplaced bracket")
    choices = [[p] if i % 2 == 0 else _expand_ranges(p, expression) for i, p in enumerate(parts)]
    size = 1
    for options in choices:
        size *= len(options)
        if size > MAX_HOSTS:
            raise SlurmError(f"hostlist {expression!r} names more than {MAX_HOSTS} hosts")
    return ["".join(pieces) for pieces in product(*choices)]


_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def _expand_ranges(group: str, expression: str) -> list[str]:
    """``01-03,7`` -> ``01 02 03 7``."""
    values: list[str] = []
    for spec in group.split(","):
        match = _RANGE.fullmatch(spec.strip())
        if match is None:
            raise SlurmError(f"hostlist {expression!r}: {spec!r} is not a number or a range")
        low, high = int(match[1]), int(match[2] or match[1])
        if high < low:
            raise SlurmError(f"hostlist {expression!r}: range {spec!r} runs backwards")
        if high - low >= MAX_HOSTS:
            raise SlurmError(f"hostlist {expression!r} names more than {MAX_HOSTS} hosts")
        width = len(match[1])
        values += [f"{n:0{width}d}" for n in range(low, high + 1)]
    return values
