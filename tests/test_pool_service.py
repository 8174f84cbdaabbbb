"""The pool service over real gRPC on loopback (sealed JSON, the pool token), its state in a
state backend, and the one-line refusals of its command line."""

from __future__ import annotations

import pytest

from tests.jobs import cli
from torchrelay.control.store.memory import MemoryBackend
from torchrelay.pool.client import PoolClient, PoolError
from torchrelay.pool.policy import Rules
from torchrelay.pool.service import Pool, PoolServer

TOKEN = "p" * 32


@pytest.fixture
def served():
    backend = MemoryBackend()
    server = PoolServer(Pool(3, backend, TOKEN, Rules()), TOKEN)
    server.start()
    clients: list[PoolClient] = []

    def client(job: str = "", token: str = TOKEN) -> PoolClient:
        clients.append(PoolClient(server.address, token, job))
        return clients[-1]

    yield server, backend, client
    for c in clients:
        c.close()
    server.stop()


def test_jobs_attach_borrow_and_the_state_survives_a_restarted_pool(served):
    server, backend, client = served
    low, high = client("L"), client("H")
    assert low.call("Attach", {"size": 2, "min_nproc": 1, "priority": 0, "elastic": True}) == {
        "slots": [0, 1]
    }
    high.call("Attach", {"size": 1, "min_nproc": 1, "priority": 9, "elastic": False})
    with pytest.raises(PoolError, match="0 idle slot"):
        client("M").call("Attach", {"size": 1, "min_nproc": 1, "priority": 0, "elastic": True})

    body = {"processes": 0, "recovering": True, "lost": 1, "refused": {}, "wait": 0}
    assert high.call("Sync", body) == {"commands": []}
    answer = low.call("Sync", {**body, "processes": 2, "recovering": False, "lost": 0})
    assert answer == {"commands": [{"type": "release", "loan": 0, "borrower": "H"}]}
    status = client().call("Status", {})
    assert status["slots"] == ["L", "L", "!broken"] and status["open_loans"] == 1
    assert status["jobs"]["H"]["wanted"] == 1 and "commands" not in status["jobs"]["H"]

    # Restarted on the same store: the same slots, jobs and loans.
    again = Pool(3, backend, TOKEN, Rules())
    assert again.state.to_dict() == server.pool.state.to_dict()
    with pytest.raises(Exception, match="3 slots, not --slots 4"):
        Pool(4, backend, TOKEN, Rules())


def test_a_wrong_token_an_unknown_job_and_bad_fields_are_refused_in_one_line(served):
    server, _, client = served
    with pytest.raises(PoolError, match="wrong job token"):
        client("L", token="x" * 32).call("Status", {})
    with pytest.raises(PoolError, match="no job named 'ghost'"):
        client("ghost").call("Detach", {})
    with pytest.raises(PoolError, match="size must be an integer"):
        client("L").call("Attach", {"size": -1, "min_nproc": 1, "priority": 0, "elastic": True})
    assert server.pool.state.jobs == {}


def test_the_command_line_refuses_bad_pool_flags(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    script = tmp_path / "train.py"
    script.write_text("")
    run = ("run", "--nproc-per-node", "2", "--run-dir", str(tmp_path / "run"))
    cases = [
        ((*run, "--pool", "127.0.0.1:1", str(script)), "--pool needs --pool-token"),
        (
            (
                *run,
                "--pool",
                "127.0.0.1:1",
                "--pool-token",
                str(token),
                "--spares",
                "1",
                str(script),
            ),
            "use --spares 0",
        ),
        ((*run, "--priority", "3", str(script)), "need --pool"),
        (
            (*run, "--pool", "h:1", "--pool-token", str(token), "--state", "etcd://h:2", "x"),
            "does not combine with --state etcd",
        ),
        (("status", "--pool", "127.0.0.1:1"), "--pool needs --pool-token"),
        (("pool", "--slots", "0", "--token-file", str(token)), "--slots must be 1 or more"),
        (
            (
                *run,
                "--spares",
                "0",
                "--pool",
                "127.0.0.1:1",
                "--pool-token",
                str(tmp_path / "no"),
                str(script),
            ),
            "cannot read the pool token",
        ),
    ]
    unreachable = (*run, "--spares", "0", "--pool", "127.0.0.1:1", "--pool-token", str(token))
    cases.append(((*unreachable, str(script)), "cannot be reached"))
    for args, message in cases:
        done = cli(*args)
        assert done.returncode != 0 and message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
