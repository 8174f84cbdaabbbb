"""Replicated and rank-local state: the agreement check and the local-state mirror.

Everything :meth:`Relay.track` registers is *replicated*: a replacement receives a survivor's
copy. State that differs across ranks (a per-rank loss sum) would be silently overwritten, so

- :class:`AgreementCheck` compares a digest of every tracked object across ranks (xxHash3 of
  the tensors' bytes -- of their block sums, for a GPU tensor -- and of the JSON schema of the
  rest, all-gathered on the process group): after the job's first two committed steps, and
  after the second committed step of every generation a plan started (a recovery, a handover,
  a resize). A difference is reported, naming the objects; it does not stop the job. After a
  recovery the check also confirms that the replacement holds exactly what the survivors
  hold. It skips that generation's first commit on purpose: that commit ends the recomputed
  step, and a check right after it would lengthen the recovery's stall (a pass over the whole
  state; 5-10 ms a check on the 2-core benchmark machine). One check is enough there: the
  transfer has already verified every byte it delivered.
- :class:`LocalMirror` keeps small *rank-local* state (``relay.track(local=...)``) exact: at the
  end of every step each rank's local state is all-gathered (a collective of the step: if it
  fails, the step is poisoned like any other). The table of every rank's state as of the last
  committed step whose exchange completed travels, as plain JSON inside the sealed transfer
  schema written by one source, with the state transfer, so a replacement receives its own
  slot's local state. It is meant for small values (counters, sums): the table is world size
  times its size and goes through the job's store.

Serialization is the transfer schema (:mod:`torchrelay.transfer.flatten`): JSON plus raw tensor
bytes, never pickle. The collectives here go through the stable process group; every rank must
track the same objects (the collectives would not match otherwise).
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import xxhash

from torchrelay.runtime.tracked import TrackingError
from torchrelay.transfer.flatten import TensorSpec, as_bytes, flatten, unflatten

# The commits of a generation that are checked (1: its first): in the job's first generation
# (rank-local state shows at once, or one step later), and in one a plan started.
START_CHECKS = (1, 2)
PLANNED_CHECKS = (2,)
_HEADER_LENGTH = _LENGTH = 8


# ------------------------------------------------------------------ serialization
def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    return as_bytes(tensor.detach().cpu().contiguous()).numpy().tobytes()


def _header(state: Any) -> tuple[bytes, list[torch.Tensor]]:
    tree, tensors, specs = flatten(state)
    header = {"tree": tree, "specs": [s.to_json() for s in specs]}
    return json.dumps(header, separators=(",", ":")).encode(), tensors


def encode(state: Any) -> bytes:
    """``state`` (tensors, numbers, strings, containers) as bytes: a JSON header, then the
    tensors' raw bytes. Raises ``SchemaError`` for anything else (it is never pickled)."""
    header, tensors = _header(state)
    parts = [len(header).to_bytes(_HEADER_LENGTH, "little"), header]
    parts += [_tensor_bytes(t) for t in tensors]
    return b"".join(parts)


def decode(data: bytes) -> Any:
    """The state :func:`encode` wrote (tensors on the CPU); ``ValueError`` if malformed."""
    length = int.from_bytes(data[:_HEADER_LENGTH], "little")
    header = json.loads(data[_HEADER_LENGTH : _HEADER_LENGTH + length])
    specs = [TensorSpec.from_json(s) for s in header["specs"]]
    offset = _HEADER_LENGTH + length
    tensors = []
    for spec in specs:
        raw = data[offset : offset + spec.nbytes]
        offset += spec.nbytes
        if len(raw) != spec.nbytes:
            raise ValueError("local state truncated")
        tensors.append(_as_tensor(raw).view(spec.dtype).reshape(spec.shape))
    if offset != len(data):
        raise ValueError("local state has trailing bytes")
    return unflatten(header["tree"], tensors)


def digest(state: Any) -> int:
    """63-bit xxHash3 of ``state``'s schema and tensor bytes (equal state, equal digest). A GPU
    tensor is reduced where it lies first (:func:`block_sums`): hashing its bytes on the host
    meant copying the whole state off the GPU at every check (a second of it per 10 GB)."""
    header, tensors = _header(state)
    hasher = xxhash.xxh3_64(header)
    for tensor in tensors:
        data = tensor.detach().contiguous()
        if data.device.type == "cuda":
            data = block_sums(data)
        # The tensor's own bytes, not a copy: this runs at the first steps of every generation.
        hasher.update(as_bytes(data.cpu()).numpy())
    return hasher.intdigest() & (2**63 - 1)


# 32-bit words summed per block: what crosses to the host is 1/512 of a tensor's bytes.
BLOCK_WORDS = 1024


