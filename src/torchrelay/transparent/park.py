"""The park protocol: how a quiesced worker waits to be snapshotted and learns what it is after.

A transparent-mode worker is started with two pipes from its agent, their fd numbers in its
environment: ``TORCHRELAY_PARK_FD`` (it reads instructions there) and ``TORCHRELAY_PARKED_FD``
(it writes notices there). At a step boundary, with no socket and no io_uring left open (the
hook's business), the worker calls :func:`wait`:

1. it writes one sealed JSON line, the :class:`Notice` ("parked", its pid and a fresh nonce),
   to ``TORCHRELAY_PARKED_FD``;
2. it blocks reading ONE sealed JSON line, the :class:`Instruction`, from ``TORCHRELAY_PARK_FD``.

While it blocks, the agent may dump it (:mod:`torchrelay.transparent.cloner`). A clone is
restored with NEW pipes in place of both park fds (``criu restore --inherit-fd``) and of its
stdout/stderr, so the donor and the clone each read their own instruction from the same fd
number: the donor ``CONTINUE``, the clone ``BECOME`` (slot, generation, store, endpoint, env).

Every line is sealed with the job token (:func:`torchrelay.control.wire.seal`); nothing is
unpickled. An instruction must answer this park's nonce (``reply_to``), so no instruction
meant for another park is ever obeyed. :func:`wait` raises :class:`ParkError` (one line) on a
closed pipe (the agent died), a forged or malformed line, or a wrong ``reply_to``; the caller
should then exit.

Around the snapshot the worker's parent-death signal is cleared (CRIU restores it, and the
restored process's first parent is the short-lived ``criu restore``, whose exit would kill it)
and set again to SIGKILL once the instruction is read: a clone dies with its new parent (its PID
namespace's init, restored with it, which ends when its :mod:`nsinit` outer, bound to the
agent, is gone), the donor with its old one.
"""

from __future__ import annotations

import ctypes
import enum
import os
import secrets
import signal
from dataclasses import dataclass, field
from typing import Any

from torchrelay.control.wire import WireError, seal, unseal

PARK_FD_ENV = "TORCHRELAY_PARK_FD"
PARKED_FD_ENV = "TORCHRELAY_PARKED_FD"
_MAX_LINE = 1024 * 1024  # an instruction is a few hundred bytes
_PR_SET_PDEATHSIG = 1


class ParkError(RuntimeError):
    """The park channel failed: closed, forged, malformed, or an answer to another park."""


class Kind(enum.Enum):
    """What a parked worker does next.

    CONTINUE: go on as it was (the donor of a clone, a worker whose dump was abandoned).
    BECOME: it is a restored copy; take the identity in the instruction, then go on.
    """

    CONTINUE = "continue"
    BECOME = "become"


