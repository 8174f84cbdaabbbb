"""Simulated node agents and ranks for ``python -m bench.control``, over the real control RPCs.

One grpc.aio process plays a whole cluster against a real controller: node 0 is the
controller's own node (its ranks join and report over gRPC like any worker; its agent lives in
the controller's process, see :mod:`bench.control`), nodes 1..N-1 are remote node agents
(``NodeJoin``, a ``NodeWatch`` stream, a ``heartbeat`` every 0.5 s on its stream). Every rank
joins, holds its ``Watch`` stream and heartbeats (a ``progress`` report every 0.5 s after the
previous one was answered, with a 2 s deadline, as :func:`torchrelay.control.lease.keep_alive`
does). Each rank answers its messages as :mod:`torchrelay.runtime.recovery` does: an
``abort`` with ``halted``; a ``plan`` with the phases ``comm_ready`` and ``transfer_done`` and
its first ``progress`` with ``first_after_recovery``, posted; a spare reports ``ready`` once
joined. Heartbeats and the other reports go on the rank's two open streams, one per lane, as a
worker's do (a ``Report`` call each for the lanes in ``--unary``).

A failure is a node agent reporting that one of its ranks exited (``NodeReport`` ``exit``,
SIGKILL); :meth:`Cluster.fail` times it from that report to the plan on every survivor's stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.control_ledger import LedgerTail
from torchrelay.control.client import SERVICE
from torchrelay.control.lease import HEARTBEAT_INTERVAL, HEARTBEAT_RPC_TIMEOUT
from torchrelay.control.report_stream import Lane
from torchrelay.control.wire import seal, unseal

PER_NODE = 8
MAX_STEPS = 1_000_000
IN_FLIGHT = 256  # setup requests in flight at once (joins, reports): a burst, not a flood
# A worker's step timings as it heartbeats them once it has committed a step.
TIMINGS = {"step_seconds": 0.1, "compute_seconds": 0.08}
# A process's open streams of reports (grpc.aio calls), one per lane once it has sent on it,
# each with the lock that keeps one report at a time on it (as a worker's lane lock does).
Streams = dict[Lane, tuple[Any, asyncio.Lock]]
# The call that carries a lane's report instead, with --unary.
UNARY = {Lane.HEARTBEATS: "Report", Lane.REPORTS: "Report", Lane.NODE_HEARTBEATS: "NodeReport"}


@dataclass
class Rank:
    """One simulated process: a worker in ``slot``, or a spare (``slot`` None) until a plan."""

    process: str
    node: str
    slot: int | None
    generation: int = 0
    committed: int = 0
    alive: bool = True
    streams: Streams = field(default_factory=dict)


@dataclass
class Failure:
    """One injected failure, timed on this process's clock (``time.perf_counter``)."""

    process: str
    slot: int
    sent: float  # the exit report left
    reported: float = 0.0  # the controller answered the exit report
    aborted: float = 0.0  # the last survivor got its abort
    planned_first: float = 0.0  # the first survivor got the plan
    planned: float = 0.0  # the last survivor got the plan
    done: float = 0.0  # recovery_done was in the ledger
    waiting_abort: set[str] = field(default_factory=set)
    waiting_plan: set[str] = field(default_factory=set)
    plan_seen: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Beats:
    """Heartbeats answered (latency in seconds, per kind) and refused, while recording."""

    recording: bool = False
    latencies: list[float] = field(default_factory=list)
    node_latencies: list[float] = field(default_factory=list)
    timed_out: int = 0  # since the start, recording or not
    sent: int = 0  # since the start
    bench_cpu: float = 0.0  # this process's CPU seconds while recording
    refused: list[str] = field(default_factory=list)  # heartbeats and other reports


