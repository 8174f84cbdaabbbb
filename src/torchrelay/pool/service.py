"""The pool service: its state behind a lock and a state store, served over gRPC.

Requests are sealed JSON (:mod:`torchrelay.control.wire`) with the pool token, authenticated
before they are parsed and admitted once while fresh (:mod:`torchrelay.control.replay`): a
refused one gets ``UNAUTHENTICATED`` and changes nothing. Methods (service
``torchrelay.Pool``): ``Attach {job, size, min_nproc, priority, elastic, parkable?}`` ->
``{slots}``; ``Sync {job, processes, recovering, lost, refused, parked?}`` -> ``{commands}``
(a long poll: it answers as soon as the job has a command, or after ``wait`` seconds);
``Detach {job}``; ``Status``. A refused request (an unknown job, a full pool) is
``FAILED_PRECONDITION`` with one line.

Every change is written to the :class:`~torchrelay.control.store.StateBackend` (sealed with the
token, compare-and-swap) before it is answered, so a pool restarted on the same etcd prefix
goes on with the same slots, jobs and loans; a write that fails stops the change with
``UNAVAILABLE``.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from torchrelay.control.replay import ReplayGuard
from torchrelay.control.store import SealedStore, StateBackend, StoreError
from torchrelay.control.wire import MAX_MESSAGE_BYTES, WireError, open_sealed, seal
from torchrelay.pool import policy
from torchrelay.pool.state import IDLE, LoanState, PoolState

SERVICE = "torchrelay.Pool"
MAX_WAIT = 5.0
"""The longest a ``Sync`` long poll is held open (seconds)."""


class Pool:
    """The pool's state and its transitions (thread-safe); persisted in ``backend``."""

    def __init__(self, slots: int, backend: StateBackend, token: str, rules: policy.Rules):
        self.rules = rules
        self._store = SealedStore(backend, token)
        self._cond = threading.Condition()
        raw, self._revision = self._store.get_state()
        if raw is None:
            self.state = PoolState(slots=[IDLE] * slots)
        else:  # a restarted pool: the same slots, jobs and loans
            self.state = PoolState.from_dict(json.loads(raw))
            if len(self.state.slots) != slots:
                raise StoreError(
                    f"the stored pool has {len(self.state.slots)} slots, not --slots {slots}"
                )

    def _change(self, transition: Callable[[PoolState], Any]) -> Any:
        """Run ``transition`` on the state and store the result before answering."""
        with self._cond:
            before = self.state.to_dict()
            try:
                answer = transition(self.state)
                after = self.state.to_dict()
                if after != before:  # a steady Sync changes nothing: no write
                    blob = json.dumps(after, sort_keys=True).encode()
                    _, self._revision, written = self._store.set_state(blob, self._revision)
                    if not written:
                        raise StoreError("the pool state changed under this pool: another runs")
            except BaseException:
                self.state = PoolState.from_dict(before)
                raise
            self._cond.notify_all()
            return answer

    def attach(self, body: dict[str, Any]) -> dict[str, Any]:
        slots = self._change(
            lambda s: policy.attach(
                s,
                str(body["job"]),
                _int(body, "size"),
                _int(body, "min_nproc"),
                _int(body, "priority"),
                bool(body["elastic"]),
                bool(body.get("parkable", False)),
            )
        )
        return {"slots": slots}

    def sync(self, body: dict[str, Any], wait: float) -> dict[str, Any]:
        name = str(body["job"])
        refused = {int(k): str(v) for k, v in dict(body.get("refused", {})).items()}
        self._change(
            lambda s: policy.report(
                s,
                name,
                _int(body, "processes"),
                bool(body["recovering"]),
                _int(body, "lost"),
                refused,
                time.time(),
                self.rules,
                bool(body.get("parked", False)),
            )
        )
        with self._cond:
            self._cond.wait_for(
                lambda: name not in self.state.jobs or bool(self.state.jobs[name].commands),
                timeout=min(max(wait, 0.0), MAX_WAIT),
            )
        taken = self._change(lambda s: _take_commands(s, name))
        return {"commands": taken}

    def detach(self, body: dict[str, Any]) -> dict[str, Any]:
        self._change(lambda s: policy.detach(s, str(body["job"]), time.time(), self.rules))
        return {}

    def status(self) -> dict[str, Any]:
        with self._cond:
            state = self.state.to_dict()
            held = {name: len(self.state.held(name)) for name in state["jobs"]}
        for name, job in state["jobs"].items():
            job["held"] = held[name]
            del job["commands"]
        active = [LoanState.ASKED.value, LoanState.ACTIVE.value]
        state["open_loans"] = sum(1 for loan in state["loans"] if loan["state"] in active)
        return state


def _take_commands(state: PoolState, name: str) -> list[dict[str, Any]]:
    job = state.jobs.get(name)
    if job is None:
        return []
    taken, job.commands = job.commands, []
    return taken


def _int(body: dict[str, Any], key: str) -> int:
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise policy.PoolRefusal(f"{key} must be an integer >= 0, not {value!r}")
    return value


class PoolServer:
    """Serves a :class:`Pool` on ``host:port`` (0: a free port) with the pool ``token``."""

    def __init__(self, pool: Pool, token: str, host: str = "127.0.0.1", port: int = 0):
        self.pool = pool
        self._token = token
        self._replay = ReplayGuard()
        self._server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="torchrelay-pool"),
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        handlers = {
            "Attach": self._unary(pool.attach),
            "Sync": self._unary(lambda body: pool.sync(body, float(body.get("wait", 0.0)))),
            "Detach": self._unary(pool.detach),
            "Status": self._unary(lambda _: pool.status()),
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),)
        )
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        self.address = f"{host}:{self.port}"

    def _unary(self, handler: Callable[[dict[str, Any]], dict[str, Any]]) -> grpc.RpcMethodHandler:
        def call(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                message = open_sealed(request, self._token)
                self._replay.admit(str(message.body.get("job", "")), message)
            except WireError as exc:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
            try:
                return seal(handler(message.body), self._token)
            except policy.PoolRefusal as exc:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            except StoreError as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"pool state store: {exc}")
            except (KeyError, TypeError, ValueError) as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad request: {exc!r}")
            raise AssertionError("unreachable")

        return grpc.unary_unary_rpc_method_handler(call)

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float = 1.0) -> None:
        self._server.stop(grace).wait()
