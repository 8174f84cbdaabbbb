"""The node agent: the torchrun-like part that owns this node's processes.

It starts workers and spares with the job's environment, writes each process's output to
``RUN_DIR/logs/<process>.log`` while streaming it with a prefix, reports every exit to the
controller as soon as ``waitpid`` returns, and executes fences (SIGKILL), so a process the
controller declared dead can never take part again.

Processes are forked from the node's template (:mod:`torchrelay.agent.template`), or started
by :func:`spawn.spawn` without one: either way none outlives the launcher (a parent-death
signal), and each leads its own process group, which every signal here goes to, so what a
worker started itself goes with it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import IO, Any

from torchrelay.agent import console
from torchrelay.agent.copying import Copying
from torchrelay.agent.resume import checkpoint_environment
from torchrelay.agent.spawn import ask_group_to_end, await_group_end, signal_group, spawn
from torchrelay.agent.stack_dump import StackDumps
from torchrelay.agent.template import ForkedProcess, NodeTemplate, TemplateUnavailable
from torchrelay.agent.torchrun_env import torchrun_environment
from torchrelay.config import JobConfig
from torchrelay.health import quarantine
from torchrelay.health.poller import HealthPoller, node_sources
from torchrelay.health.readings import Reading
from torchrelay.heap import heap_environment
from torchrelay.transparent.launch import worker_command, worker_environment
from torchrelay.transparent.park import Channel, Notice

ExitCallback = Callable[[str, int], None]


class NodeAgent(Copying):
    """Owns the processes of one node; thread-safe. ``seat`` tells which slot a process
    serves (a spare's once it took one), for how the console shows its output."""

    def __init__(
        self,
        config: JobConfig,
        node: str,
        on_exit: ExitCallback,
        seat: Callable[[str], int | None] = console.worker_slot,
    ) -> None:
        self.config = config
        self.node = node
        self.environment: dict[str, str] = dict(os.environ)
        self._on_exit = on_exit
        self._procs: dict[str, subprocess.Popen[bytes] | ForkedProcess] = {}
        self._template: NodeTemplate | None = None
        self._template_failed = False  # said once, then processes are spawned plainly
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.console = console.Console(config.nproc_per_node, config.console_ranks, seat)
        self._spare_count = 0
        self._local_index: dict[str, int] = {}  # LOCAL_RANK (the GPU, on GPU nodes) by process
        self._stopping = False
        self._health: HealthPoller | None = None
        self._stack_dumps = StackDumps()
        # Transparent mode: each process's park channel, the park it waits in, and the
        # originals of migrations under way (their death is the move, not a failure).
        self._parks: dict[str, Channel] = {}
        self._notices: dict[str, Notice] = {}
        self._moving: dict[str, subprocess.Popen[bytes]] = {}
        self.log_dir = config.run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def configure(
        self, store_port: int, control: str, token: str, store_host: str | None = None
    ) -> None:
        """The environment every process of this node starts with: torchrun's, plus ours.

        Called again when a new leader serves the job (``store_host``: where its store is)."""
        env = dict(os.environ)
        env.update(
            torchrun_environment(self.config, store_host or self.config.master_addr, store_port)
        )
        env.update(
            {
                "TORCHRELAY_CONTROL": control,
                "TORCHRELAY_TOKEN": token,
                "TORCHRELAY_RUN_DIR": str(self.config.run_dir),
                # Where a new leader is announced if this one is lost (see control.endpoint).
                "TORCHRELAY_STATE": str(self.config.state),
                "TORCHRELAY_ELASTIC": "1" if self.config.elastic else "0",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(checkpoint_environment(self.config))
        if self.config.transparent:
            env.update(worker_environment(env))
        # Like torchrun: several processes per node must not each spawn a thread per core.
        env.setdefault("OMP_NUM_THREADS", "1")
        env.update(heap_environment(env))
        self.environment = env

    # ------------------------------------------------------------------ start
    def start_workers(self) -> None:
        self._ensure_template()
        first = self.config.node_rank * self.config.nproc_per_node
        for local_rank in range(self.config.nproc_per_node):
            rank = first + local_rank
            with self._lock:
                self._local_index[f"worker{rank}"] = local_rank
            self._start(
                f"worker{rank}",
                "worker",
                {"RANK": str(rank), "ROLE_RANK": str(rank), "LOCAL_RANK": str(local_rank)},
            )

    def start_spare(self, avoid: Iterable[int] = ()) -> None:
        """Start a spare on the lowest device index that no live process of this node holds
        (a spare that takes a slot keeps its own GPU; the dead worker's is freed) and that is
        neither in ``avoid`` nor quarantined in this node's run directory."""
        name = self.new_spare_name(avoid)
        if name is None:
            return
        self._ensure_template()
        self._start(name, "spare", {"LOCAL_RANK": str(self._local_index[name])})

    def _ensure_template(self) -> None:
        """Start this node's template, once (``--no-template``: never; nor ``--transparent``,
        whose workers each start in a PID namespace of their own, for CRIU).

        Workers as well as spares are forked from it. Each then shares with the template the
        pages that importing torch dirtied (~150 MB a process) instead of owning a copy: a node
        starts N processes for the CPU of one ``import torch``, holds less memory, and the
        kernel ends a killed process -- the floor under failure detection -- in half the time
        (``bench.exit_floor``)."""
        with self._lock:
            if self.config.template and not self.config.transparent and self._template is None:
                self._template = NodeTemplate(self.log_dir / "template.log")
                self._template.start(self.environment)

    def new_spare_name(self, avoid: Iterable[int] = ()) -> str | None:
        """Name the next spare of this node and give it its device (see :meth:`start_spare`);
        ``None`` once the agent is stopping."""
        avoid = set(avoid) | quarantine.devices_of(self.config.run_dir, self.node)
        with self._lock:
            if self._stopping:
                return None
            prefix = "" if self.config.node_rank == 0 else f"{self.node}-"
            name = f"{prefix}spare{self._spare_count}"
            self._spare_count += 1
            held = {
                index
                for process, index in self._local_index.items()
                if process not in self._procs or self._procs[process].poll() is None
            }
            taken = held | avoid
            self._local_index[name] = next(i for i in itertools.count() if i not in taken)
            return name

    def local_rank(self, process: str) -> int:
        """The device index (``LOCAL_RANK``) given to ``process``."""
        with self._lock:
            return self._local_index[process]

    def _start(self, process: str, role: str, extra: dict[str, str]) -> None:
        env = {
            **self.environment,
            **extra,
            "TORCHRELAY_PROCESS": process,
            "TORCHRELAY_ROLE": role,
            "TORCHRELAY_NODE": self.node,
        }
        if self._template is not None and not self._template_failed:
            # Off this thread: the template may still be importing torch, and the caller may
            # be a remote node's heartbeat loop or the controller's recovery thread. Nobody
            # can signal the process before it joins, and a stop meanwhile is seen below.
            start = threading.Thread(
                target=self._start_forked, args=(process, env), name=f"agent-start-{process}"
            )
            start.daemon = True
            start.start()
            self._threads.append(start)
            return
        self._adopt(process, *self._spawn(env))

    def _spawn(self, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Channel | None]:
        entry = ["-m", self.config.script] if self.config.module else [self.config.script]
        command = [sys.executable, "-u", *entry, *self.config.script_args]
        channel = Channel.open() if self.config.transparent else None
        if self.config.transparent:
            command = worker_command(command)
        try:
            proc = spawn(
                command,
                env={**env, **(channel.environment() if channel else {})},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                pass_fds=channel.child_fds if channel else (),
            )
        finally:
            if channel is not None:
                channel.close_child_ends()
        return proc, channel

    def _adopt(
        self, process: str, proc: subprocess.Popen[bytes] | ForkedProcess, channel: Channel | None
    ) -> None:
        """Own ``proc`` as ``process``: its output, its exit, its signals."""
        with self._lock:
            self._procs[process] = proc
            if channel is not None:
                self._parks[process] = channel
            if self._stopping:  # stop_all() ran while it was being started
                signal_group(proc.pid, signal.SIGKILL)
        thread = threading.Thread(
            target=self._supervise,
            args=(process, proc, channel),
            name=f"agent-{process}",
            daemon=True,
        )
        thread.start()
        self._threads.append(thread)

    def _start_forked(self, process: str, env: dict[str, str]) -> None:
        proc = self._forked(env)
        if proc is None:
            if self._stopping:  # the template was closed by a stop: start nothing now
                return
            self._adopt(process, *self._spawn(env))
            return
        self._adopt(process, proc, None)

    def _forked(self, env: dict[str, str]) -> ForkedProcess | None:
        """The process forked from this node's template, or ``None`` (no template: the caller
        spawns it; the first failure is said once on stderr)."""
        template = self._template
        if template is None or self._template_failed:
            return None
        try:
            argv = [self.config.script, *self.config.script_args]
            return template.fork(argv, env, self.config.module)
        except TemplateUnavailable as exc:
            if self._stopping:
                return None
            self._template_failed = True
            with self.console.lock:
                print(f"torchrelay: spares start as fresh processes: {exc}", file=sys.stderr)
            return None

    # ------------------------------------------------------------------ watch
    def _supervise(
        self, process: str, proc: subprocess.Popen[bytes] | ForkedProcess, channel: Channel | None
    ) -> None:
        assert proc.stdout is not None
        pump = threading.Thread(target=self._pump, args=(process, proc.stdout), daemon=True)
        pump.start()
        returncode = proc.wait()
        # Its group outlives it if it left children behind (data loader workers): not for long.
        signal_group(proc.pid, signal.SIGKILL)
        pump.join(timeout=2.0)
        if channel is not None:
            channel.close()  # its park pipes; a copy of it has pipes of its own
        with self._lock:
            migrated = self._moving.get(process) is proc
        if not migrated:
            self._on_exit(process, returncode)
        # Reported first, then waited for: its exit holder, which unmaps its memory after it
        # (runtime.exit_holder), leaves with this node, not after it.
        await_group_end(proc.pid)

    def _pump(self, process: str, stream: IO[bytes]) -> None:
        with (self.log_dir / f"{process}.log").open("ab") as log:
            for raw in iter(stream.readline, b""):
                log.write(raw)
                log.flush()
                self._stack_dumps.read(process, raw)
                self.console.show(process, raw)
        self.console.ended(process)

    # ------------------------------------------------------------------ fence / stop
    def pid(self, process: str) -> int | None:
        proc = self._procs.get(process)
        return None if proc is None else proc.pid

    def kill(self, process: str, signum: int = signal.SIGKILL, stacks: bool = False) -> None:
        """Send ``signum`` to ``process`` (its process group) if it is still alive; the
        default SIGKILL fences it (it works on stopped processes too). ``stacks``: once it
        has written its stacks to its log (:mod:`torchrelay.agent.stack_dump`)."""
        proc = self._procs.get(process)
        if proc is not None and proc.poll() is None and stacks:
            fence = functools.partial(self.kill, process, signum)
            self._stack_dumps.fence_after_dump(process, proc.pid, fence)
        elif proc is not None and proc.poll() is None:
            signal_group(proc.pid, signum)
            if signum == signal.SIGSTOP and self.config.transparent:
                self.stop_worker(proc.pid)  # no handler forwards SIGSTOP

    def watch_health(self, deliver: Callable[[tuple[dict[str, Any], ...]], None]) -> None:
        """Poll this node's health sources every ``--health-poll`` seconds (0: never) and give
        each poll's readings, naming the process on each device, to ``deliver``."""
        if self.config.health_poll <= 0:
            return

        def named(readings: list[Reading]) -> None:
            deliver(tuple(self._with_process(r).to_wire() for r in readings))

        sources = node_sources(self.config.run_dir, self.node, self._local_index.get)
        self._health = HealthPoller(sources, named, self.config.health_poll)
        self._health.start()

    def _with_process(self, reading: Reading) -> Reading:
        if reading.process is not None:
            return reading
        with self._lock:
            live = [
                p
                for p, index in self._local_index.items()
                if index == reading.device and p in self._procs and self._procs[p].poll() is None
            ]
        return dataclasses.replace(reading, process=live[0]) if live else reading

    def kill_all(self) -> None:
        """SIGKILL every process of this node at once (a lost node, or an isolated one)."""
        with self._lock:
            self._stopping = True
            names = list(self._procs)
            template = self._template
        for name in names:
            self.kill(name)
        if template is not None:
            template.kill()

    def alive(self) -> list[str]:
        with self._lock:
            return [name for name, proc in self._procs.items() if proc.poll() is None]

    def dismiss_unjoined(self, joined: Collection[str]) -> None:
        """The job succeeded: SIGTERM every live process not in ``joined`` -- spares still
        starting, which would only come up to be dismissed (seconds of ``import torch`` and
        CUDA's start without the template). Those that joined were told the job is over and
        exit by themselves."""
        with self._lock:
            unjoined = [proc for name, proc in self._procs.items() if name not in joined]
        for proc in unjoined:
            if proc.poll() is None:
                ask_group_to_end(proc.pid)

    def stop_health(self) -> None:
        if self._health is not None:
            self._health.stop()

    def stop_all(self, grace: float = 5.0) -> None:
        """SIGTERM every process group, SIGKILL what is left after ``grace`` seconds, and
        return once every exit has been handed to ``on_exit`` (a few seconds at most)."""
        with self._lock:
            self._stopping = True
            procs = list(self._procs.values())
        for proc in procs:
            if proc.poll() is None:
                ask_group_to_end(proc.pid)
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        self._close_template()  # before the joins: reporting exits may take a while
        for thread in list(self._threads):
            thread.join(timeout=5.0)

    def wait_all(self, timeout: float) -> bool:
        """Wait until every process has exited; ``False`` on timeout."""
        with self._lock:
            self._stopping = True
            procs = list(self._procs.values())
        for proc in procs:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return False
        self._close_template()
        for thread in self._threads:
            thread.join(timeout=5.0)
        return True

    def _close_template(self) -> None:
        with self._lock:
            template, self._template = self._template, None
        if template is not None:
            template.close()
