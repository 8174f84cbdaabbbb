"""The node's template (agent/template.py, agent/template_main.py): a fork server whose children
are what a spawned worker or spare is -- own session, bound to die with it, the request's argv,
environment and output -- with their exit status delivered to the agent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import procs
from torchrelay.agent.template import (
    FORKED_ENV,
    ForkedProcess,
    NodeTemplate,
    TemplateUnavailable,
    decode,
    encode,
)

CHILD = textwrap.dedent(
    """
    import os, sys, time
    print("argv", sys.argv[1:], "env", sorted(os.environ), os.environ["SPARE_VALUE"])
    print("session", os.getsid(0) == os.getpid(), "parent", os.getppid(), flush=True)
    print("stderr too", file=sys.stderr, flush=True)
    if sys.argv[1] == "raise":
        raise ValueError("from the script")
    if sys.argv[1] == "wait":
        sys.stdin.read()  # /dev/null: returns at once
        try:
            print("waiting", flush=True)
            time.sleep(3600)
        except KeyboardInterrupt:  # SIGINT has the interpreter's handling back
            raise SystemExit(130)
    raise SystemExit(int(sys.argv[1]))
    """
)

# Takes every free descriptor number, so whatever number the template freed before running the
# script is now the script's own; reports at exit those closed behind its back.
OWN_DESCRIPTORS = textwrap.dedent(
    """
    import atexit, os
    own = []
    while not own or own[-1] < 64:
        own.extend(os.pipe())

    def report():
        closed = []
        for fd in own:
            try:
                os.fstat(fd)
            except OSError:
                closed.append(fd)
        os.write(1, f"closed {closed}".encode())

    atexit.register(report)
    """
)


def test_messages_are_json_objects_and_a_huge_request_is_refused():
    assert decode(encode({"pid": 12})) == {"pid": 12}
    with pytest.raises(ValueError):
        decode(b"[1, 2]")
    with pytest.raises(TemplateUnavailable):
        encode({"env": {"X": "y" * (5 << 20)}})


def test_a_handle_waits_for_the_exit_the_template_reports():
    read, write = os.pipe()
    os.close(write)
    child = ForkedProcess(4242, os.fdopen(read, "rb"))
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.01)
    child._set_exit(-signal.SIGKILL)
    assert child.wait() == child.poll() == -signal.SIGKILL


def test_a_template_that_never_became_ready_is_unavailable(tmp_path):
    template = NodeTemplate(tmp_path / "template.log", ready_timeout=0.01)
    with pytest.raises(TemplateUnavailable, match="not ready"):
        template.fork(["x.py"], {})


@pytest.mark.slow
def test_forked_children_are_the_requested_processes_and_die_with_the_template(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    template = NodeTemplate(tmp_path / "template.log")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    template.start(env)
    try:
        done = template.fork([str(script), "3"], {"SPARE_VALUE": "42"})
        lines = done.stdout.read().decode().splitlines()
        assert done.wait(timeout=60) == 3
        # Exactly the request's environment, and the mark of the template it came from.
        assert lines[0] == f"argv ['3'] env {sorted(['SPARE_VALUE', FORKED_ENV])} 42"
        assert lines[1] == f"session True parent {template.pid}"
        assert lines[2] == "stderr too"

        # An uncaught exception is reported as `python child.py` reports it: the script's
        # frames only, and exit status 1.
        failed = template.fork([str(script), "raise"], {"SPARE_VALUE": "1"})
        report = failed.stdout.read().decode()
        assert failed.wait(timeout=60) == 1
        traceback = report[report.index("Traceback (most recent call last):") :].splitlines()
        assert traceback[1:] == [
            f'  File "{script}", line 7, in <module>',
            '    raise ValueError("from the script")',
            "ValueError: from the script",
        ]

        # The template ignores a scheduler's SIGTERM and SIGINT (the agent ends it); what it
        # forked has the interpreter's handling of both back.
        for stop, code in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 130)):
            stopped = template.fork([str(script), "wait"], {"SPARE_VALUE": "1"})
            while stopped.stdout.readline() != b"waiting\n":
                pass
            os.kill(template.pid, stop)
            os.kill(stopped.pid, stop)
            assert stopped.wait(timeout=60) == code

        waiting = template.fork([str(script), "wait"], {"SPARE_VALUE": "1"})
        assert waiting.stdout.readline().startswith(b"argv")
        assert Path(f"/proc/{waiting.pid}/environ").exists()
        os.kill(template.pid, signal.SIGKILL)  # the template dies: so does what it forked
        assert waiting.wait(timeout=60) == -signal.SIGKILL
        assert procs.await_gone(waiting.pid)
        with pytest.raises(TemplateUnavailable):
            template.fork([str(script), "0"], {})
        assert f"forked pid {done.pid} in" in (tmp_path / "template.log").read_text()
    finally:
        template.close()


def test_the_template_forks_single_threaded_with_what_a_worker_imports_loaded(tmp_path):
    """With the agent's environment (one OpenMP thread), the warmed template is one thread
    when it forks (a fork copies no other thread, but copies the locks they hold); a forked
    process finds gRPC's channel module loaded, which its first channel would import."""
    script = tmp_path / "modules.py"
    script.write_text("import sys\nprint('grpc._channel' in sys.modules, flush=True)\n")
    template = NodeTemplate(tmp_path / "template.log")
    template.start({**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"})
    try:
        child = template.fork([str(script)], {})
        assert child.stdout.read().decode() == "True\n"
        assert child.wait(timeout=60) == 0
        assert os.listdir(f"/proc/{template.pid}/task") == [str(template.pid)]
    finally:
        template.close()


@pytest.mark.slow
def test_a_forked_script_keeps_every_descriptor_it_opened_until_it_exits(tmp_path):
    """The template's own descriptors are closed in the child before the script runs, and
    never again: closing one a second time at the interpreter's exit closed a gloo connection
    that had taken its number, and gloo aborted the process after its last step."""
    script = tmp_path / "own.py"
    script.write_text(OWN_DESCRIPTORS)
    template = NodeTemplate(tmp_path / "template.log")
    template.start({**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        child = template.fork([str(script)], {})
        report = child.stdout.read().decode()
        assert child.wait(timeout=60) == 0
        assert report == "closed []"
    finally:
        template.close()
