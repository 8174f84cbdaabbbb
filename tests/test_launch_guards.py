"""What the launcher refuses before it starts anything, and what it exposes once it runs: the
store on the rendezvous address only, a run directory for one job only, owner-only secrets."""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import struct
from collections.abc import Iterator

import pytest

from tests.jobs import SCRIPTS, cli
from torchrelay.agent.launcher import Launch
from torchrelay.agent.rundir import create_exclusive
from torchrelay.config import JobConfig
from torchrelay.ledger import Ledger

SIOCGIFADDR = 0x8915


def _addresses_of_this_machine() -> Iterator[str]:
    """Every IPv4 address of this machine's interfaces, plus another loopback address."""
    yield "127.0.0.2"
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                packed = fcntl.ioctl(
                    probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15])
                )
            except OSError:  # no IPv4 address on this interface
                continue
            yield socket.inet_ntoa(packed[20:24])


def _reachable(host: str, port: int) -> bool:
    with socket.socket() as client:
        client.settimeout(5)
        try:
            client.connect((host, port))
        except OSError:
            return False
        return True


def test_store_listens_on_the_rendezvous_address_only(tmp_path):
    config = JobConfig(script="x.py", script_args=[], nproc_per_node=1, run_dir=tmp_path / "run")
    launch = Launch(config)  # store, controller and server; no process started
    try:
        port = launch.store.port
        assert _reachable("127.0.0.1", port)
        others = [a for a in _addresses_of_this_machine() if a != "127.0.0.1"]
        assert others and not [a for a in others if _reachable(a, port)]
        launch._publish_endpoint()
        token = config.run_dir / "token"
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        assert token.read_text() == launch.token
    finally:
        launch.server.stop()
        launch.ledger.close()


def _run(run_dir, *launcher_args: str):
    return cli(
        "run",
        "--spares",
        "0",
        "--run-dir",
        str(run_dir),
        *launcher_args,
        str(SCRIPTS / "mlp_train.py"),
        "--steps",
        "1",
    )


def _one_line_error(done, message: str) -> None:
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # no traceback


@pytest.fixture
def port_in_use() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize(
    "endpoint, message",
    [
        ("127.0.0.1:{busy}", "the port is in use"),
        ("127.0.0.1:70000", "PORT in 0..65535"),
        # TEST-NET-3 (RFC 5737): an address no machine here has. Hung until the store's
        # timeout before.
        ("203.0.113.7:0", "not an address of this machine"),
        ("no-such-host.invalid:0", "cannot resolve"),
    ],
    ids=["port-in-use", "port-too-large", "host-not-local", "host-unresolvable"],
)
def test_bad_rendezvous_endpoint_is_refused_at_once(tmp_path, port_in_use, endpoint, message):
    run_dir = tmp_path / "run"
    done = _run(run_dir, "--rdzv-endpoint", endpoint.format(busy=port_in_use))
    _one_line_error(done, message)
    assert not run_dir.exists()  # nothing touched


def test_run_dir_holding_a_job_is_refused_and_left_alone(tmp_path):
    old = Ledger(tmp_path / "ledger.jsonl")
    old.record("job_start", world_size=1)
    old.record("job_end", status="succeeded", steps_committed=1)
    old.close()
    before = (tmp_path / "ledger.jsonl").read_bytes()
    done = _run(tmp_path)
    _one_line_error(done, "already holds a job (ledger.jsonl exists)")
    assert (tmp_path / "ledger.jsonl").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.jsonl"]


def test_planted_token_symlink_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    victim.chmod(0o644)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "token").symlink_to(victim)
    done = _run(run_dir)
    _one_line_error(done, "already holds a job (token exists)")
    assert victim.read_text() == "precious"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert not (run_dir / "ledger.jsonl").exists()


def test_secrets_are_created_never_reused(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for planted in (tmp_path / "link", tmp_path / "dangling"):
        planted.symlink_to(victim if planted.name == "link" else tmp_path / "nowhere")
        with pytest.raises(FileExistsError):
            create_exclusive(planted, "secret")
    assert victim.read_text() == "precious" and not (tmp_path / "nowhere").exists()
    old = os.umask(0)  # even with the loosest umask, the secret is the owner's only
    try:
        create_exclusive(tmp_path / "token", "secret")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "token").stat().st_mode) == 0o600
    assert (tmp_path / "token").read_text() == "secret"
