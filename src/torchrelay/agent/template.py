"""The node agent's side of the node's template (a fork server; see :mod:`template_main`).

:class:`NodeTemplate` starts the template once, through :func:`spawn.spawn` (it dies with the
launcher, in a session of its own), on one end of a socketpair it alone holds. A worker or a
spare then costs the node a ``fork`` of a process that has imported torch already, instead of
an interpreter start and ``import torch``. :meth:`NodeTemplate.fork` returns a
:class:`ForkedProcess`: the part of ``subprocess.Popen`` the agent uses (``pid``, ``stdout``,
``poll``, ``wait``), its exit status delivered by the template, which is its parent.

The template dies with the launcher (SIGKILL) or when the agent hangs up; it ignores SIGTERM
and SIGINT (see :mod:`template_main`). It is reaped as soon as it is gone. Failure behaviour:
:meth:`fork` raises :class:`TemplateUnavailable` when the template did not start, is not
ready within ``ready_timeout``, or is gone; the agent then spawns the process plainly. If the
template dies, every process it forked dies too (their parent-death signal): each handle
reports ``-SIGKILL``, as for any killed process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from torchrelay.agent.spawn import signal_group, spawn

FORKED_ENV = "TORCHRELAY_TEMPLATE_PID"  # set in a forked process: the template it came from
MAX_MESSAGE = 4 << 20  # an environment and argv, as JSON


class TemplateUnavailable(RuntimeError):
    """The template cannot fork a process now; start it another way."""


def encode(message: dict[str, Any]) -> bytes:
    raw = json.dumps(message, separators=(",", ":")).encode()
    if len(raw) > MAX_MESSAGE:
        raise TemplateUnavailable(f"a request of {len(raw)} bytes is over {MAX_MESSAGE}")
    return raw


def decode(raw: bytes) -> dict[str, Any]:
    message = json.loads(raw)
    if not isinstance(message, dict):
        raise ValueError("a template message must be a JSON object")
    return message


class ForkedProcess:
    """A process forked by the template: ``pid``, ``stdout``, ``poll()``, ``wait()``."""

    def __init__(self, pid: int, stdout: IO[bytes]) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _set_exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"forked process {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class NodeTemplate:
    """One node's template process; thread-safe."""

    def __init__(self, log: Path, ready_timeout: float = 60.0) -> None:
        self._log = log
        self._ready_timeout = ready_timeout
        self._lock = threading.Lock()  # one request at a time: answers come back in order
        self._state = threading.Condition()
        self._channel: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = False
        self._gone: str | None = None
        self._answers: list[dict[str, Any]] = []
        self._children: dict[int, ForkedProcess] = {}
        self._early_exits: dict[int, int] = {}  # exits that beat their fork's answer

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, env: dict[str, str]) -> None:
        """Start the template with ``env`` (the job's: its OpenMP settings are read once, at
        import); it imports torch in the background. Failures surface in :meth:`fork`."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [sys.executable, "-u", "-m", "torchrelay.agent.template_main"]
        try:
            with self._log.open("ab") as log:
                self._proc = spawn(
                    [*command, str(theirs.fileno())],
                    env=env,
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        except OSError as exc:
            ours.close()
            self._gone = f"it could not be started ({exc})"
            return
        finally:
            theirs.close()
        self._channel = ours
        threading.Thread(target=self._listen, name="torchrelay-template", daemon=True).start()

    def fork(self, argv: list[str], env: dict[str, str], module: bool = False) -> ForkedProcess:
        """Fork a process that runs ``argv`` (``[script, *args]``; ``module``: ``script`` is a
        module, as ``python -m`` runs it) with exactly ``env``; its output goes to the returned
        handle's ``stdout``."""
        with self._lock:
            self._await_ready()
            assert self._channel is not None
            read, write = os.pipe()
            try:
                request = encode({"argv": argv, "env": env, "module": module})
                socket.send_fds(self._channel, [request], [write])
            except OSError as exc:
                os.close(read)
                raise TemplateUnavailable(f"the template did not take the request ({exc})") from exc
            finally:
                os.close(write)
            answer = self._next_answer()
            if answer is None or "pid" not in answer:
                os.close(read)
                why = self._gone if answer is None else answer.get("error")
                raise TemplateUnavailable(f"the template did not fork ({why})")
            child = ForkedProcess(int(answer["pid"]), os.fdopen(read, "rb"))
            with self._state:
                self._children[child.pid] = child
                early = self._early_exits.pop(child.pid, None)
            if early is not None:
                child._set_exit(early)
            return child

    def close(self, grace: float = 5.0) -> None:
        """Hang up: the template exits (what it forked and is still running dies with it);
        SIGKILLed if it has not within ``grace`` seconds (it may still be importing torch)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            with contextlib.suppress(OSError):
                channel.shutdown(socket.SHUT_RDWR)  # wakes the listener (EOF), ends the template
            channel.close()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()
                self._proc.wait()

    def kill(self) -> None:
        """SIGKILL the template (a lost node): what it forked dies with it."""
        if self._proc is not None:
            signal_group(self._proc.pid, signal.SIGKILL)

    # ------------------------------------------------------------------ internals
    def _await_ready(self) -> None:
        with self._state:
            self._state.wait_for(lambda: self._ready or self._gone, self._ready_timeout)
            if self._gone is not None:
                raise TemplateUnavailable(f"the template is gone ({self._gone})")
            if not self._ready:
                raise TemplateUnavailable(f"the template was not ready in {self._ready_timeout} s")

    def _next_answer(self) -> dict[str, Any] | None:
        with self._state:
            self._state.wait_for(lambda: self._answers or self._gone)
            return self._answers.pop(0) if self._answers else None

    def _listen(self) -> None:
        channel = self._channel
        assert channel is not None
        reason = "it exited"
        while True:
            try:
                raw = channel.recv(MAX_MESSAGE)
                message = decode(raw) if raw else None
            except (OSError, ValueError) as exc:
                reason, message = str(exc), None
            if message is None:
                break
            with self._state:
                if "ready" in message:
                    self._ready = True
                elif "exit" in message:
                    self._on_exit(int(message["exit"]), int(message["code"]))
                else:
                    self._answers.append(message)
                self._state.notify_all()
        if self._proc is not None:
            self._proc.wait()  # it hung up by exiting: reap it now, not at the job's end
        with self._state:
            self._gone = reason
            orphans = list(self._children.values())
            self._state.notify_all()
        for child in orphans:  # killed by their parent-death signal with the template
            child._set_exit(-signal.SIGKILL)

    def _on_exit(self, pid: int, code: int) -> None:
        child = self._children.pop(pid, None)
        if child is None:
            self._early_exits[pid] = code
        else:
            child._set_exit(code)
