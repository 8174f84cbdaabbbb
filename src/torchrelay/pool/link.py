"""The launcher's side of ``torchrelay run --pool``: attach, report, carry out commands.

:meth:`PoolLink.attach` registers the job before any worker starts (a refusal is one line and
the job does not start). A thread then keeps one ``Sync`` long poll open: each call reports the
job's live processes, whether it is recovering or parked, the replacements its controller asked for
(:meth:`ask`, called by the controller's executor under its lock: it only queues) and the
releases it refused; the answer's commands go to the controller
(:meth:`~torchrelay.control.pool_side.PoolSide.pool_command`), which records each in the
ledger. At the end :meth:`close` detaches, giving the job's slots back (a loan is paid back
first). A pool that cannot be reached is retried; meanwhile a recovery waiting for it runs into
``--spare-timeout`` as it would waiting for a spare.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from torchrelay.config import PoolSpec
from torchrelay.pool.client import PoolClient, PoolError

POLL = 0.25
"""Seconds a ``Sync`` long poll waits for a command: the latency of a report (a lender's
process count) reaching the pool."""


class PoolLink:
    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self._client = PoolClient(spec.address, spec.token, spec.name)
        self._lock = threading.Lock()
        self._lost = 0
        self._refused: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, size: int, min_nproc: int, elastic: bool) -> list[int]:
        """Register the job; ``SystemExit`` with the pool's one line if refused."""
        try:
            answer = self._client.call(
                "Attach",
                {
                    "size": size,
                    "min_nproc": min_nproc,
                    "priority": self.spec.priority,
                    "elastic": elastic,
                    "parkable": self.spec.parkable,
                },
            )
        except PoolError as exc:
            self._client.close()
            raise SystemExit(f"torchrelay run: --pool {self.spec.address}: {exc}") from None
        return [int(s) for s in answer["slots"]]

    def ask(self, slots: int) -> None:
        """Queue a request for ``slots`` replacements (sent by the next ``Sync``)."""
        with self._lock:
            self._lost += slots

    def start(self, controller: Any) -> None:
        """Serve ``controller`` (a :class:`~torchrelay.control.controller.Controller`)."""
        controller.attach_pool(self.ask)
        self._thread = threading.Thread(
            target=self._run, args=(controller,), name="torchrelay-pool-link", daemon=True
        )
        self._thread.start()

    def _run(self, controller: Any) -> None:
        complained = False
        while not self._stop.is_set():
            processes, recovering, parked = controller.pool_view()
            with self._lock:
                lost, self._lost = self._lost, 0
                refused, self._refused = self._refused, {}
            body = {
                "processes": processes,
                "recovering": recovering,
                "lost": lost,
                "refused": refused,
                "parked": parked,
                "wait": POLL,
            }
            try:
                answer = self._client.call("Sync", body, timeout=POLL + 10.0)
                complained = False
            except PoolError as exc:
                with self._lock:  # sent again with the next call
                    self._lost += lost
                    self._refused.update(refused)
                if not complained:
                    print(f"torchrelay: pool {self.spec.address}: {exc}", file=sys.stderr)
                    complained = True
                self._stop.wait(1.0)
                continue
            for command in answer["commands"]:
                why = controller.pool_command(command)
                if why is not None:
                    with self._lock:
                        self._refused[str(command["loan"])] = why

    def close(self) -> None:
        """Stop reporting and detach: the job's slots go back to the pool."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=POLL + 15.0)
        try:
            self._client.call("Detach", {})
        except PoolError as exc:
            print(f"torchrelay: pool {self.spec.address}: detach: {exc}", file=sys.stderr)
        finally:
            self._client.close()