@dataclass(frozen=True)
class Instruction:
    """The one message a parked worker waits for.

    ``generation`` is the job's membership generation to rebuild the process group in.
    For ``BECOME``: ``slot`` is the rank to take, ``store`` the ``host:port`` of the TCPStore
    to rendezvous on, ``endpoint`` the controller's control endpoint, ``world_size`` the group's
    size, and ``env`` the environment variables to set (``RANK``, ``LOCAL_RANK``, ...). For
    ``CONTINUE`` they may still carry a new store or generation (the group is rebuilt anyway).
    """

    kind: Kind
    generation: int
    slot: int | None = None
    world_size: int | None = None
    store: str | None = None
    endpoint: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def to_wire(self, reply_to: str) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "reply_to": reply_to,
            "generation": self.generation,
            "slot": self.slot,
            "world_size": self.world_size,
            "store": self.store,
            "endpoint": self.endpoint,
            "env": dict(self.env),
        }

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Instruction:
        """Parse an authenticated body; raise :class:`ParkError` on a malformed one."""
        try:
            env = body.get("env") or {}
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
                raise TypeError("env must map strings to strings")
            return cls(
                kind=Kind(body["kind"]),
                generation=int(body["generation"]),
                slot=_opt(int, body.get("slot")),
                world_size=_opt(int, body.get("world_size")),
                store=_opt(str, body.get("store")),
                endpoint=_opt(str, body.get("endpoint")),
                env=dict(env),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ParkError(f"malformed park instruction: {exc}") from None


def _opt(kind: type, value: Any) -> Any:
    return None if value is None else kind(value)


@dataclass(frozen=True)
class Notice:
    """A worker's "I am parked": its pid (in its own PID namespace) and this park's nonce."""

    pid: int
    nonce: str


# ------------------------------------------------------------------ worker side
def wait(token: str, *, environ: dict[str, str] | None = None) -> Instruction:
    """Park: tell the agent, block for ONE instruction answering this park, return it.

    Call it with every socket closed: the agent may snapshot this process while it blocks.
    Raises :class:`ParkError` (one line) when the channel is missing from the environment,
    closed (the agent died), or carries a forged, malformed or misaddressed line.
    """
    env = os.environ if environ is None else environ
    try:
        read_fd, write_fd = int(env[PARK_FD_ENV]), int(env[PARKED_FD_ENV])
    except (KeyError, ValueError):
        raise ParkError(
            f"no park channel: {PARK_FD_ENV}/{PARKED_FD_ENV} unset; this process was not "
            "started by a transparent-mode agent"
        ) from None
    nonce = secrets.token_hex(16)
    _set_parent_death_signal(0)
    try:
        _write_line(write_fd, seal({"parked": os.getpid(), "nonce": nonce}, token))
        body = _unseal(_read_line(read_fd), token, "instruction")
    finally:
        _set_parent_death_signal(signal.SIGKILL)
    if body.get("reply_to") != nonce:
        raise ParkError("park instruction answers another park; refused")
    return Instruction.from_wire(body)


def _set_parent_death_signal(signum: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


# ------------------------------------------------------------------ agent side
@dataclass
class Channel:
    """The agent's ends of one worker's park pipes, and the worker's fd numbers for them.

    ``child_fds`` are (instructions read end, notices write end): pass them to the worker
    (``pass_fds``) with :meth:`environment`, then call :meth:`close_child_ends`. The numbers
    stay valid as the worker's (and its copies') fd numbers after this process closed them.
    """

    instructions: int  # agent writes here
    notices: int  # agent reads here
    child_fds: tuple[int, int]
    _held: set[int] = field(default_factory=set, repr=False)  # fds still open here

    @classmethod
    def open(cls) -> Channel:
        instr_r, instr_w = os.pipe()
        notice_r, notice_w = os.pipe()
        held = {instr_r, instr_w, notice_r, notice_w}
        return cls(instr_w, notice_r, (instr_r, notice_w), held)

    def environment(self) -> dict[str, str]:
        return {PARK_FD_ENV: str(self.child_fds[0]), PARKED_FD_ENV: str(self.child_fds[1])}

    def close_child_ends(self) -> None:
        self._close(self.child_fds)

    def close(self) -> None:
        self._close(tuple(self._held))

    def _close(self, fds: tuple[int, ...]) -> None:
        # Each fd once: a number closed twice may by then be another thread's file.
        for fd in fds:
            if fd in self._held:
                self._held.discard(fd)
                os.close(fd)

    def wait_parked(self, token: str) -> Notice:
        """Block until the worker parks; raise :class:`ParkError` if it exits first."""
        body = _unseal(_read_line(self.notices), token, "park notice")
        try:
            return Notice(pid=int(body["parked"]), nonce=str(body["nonce"]))
        except (KeyError, TypeError, ValueError):
            raise ParkError("malformed park notice") from None

    def instruct(self, notice: Notice, instruction: Instruction, token: str) -> None:
        """Answer the park ``notice`` with ``instruction``; :class:`ParkError` if the worker
        is gone."""
        _write_line(self.instructions, seal(instruction.to_wire(notice.nonce), token))


# ------------------------------------------------------------------ lines
def _write_line(fd: int, data: bytes) -> None:
    line = data + b"\n"
    try:
        while line:
            line = line[os.write(fd, line) :]
    except OSError as exc:
        raise ParkError(f"park channel closed: {exc.strerror}") from None


def _read_line(fd: int) -> bytes:
    # One byte at a time: nothing past this line may be consumed (and dumped) by this read.
    out = bytearray()
    while True:
        try:
            byte = os.read(fd, 1)
        except OSError as exc:
            raise ParkError(f"park channel closed: {exc.strerror}") from None
        if not byte:
            raise ParkError("park channel closed (the other side exited)")
        if byte == b"\n":
            return bytes(out)
        out += byte
        if len(out) > _MAX_LINE:
            raise ParkError(f"park message longer than {_MAX_LINE} bytes; refused")


def _unseal(line: bytes, token: str, what: str) -> dict[str, Any]:
    try:
        return unseal(line, token)
    except WireError as exc:
        raise ParkError(f"{what} refused: {exc}") from None


__all__ = ["Channel", "Instruction", "Kind", "Notice", "ParkError", "wait"]
