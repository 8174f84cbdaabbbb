"""The node's template: ``python -u -m torchrelay.agent.template_main FD``, a fork server.

Started once per node by the node agent (:class:`torchrelay.agent.template.NodeTemplate`),
through the :mod:`deathsig` trampoline like every job process, it imports torch and torchrelay
once, then forks a worker or a spare for each request that arrives on the socket ``FD`` -- the
agent's end of a socketpair, inherited at start: nobody else can reach it. A forked process
skips the interpreter start and ``import torch`` (about 2.5 s of CPU on a loaded 2-core node)
and goes straight to the user's script; the pages that import dirtied stay the template's,
shared, so the kernel need not free them when the process dies (``bench.exit_floor``).

This process stays single-threaded (a fork of a process with threads copies their locks,
held or not) and starts no thread pool or OpenMP runtime before it forks: importing torch
starts neither. Each child, before it runs the script:

- leads a session (and process group) of its own, as :func:`spawn.spawn` arranges;
- is bound to this template by ``PR_SET_PDEATHSIG`` (SIGKILL), and this template to the
  launcher: a child cannot outlive either;
- takes its stdout and stderr from the pipe the agent passed with the request (SCM_RIGHTS),
  and ``/dev/null`` as stdin;
- takes the request's environment and argv as its own, and runs the script as ``__main__``,
  with the script's directory first on ``sys.path`` (a module, as ``python -m`` runs it: the
  working directory first); it then exits as the interpreter would (atexit handlers,
  non-daemon threads joined).

Exit statuses reach the agent from here (this process is the children's parent and reaps
them on SIGCHLD). The template ends when the agent closes its end of the socket, or with the
launcher (SIGKILL). It ignores SIGTERM and SIGINT: a scheduler that signals every process of
the job (Slurm's scancel) would otherwise end it first, and with it -- by their parent-death
signal -- the workers, as SIGKILLs the agent must count as failures; each child has the
interpreter's own handling of both back before its script runs.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import runpy
import select
import signal
import socket
import sys
import time
from types import TracebackType

from torchrelay.agent.deathsig import bind_to_parent
from torchrelay.agent.template import FORKED_ENV, MAX_MESSAGE, decode, encode

# What a worker imports anyway; nothing here starts a thread (torch's pools and OpenMP start
# lazily, gRPC at its first channel). gRPC imports its channel module only when the first
# channel is made (2 ms of CPU, then paid by every forked process).
WARM_IMPORTS = (
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torchrelay.runtime.relay",
    "grpc._channel",
)


def _warm() -> None:
    """Import what a worker imports, and what torch imports lazily on the way: building the
    first optimizer of a process imports ~200 modules (0.6 s of CPU here)."""
    for name in WARM_IMPORTS:
        __import__(name)
    import torch

    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    from torchrelay.runtime import native

    native.load()  # the compiled extension, if built: loaded once, shared by every fork
    # Leave the objects made so far out of every collection: a collection in a child would
    # write to each one's header, copying the template's whole heap page by page.
    gc.collect()
    gc.freeze()


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def serve(channel: socket.socket) -> int:
    """Answer fork requests until the agent hangs up (then return 0). In a forked child, run
    its script; its ``SystemExit`` or uncaught exception ends the child as the interpreter
    would end a script (the child never comes back to the loop)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select through wake_w
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, signal.SIG_IGN)
    channel.send(encode({"ready": os.getpid()}))
    while True:
        readable, _, _ = select.select([channel, wake_r], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            _reap(channel)
        if channel not in readable:
            continue
        try:
            raw, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE, 1)
        except OSError:
            return 0
        if not raw:
            return 0  # the agent closed its end: the job is over
        try:
            request = decode(raw)
            argv, env = list(request["argv"]), dict(request["env"])
            module = bool(request.get("module", False))
            if len(fds) != 1:
                raise ValueError(f"a request needs one output descriptor, not {len(fds)}")
        except (ValueError, KeyError, TypeError) as exc:
            for fd in fds:
                os.close(fd)
            channel.send(encode({"error": f"bad request: {exc}"}))
            continue
        started, cpu, template = time.monotonic(), _cpu_seconds(), os.getpid()
        pid = os.fork()
        if pid == 0:
            # The socket object closes its own descriptor: an os.close() of its number would
            # leave the object to close that number again when it is collected, by then
            # another descriptor of the script's (a gloo connection, which then aborts).
            channel.close()
            for fd in (wake_r, wake_w):
                os.close(fd)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            _become(argv, env, fds[0], template, module)
            return 0
        for fd in fds:
            os.close(fd)
        cpu, seconds = _cpu_seconds() - cpu, time.monotonic() - started
        # The template's share of a process's cost; a spare reports its own when ready.
        print(f"forked pid {pid} in {seconds * 1e3:.1f} ms ({cpu * 1e3:.1f} ms of CPU)", flush=True)
        channel.send(encode({"pid": pid}))


def _reap(channel: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        with contextlib.suppress(OSError):
            channel.send(encode({"exit": pid, "code": os.waitstatus_to_exitcode(status)}))


def _become(argv: list[str], env: dict[str, str], output: int, template: int, module: bool) -> None:
    """In the forked child: become the requested process and run its script (``module``:
    ``argv[0]`` names a module, run as ``python -m`` runs it)."""
    os.setsid()
    bind_to_parent(template)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.environ.clear()
    os.environ.update(env)
    os.environ[FORKED_ENV] = str(template)
    sys.argv = argv
    try:
        if module:
            sys.path[0] = os.getcwd()
            # As ``python -m``: sys.argv[0] becomes the module's file while it runs.
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        else:
            # An absolute path, as the interpreter has made a script's ``__file__`` since 3.9.
            script = os.path.abspath(argv[0])
            sys.path[0] = os.path.dirname(script)
            runpy.run_path(script, run_name="__main__")
    except Exception as exc:
        # Reported as ``python script.py`` reports it: the script's frames only, not this
        # module's and runpy's above them (a syntax error in the script: no frame at all),
        # then exit status 1. SystemExit and KeyboardInterrupt go on as they would.
        # (On the exception itself: the interpreter's hook prints the exception's own.)
        exc.with_traceback(_script_frames(exc.__traceback__))
        sys.excepthook(type(exc), exc, exc.__traceback__)
        raise SystemExit(1) from None


def _script_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without its leading frames of this module and of runpy."""
    own = {__file__, getattr(runpy, "__file__", None)}
    while tb is not None and (
        tb.tb_frame.f_code.co_filename in own
        or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
    ):
        tb = tb.tb_next
    return tb


def main() -> None:
    channel = socket.socket(fileno=int(sys.argv[1]))
    # torch.cuda.is_available() initialises the CUDA driver unless asked to count devices
    # through NVML instead; a driver initialised here would be unusable in every fork.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    _warm()
    sys.exit(serve(channel))


if __name__ == "__main__":
    main()
