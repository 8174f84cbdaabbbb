"""`torchrelay status` against a real controller behind its RPC (no training processes): the
view once, and `--watch` until the job ends -- its controller gone or `job_end` in its ledger --
or Ctrl-C, each an exit 0 with one line. Paced by the status requests the controller answered."""

from __future__ import annotations

import signal
import subprocess
import sys

from tests.jobs import cli
from torchrelay.events import JobEnd

WATCH = ("--watch", "--interval", "0.2")


def watch(run_dir) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "torchrelay.cli.main", "status", str(run_dir), *WATCH],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_status_once_shows_the_members_and_the_ledger(live_job):
    for flags in ((), ("--once",)):
        shown = cli("status", str(live_job.run_dir), *flags)
        assert shown.returncode == 0, shown.stderr
        assert "worker0" in shown.stdout and "generation 0" in shown.stdout
        assert "worker0 joined as worker on node0 (pid 12345)" in shown.stdout


def test_watch_ends_when_the_controller_goes(live_job):
    watcher = watch(live_job.run_dir)
    try:
        assert live_job.answered_status(3)  # the first view and two redraws
        live_job.server.stop()
        out, err = watcher.communicate(timeout=60)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, err
    assert "worker0" in out  # the last view stays on the screen
    assert (
        out.strip()
        .splitlines()[-1]
        .startswith("torchrelay: the job's controller stopped answering")
    )


def test_watch_ends_at_the_ledgers_job_end(live_job):
    watcher = watch(live_job.run_dir)
    try:
        assert live_job.answered_status(2)
        end = JobEnd(status="succeeded", steps_committed=12)
        live_job.ledger.write(end.to_json())
        out, err = watcher.communicate(timeout=60)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, err
    last = out.strip().splitlines()[-1]
    assert last == (
        f"torchrelay: the job ended: succeeded, 12 steps committed; see `torchrelay report "
        f"{live_job.run_dir}`"
    )


def test_ctrl_c_stops_watching_quietly(live_job):
    watcher = watch(live_job.run_dir)
    try:
        assert live_job.answered_status(2)
        watcher.send_signal(signal.SIGINT)
        out, err = watcher.communicate(timeout=60)
    finally:
        watcher.kill()
    assert watcher.returncode == 0 and "Traceback" not in err, err
    assert out.strip().splitlines()[-1] == "torchrelay: stopped watching; the job goes on"


def test_watch_of_an_ended_job_says_so(live_job):
    live_job.server.stop()
    done = cli("status", str(live_job.run_dir), "--watch")
    assert done.returncode != 0 and "cannot reach the job's controller" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_bad_interval_is_one_line(live_job):
    done = cli("status", str(live_job.run_dir), "--watch", "--interval", "0")
    assert done.returncode != 0 and "--interval must be" in done.stderr