def block_sums(tensor: torch.Tensor) -> torch.Tensor:
    """The sums (int64) of each block of :data:`BLOCK_WORDS` 32-bit words of a contiguous
    tensor's bytes, then its trailing bytes one by one, computed on the tensor's device.

    A digest of these tells replicas apart, not an adversary: any one changed word changes its
    block's sum, and so do values moved across blocks; changes that cancel within one block
    (two words swapped) are not seen. Replicas that drift apart change far more than that."""
    raw = as_bytes(tensor)
    if raw.storage_offset() % 4:  # a view at an odd place in its storage: no int32 view of it
        raw = raw.clone()
    whole = raw.numel() // (4 * BLOCK_WORDS) * (4 * BLOCK_WORDS)
    blocks = raw[:whole].view(torch.int32).view(-1, BLOCK_WORDS).sum(dim=1, dtype=torch.int64)
    return torch.cat([blocks, raw[whole:].to(torch.int64)])


# ------------------------------------------------------------------ collectives
def all_gather_bytes(
    group: dist.ProcessGroup, payload: bytes, device: torch.device, capacity: int = 0
) -> tuple[list[bytes], int]:
    """Every rank's ``payload`` in rank order, and the capacity to pass next time.

    One all-gather of ``capacity`` bytes plus a length per rank; when a payload does not fit
    (every rank sees the lengths), all grow the capacity to the next power of two and gather
    again, so a steady state costs one collective. Meaningless if the step got poisoned.
    """
    while True:
        buffer = torch.zeros(_LENGTH + capacity, dtype=torch.uint8)
        buffer[:_LENGTH] = _as_tensor(len(payload).to_bytes(_LENGTH, "little"))
        if len(payload) <= capacity:
            buffer[_LENGTH : _LENGTH + len(payload)] = _as_tensor(payload)
        buffer = buffer.to(device)
        gathered = [torch.zeros_like(buffer) for _ in range(group.size())]
        dist.all_gather(gathered, buffer, group=group)
        rows = [g.cpu().numpy().tobytes() for g in gathered]
        lengths = [int.from_bytes(row[:_LENGTH], "little") for row in rows]
        if lengths[group.rank()] != len(payload):
            return [], capacity  # nothing arrived: the step is poisoned
        if max(lengths) <= capacity:
            return [
                row[_LENGTH : _LENGTH + n] for row, n in zip(rows, lengths, strict=True)
            ], capacity
        capacity = 1 << (max(lengths) - 1).bit_length()