async def bounded(calls: Iterable[Coroutine[Any, Any, Any]], limit: int = IN_FLIGHT) -> list[Any]:
    """Await ``calls`` with at most ``limit`` in flight; the first error cancels the rest."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Coroutine[Any, Any, Any]) -> Any:
        async with gate:
            return await call

    tasks = [asyncio.ensure_future(one(c)) for c in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class Cluster:
    """``nodes`` x :data:`PER_NODE` ranks and ``spares`` spares per node (see module doc)."""

    def __init__(
        self,
        address: str,
        token: str,
        nodes: int,
        spares: int,
        ledger: Path,
        timings: bool,
        beat_interval: float = HEARTBEAT_INTERVAL,
        unary: frozenset[Lane] = frozenset(),
    ) -> None:
        self.token = token
        self.nodes = [f"node{i}" for i in range(nodes)]
        self.spares = spares
        self.timings = TIMINGS if timings else {}
        self.beat_interval = beat_interval  # a rank's; node agents beat every 0.5 s
        self.unary = unary  # lanes whose reports are a Report call each, not a stream
        self.ledger = LedgerTail(ledger)
        channels = max(8, nodes // 16)
        options = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
        self._pool = [grpc.aio.insecure_channel(address, options=options) for _ in range(channels)]
        self._stubs: dict[tuple[int, str], Any] = {}
        self.ranks: dict[str, Rank] = {}
        self.beats = Beats()
        self.failure: Failure | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._spares_started = 0
        self._running = True

    # ------------------------------------------------------------------ RPCs
    def _channel(self, who: str) -> int:
        return hash(who) % len(self._pool)

    async def call(
        self, who: str, method: str, body: dict[str, Any], timeout: float = 120.0
    ) -> dict[str, Any]:
        index = self._channel(who)
        stub = self._stubs.get((index, method))
        if stub is None:
            stub = self._stubs[index, method] = self._pool[index].unary_unary(
                f"/{SERVICE}/{method}"
            )
        reply = await stub(
            seal({"process": who, **body}, self.token), timeout=timeout, wait_for_ready=True
        )
        return unseal(reply, self.token)

    async def send_on(
        self, who: str, streams: Streams, lane: Lane, body: dict[str, Any], timeout: float = 120.0
    ) -> dict[str, Any]:
        """The report of process ``who`` on its open stream of ``lane`` (``streams``: its open
        ones), as a worker or a node agent sends it (:mod:`torchrelay.control.report_stream`),
        the stream opened again after one fails; a call of its own for a lane in ``unary``."""
        if lane in self.unary:
            return await self.call(who, UNARY[lane], body, timeout=timeout)
        if lane not in streams:
            channel = self._pool[self._channel(who)]
            call = channel.stream_stream(f"/{SERVICE}/{lane.method}")(wait_for_ready=True)
            streams[lane] = (call, asyncio.Lock())
        call, lock = streams[lane]
        async with lock:
            try:
                await call.write(seal({"process": who, **body}, self.token))
                reply = await asyncio.wait_for(call.read(), timeout)
                if reply is grpc.aio.EOF:  # ends the process's reports: the scale stops
                    raise RuntimeError(f"the controller ended a stream of {who}")
                return unseal(reply, self.token)
            except BaseException:
                call.cancel()
                if streams.get(lane, (None,))[0] is call:
                    del streams[lane]
                raise

    async def report(self, rank: Rank, kind: str, **body: Any) -> dict[str, Any]:
        """A report other than a heartbeat: one a worker waits for the answer of (a halt,
        ``ready``, ``max_steps``), or posts (a recovery's phases, its first step)."""
        body = {"kind": kind, "generation": rank.generation, **body}
        return await self.send_on(rank.process, rank.streams, Lane.REPORTS, body)

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        if not self._running:  # closing: a spare asked for now is never needed
            coroutine.close()
            return
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Task[Any]) -> None:
        """A spawned task ended: a refused report (a rank fenced by an overloaded controller)
        is kept as a reason to stop the scale, never raised into the loop."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        if isinstance(error, grpc.aio.AioRpcError):
            self.beats.refused.append(f"{error.code().name} {error.details()}")
        else:
            self.beats.refused.append(repr(error))

    async def _open(self, who: str, method: str, body: dict[str, Any]) -> Any:
        stream = self._pool[self._channel(who)].unary_stream(f"/{SERVICE}/{method}")(
            seal({"process": who, **body}, self.token), wait_for_ready=True
        )
        await stream.initial_metadata()  # the server has registered the stream
        return stream

    # ------------------------------------------------------------------ setup
    async def start(self) -> None:
        """Join every node agent and rank, open every stream, declare, start heartbeating."""
        remote = self.nodes[1:]
        await bounded(self.call(f"agent-{n}", "NodeJoin", {"node": n}) for n in remote)
        agents = await bounded(self._open(f"agent-{n}", "NodeWatch", {"node": n}) for n in remote)
        for node, stream in zip(remote, agents, strict=True):
            self.spawn(self._serve_node(node, stream))
            self.spawn(self._node_heartbeat(node))
        workers = [
            Rank(f"{node}-rank{r}", node, i * PER_NODE + r)
            for i, node in enumerate(self.nodes)
            for r in range(PER_NODE)
        ]
        await bounded(self._join(rank) for rank in workers)
        # Every worker declares max_steps on entering its loop; step 0 is committed by then.
        await bounded(self.report(w, "max_steps", max_steps=MAX_STEPS) for w in workers)
        for rank in workers:
            self.spawn(self._heartbeat(rank))
        await bounded(self._start_spare(node) for node in self.nodes for _ in range(self.spares))

    async def _join(self, rank: Rank) -> None:
        role = "spare" if rank.slot is None else "worker"
        body = {"role": role, "pid": len(self.ranks), "node": rank.node, "slot": rank.slot}
        joined = await self.call(rank.process, "Join", body)
        rank.generation = int(joined["generation"])
        self.ranks[rank.process] = rank
        stream = await self._open(rank.process, "Watch", {})
        self.spawn(self._serve_rank(rank, stream))

    async def _start_spare(self, node: str) -> None:
        self._spares_started += 1
        spare = Rank(f"{node}-spare{self._spares_started}", node, None, committed=-1)
        await self._join(spare)
        await self.report(spare, "ready")
        self.spawn(self._heartbeat(spare))

    def start_local_spare(self) -> None:
        """The controller asked its own node's agent for a spare (see :mod:`bench.control`)."""
        self.spawn(self._start_spare(self.nodes[0]))

    # ------------------------------------------------------------------ steady state
    async def _heartbeat(self, rank: Rank) -> None:
        def beat() -> dict[str, Any]:
            body = {"kind": "progress", "generation": rank.generation, "step": rank.committed}
            if rank.slot is not None:
                body.update(step_age=0.01, waiting=None, busy=None, **self.timings)
            return body

        going = lambda: rank.alive  # noqa: E731  (a dead rank's last heartbeat may be refused)
        lane, latencies = Lane.HEARTBEATS, self.beats.latencies
        await self._beats(rank.process, rank.streams, lane, beat, latencies, going)

    async def _node_heartbeat(self, node: str) -> None:
        beat = {"node": node, "kind": "heartbeat"}
        lane, latencies = Lane.NODE_HEARTBEATS, self.beats.node_latencies
        await self._beats(f"agent-{node}", {}, lane, lambda: beat, latencies, lambda: True)

    async def _beats(
        self,
        who: str,
        streams: Streams,
        lane: Lane,
        beat: Callable[[], dict[str, Any]],
        latencies: list[float],
        going: Callable[[], bool],
    ) -> None:
        """``who``'s heartbeats on ``lane`` while ``going()``, each an interval after the
        last was answered (a rank's ``beat_interval``; a node agent's 0.5 s)."""
        interval = self.beat_interval if lane is Lane.HEARTBEATS else HEARTBEAT_INTERVAL
        while self._running and going():
            await asyncio.sleep(interval)
            sent = time.perf_counter()
            self.beats.sent += 1
            try:
                await self.send_on(who, streams, lane, beat(), HEARTBEAT_RPC_TIMEOUT)
            except asyncio.TimeoutError:  # no answer within the deadline, on the stream
                self.beats.timed_out += 1
                continue
            except grpc.aio.AioRpcError as exc:
                if going():
                    self._beat_failed(who, exc)
                continue
            if self.beats.recording:
                latencies.append(time.perf_counter() - sent)

    def _beat_failed(self, who: str, exc: grpc.aio.AioRpcError) -> None:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            self.beats.timed_out += 1
        elif self._running:
            self.beats.refused.append(f"{who}: {exc.code().name} {exc.details()}")

    async def _serve_node(self, node: str, stream: Any) -> None:
        async for raw in stream:
            command = unseal(raw, self.token)
            if command["type"] == "start_spare":
                self.spawn(self._start_spare(node))
            elif command["type"] == "finish":
                return
            # ``signal``: the failed rank this bench reported is already gone.

    # ------------------------------------------------------------------ recovery
    async def _serve_rank(self, rank: Rank, stream: Any) -> None:
        async for raw in stream:
            message = unseal(raw, self.token)
            now, failure = time.perf_counter(), self.failure
            if message["type"] == "abort" and message["generation"] == rank.generation:
                if failure is not None and rank.process in failure.waiting_abort:
                    failure.waiting_abort.discard(rank.process)
                    failure.aborted = now
                self.spawn(self.report(rank, "halted", committed=rank.committed, in_flight=None))
            elif message["type"] == "plan":
                if failure is not None and rank.process in failure.waiting_plan:
                    failure.waiting_plan.discard(rank.process)
                    failure.planned_first = failure.planned_first or now
                    if not failure.waiting_plan:
                        failure.planned = now
                        failure.plan_seen.set()
                self.spawn(self._enter(rank, message))
            elif message["type"] == "finish":
                return

    async def _enter(self, rank: Rank, plan: dict[str, Any]) -> None:
        rank.generation, rank.slot = int(plan["generation"]), int(plan["slot"])
        rank.committed = int(plan["target_step"])
        await self.report(rank, "phase", phase="comm_ready", t=time.time())
        await self.report(rank, "phase", phase="transfer_done", t=time.time(), bytes=0, seconds=0)
        await self.report(
            rank, "progress", step=rank.committed, first_after_recovery=True, t=time.time()
        )

    async def fail(self, process: str, timeout: float) -> Failure:
        """Report ``process`` dead (SIGKILL) from its node agent; return once the plan reached
        every survivor and the controller recorded ``recovery_done``."""
        rank = self.ranks[process]
        assert rank.slot is not None
        survivors = {
            r.process for r in self.ranks.values() if r.alive and r.slot is not None and r != rank
        }
        failure = Failure(process, rank.slot, time.perf_counter(), waiting_abort=set(survivors))
        failure.waiting_plan = set(survivors)
        self.failure, rank.alive = failure, False
        generation, seen = rank.generation, len(self.ledger.events)
        body = {"node": rank.node, "kind": "exit", "exited": process, "returncode": -9}
        await self.call(f"agent-{rank.node}", "NodeReport", body)
        failure.reported = time.perf_counter()
        await self.ledger.until(failure.plan_seen.is_set, timeout)

        def done() -> bool:
            return any(
                e["event"] == "recovery_done" and e["generation"] > generation
                for e in self.ledger.events[seen:]
            )

        await self.ledger.until(done, timeout)
        failure.done = time.perf_counter()
        return failure

    async def close(self) -> None:
        self._running = False
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(channel.close() for channel in self._pool))