def _as_tensor(data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def disagreements(names: list[str], rows: list[list[int]]) -> dict[str, list[list[int]]]:
    """For each object whose digest is not the same on every rank: the ranks grouped by the
    value they hold. ``rows[r]`` are rank ``r``'s digests, in ``names`` order."""
    found: dict[str, list[list[int]]] = {}
    for column, name in enumerate(names):
        groups: dict[int, list[int]] = {}
        for rank, row in enumerate(rows):
            groups.setdefault(row[column], []).append(rank)
        if len(groups) > 1:
            found[name] = sorted(groups.values())
    return found


class AgreementCheck:
    """Digest agreement of the replicated (tracked) state; see the module doc."""

    def __init__(self) -> None:
        self._generation = -1
        self._commits = 0
        self._planned = -1  # the last generation a plan started
        self.reported: set[str] = set()

    def planned(self, generation: int) -> None:
        """``generation`` was started by a plan (every member is told so by the same plan, so
        all of them check the same commits)."""
        self._planned = generation

    def due(self, generation: int) -> bool:
        """Called once per committed step: whether a check follows this commit."""
        if generation != self._generation:
            self._generation, self._commits = generation, 0
        self._commits += 1
        checked = PLANNED_CHECKS if generation == self._planned else START_CHECKS
        return self._commits in checked

    def run(
        self,
        group: dist.ProcessGroup,
        device: torch.device,
        states: dict[str, Any],
        step: int,
        complete: Callable[[], bool],
    ) -> dict[str, list[list[int]]] | None:
        """All-gather the digests; the objects that differ (not reported before), or ``None``
        if the collective did not ``complete()`` (a failed collective poisons the step).

        Raises ``RuntimeError`` if the ranks are at different steps or track different names
        (a script that resumed from different snapshots): the same error on every rank.
        """
        names = sorted(states)
        row = [step, digest(names)] + [digest(states[name]) for name in names]
        mine = torch.tensor(row, dtype=torch.int64, device=device)
        rows = [torch.zeros_like(mine) for _ in range(group.size())]
        dist.all_gather(rows, mine, group=group)
        if not complete():
            return None
        table = [r.tolist() for r in rows]
        if len({r[0] for r in table}) > 1:
            raise RuntimeError(
                f"the ranks are at different steps ({sorted({r[0] for r in table})}): every "
                "rank must pass the same start_step to relay.steps (resume all from one snapshot)"
            )
        if len({r[1] for r in table}) > 1:
            raise RuntimeError(
                "the ranks track different objects: call relay.track with the same names on "
                "every rank"
            )
        found = disagreements(names, [r[2:] for r in table])
        new = {name: groups for name, groups in found.items() if name not in self.reported}
        self.reported.update(new)
        return new


def describe(found: dict[str, list[list[int]]], step: int) -> str:
    """One line for stderr and the ledger."""
    parts = ", ".join(f"{name!r} (ranks {' | '.join(map(str, g))})" for name, g in found.items())
    return (
        f"torchrelay: tracked state differs across ranks after step {step}: {parts}. Tracked "
        "state is replicated: after a failure the replacement gets a survivor's copy, so a "
        "rank-local value is lost. Keep rank-local state in relay.track(local=...)"
    )


# ------------------------------------------------------------------ rank-local state
class LocalMirror:
    """One rank's local state and its mirror of every rank's; see the module doc.

    ``obj`` has ``state_dict()``/``load_state_dict()``, or is a plain dict (kept in place).
    """

    def __init__(self, obj: Any) -> None:
        if not isinstance(obj, dict) and not (
            callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))
        ):
            raise TrackingError(
                f"cannot track local={type(obj).__name__}: it needs state_dict() and "
                "load_state_dict() methods, or must be a dict"
            )
        self.obj = obj
        self.table: dict[int, bytes] = {}
        self.table_step = -1
        self._pending: tuple[int, dict[int, bytes]] | None = None
        self._capacity = 0
        self._generation = -1

    def state_dict(self) -> Any:
        if isinstance(self.obj, dict):
            return copy.deepcopy(self.obj)
        return self.obj.state_dict()

    def load_state_dict(self, state: Any) -> None:
        if isinstance(self.obj, dict):
            self.obj.clear()
            self.obj.update(state)
        else:
            self.obj.load_state_dict(state)

    def snapshot(self) -> Any:
        """A copy to restore if the step is dropped."""
        return copy.deepcopy(self.state_dict())

    def restore(self, snap: Any) -> None:
        self.load_state_dict(copy.deepcopy(snap))

    def exchange(
        self, group: dist.ProcessGroup, device: torch.device, step: int, generation: int
    ) -> bool:
        """Gather every rank's local state as of the end of ``step``; whether it completed.

        Completion is read from the collective's own result (every rank's length arrived), not
        from the step's later health: an abort that lands after a complete exchange must not
        discard it, or the survivors' table stays a step behind the weights. A complete
        exchange becomes the table when :meth:`commit` says the step committed.
        """
        if generation != self._generation:
            # The buffer size must match on every rank: a replacement starts from scratch, so
            # every member of a new generation does.
            self._generation, self._capacity = generation, 0
        payload = encode(self.state_dict())
        gathered, self._capacity = all_gather_bytes(group, payload, device, self._capacity)
        self._pending = (step, dict(enumerate(gathered))) if gathered else None
        return bool(gathered)

    def commit(self, committed: bool) -> None:
        """The step ``committed`` (or was dropped); a complete exchange of it becomes the table."""
        if committed and self._pending is not None:
            self.table_step, self.table = self._pending
        self._pending = None

    def for_transfer(self) -> dict[str, Any]:
        """The table as plain JSON, sent by one source only (see ``send_state``'s sidecar):
        survivors can differ by one exchange (a rank that died inside the all-gather may
        have reached some of them), so the receiver must not mix their copies."""
        ranks = {str(r): base64.b64encode(b).decode("ascii") for r, b in self.table.items()}
        return {"step": self.table_step, "ranks": ranks}

    def receive(self, sent: dict[str, Any], slot: int, target: int) -> str | None:
        """Load ``slot``'s entry of a source's table; a warning line if it is not exact."""
        try:
            ranks = {int(r): base64.b64decode(b, validate=True) for r, b in sent["ranks"].items()}
            step = int(sent["step"])
            mine = decode(ranks[slot]) if slot in ranks else None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return (
                f"torchrelay: slot {slot}'s local state arrived malformed ({exc}); it restarts "
                "from its initial value"
            )
        self.table, self.table_step = ranks, step
        if slot not in ranks:
            if target < 0:
                return None  # nothing was committed: the initial local state is exact
            return (
                f"torchrelay: no copy of slot {slot}'s local state reached the survivors; it "
                "restarts from its initial value"
            )
        self.load_state_dict(mine)
        if self.table_step != target:
            return (
                f"torchrelay: slot {slot}'s local state is from step {self.table_step}, the "
                f"model from step {target} (its rank died after its optimizer step, before its "
                "local state was mirrored)"
            )
        return None
