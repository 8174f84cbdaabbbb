"""Each slot's random streams, mirrored to a file that outlives its worker, for its clone.

A clone (:mod:`torchrelay.transparent.cloner`) is a copy of a live donor: it carries the
DONOR's global RNG streams (torch CPU and CUDA, numpy, ``random``). A script that seeds each
rank differently (``torch.manual_seed(base + rank)``) would then draw, in the rebuilt slot,
other dropout masks and augmentations than the dead rank would have. So every transparent
worker mirrors the RNG part of each step boundary's snapshot (:class:`~torchrelay.transparent.
boundary.Boundary`) into its slot's file, and a clone that takes a slot sets its streams from
that slot's mirror: it goes on with the dead rank's streams, bit for bit.

**Where.** ``RUN_DIR/rng/slot-<N>`` (directory 0700, file 0600, opened without following
links), node-local: a dead rank of another node (or a lost node) leaves no mirror here, and its
clone keeps its donor's streams, saying so once (:class:`MirrorError`; the hook warns).

**Format.** The file holds two fixed slots of :data:`SLOT_BYTES`, written alternately (record
``seq`` goes to slot ``seq % 2``): a write torn by the worker's death damages one record, never
the other. A record is ``MAGIC | u32 length | HMAC-SHA256(token, DOMAIN + payload) | payload``;
the payload is raw bytes in this machine's byte order (the file never leaves the node): its
``seq``, slot, step and :class:`Point`, then the torch CPU state, the CUDA states, numpy's
MT19937 key and position, ``random``'s 625 words. No pickle: nothing in it is executed, and a
forged or torn record fails the MAC before any field is parsed. A record costs one ~10 KB
``pwrite`` per snapshot (see docs/transparent.md for the measured cost).

**Which record.** A record is tagged with where the snapshot was taken: the step it is the
boundary of, and the :class:`Point` in that step (the optimizer step before it, the first
fetch from a ``DistributedSampler``, ...). Data-parallel replicas run the same control flow, so
the same ``(step, point)`` is the same place in the script on every rank. The clone adopts the
record of the ``(step, point)`` of its first snapshot after it took the slot (:func:`choose`):
that is the place where the dead rank's streams were recorded, and the clone's own streams at
that place are the donor's. Two records are kept because the dead rank may have got one
boundary further than the step its peers void (its all-reduce finished before theirs was
aborted), and one torn record must not hide the other.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import os
import random
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchrelay.transparent.boundary import Boundary

MAGIC = b"TRRNG\x00\x01\x00"  # the format's name and version
DOMAIN = b"torchrelay rng mirror v1\x00"  # the MAC never verifies another use of the token
SLOT_BYTES = 32 * 1024  # a record is ~10 KB (torch 5 KB, numpy 2.5 KB, random 2.5 KB)
_PREFIX = struct.Struct("=8sI32s")  # magic, payload length, MAC
_HEADER = struct.Struct("=QIqB")  # seq, slot, step, point
_U32 = struct.Struct("=I")
_I32 = struct.Struct("=i")
_NUMPY_TAIL = struct.Struct("=iid")  # pos, has_gauss, cached_gaussian
_PYTHON_TAIL = struct.Struct("=Bd")  # has gauss_next, gauss_next
_MT_WORDS = 624
_PYTHON_WORDS = struct.Struct(f"={_MT_WORDS + 1}I")  # random's state: 624 words and a position


class Point(enum.IntEnum):
    """Where in a step its boundary snapshot was taken (see :mod:`torchrelay.transparent.hook`).

    SETUP: before the first step (the hook started, a DDP module or optimizer was built).
    COMMIT: at the previous step's ``optimizer.step()``.
    FETCH: before the step's first index left a ``DistributedSampler``.
    FORWARD: at the step's first DDP forward (no snapshot was taken since its commit).
    """

    SETUP = 1
    COMMIT = 2
    FETCH = 3
    FORWARD = 4


class MirrorError(RuntimeError):
    """No usable record: missing file, torn or forged records, or none of the wanted step."""


@dataclass(frozen=True)
class Record:
    """One slot's RNG streams at one boundary, in the forms torch, numpy and ``random`` take.

    ``numpy_rng`` is ``np.random.get_state()``'s tuple, ``python_rng`` ``random.getstate()``'s.
    """

    seq: int
    slot: int
    step: int
    point: Point
    torch_rng: torch.Tensor
    cuda_rng: list[torch.Tensor] | None
    numpy_rng: tuple[Any, ...]
    python_rng: tuple[Any, ...]

    def apply(self) -> None:
        """Make these the process's global streams."""
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        np.random.set_state(self.numpy_rng)
        random.setstate(self.python_rng)


class Sealer:
    """MACs records with the job token (the HMAC's key schedule done once, copied per call)."""

    def __init__(self, token: str) -> None:
        self._base = hmac.new(token.encode(), DOMAIN, hashlib.sha256)

    def mac(self, payload: bytes) -> bytes:
        h = self._base.copy()
        h.update(payload)
        return h.digest()


# ------------------------------------------------------------------ pure: records <-> bytes
def encode(record: Record, sealer: Sealer) -> bytes:
    """The sealed bytes of ``record`` (at most :data:`SLOT_BYTES`)."""
    name, key, pos, has_gauss, cached = record.numpy_rng
    version, words, gauss_next = record.python_rng
    if name != "MT19937" or len(key) != _MT_WORDS or len(words) != _MT_WORDS + 1:
        raise ValueError("not an MT19937 state (numpy's legacy global RNG, Python's random)")
    cuda = record.cuda_rng
    parts = [
        _HEADER.pack(record.seq, record.slot, record.step, record.point),
        *_blob(record.torch_rng.numpy().tobytes()),
        _I32.pack(-1 if cuda is None else len(cuda)),
        *(part for state in cuda or () for part in _blob(state.numpy().tobytes())),
        np.asarray(key, dtype=np.uint32).tobytes(),
        _NUMPY_TAIL.pack(pos, has_gauss, cached),
        _I32.pack(version),
        _PYTHON_WORDS.pack(*words),
        _PYTHON_TAIL.pack(gauss_next is not None, gauss_next or 0.0),
    ]
    payload = b"".join(parts)
    sealed = _PREFIX.pack(MAGIC, len(payload), sealer.mac(payload)) + payload
    if len(sealed) > SLOT_BYTES:
        raise ValueError(f"an RNG record of {len(sealed)} bytes does not fit {SLOT_BYTES}")
    return sealed


def _blob(data: bytes) -> tuple[bytes, bytes]:
    return _U32.pack(len(data)), data


def decode(data: bytes, sealer: Sealer) -> Record:
    """The record in ``data`` (one slot's bytes); :class:`MirrorError` if it is empty, torn,
    forged or malformed. The MAC is checked before any field is parsed."""
    if len(data) < _PREFIX.size or not data.startswith(MAGIC):
        raise MirrorError("empty")
    _, length, mac = _PREFIX.unpack_from(data)
    payload = data[_PREFIX.size : _PREFIX.size + length]
    if len(payload) != length or not hmac.compare_digest(mac, sealer.mac(payload)):
        raise MirrorError("torn or forged (MAC mismatch)")
    try:
        return _parse(memoryview(payload))
    except (struct.error, ValueError) as exc:  # only a token holder's bug gets here
        raise MirrorError(f"malformed ({exc})") from None


def _parse(payload: memoryview) -> Record:
    reader = _Reader(payload)
    seq, slot, step, point = reader.take(_HEADER)
    torch_rng = reader.tensor()
    (count,) = reader.take(_I32)
    cuda = None if count < 0 else [reader.tensor() for _ in range(count)]
    key = np.frombuffer(reader.bytes(4 * _MT_WORDS), dtype=np.uint32).copy()
    pos, has_gauss, cached = reader.take(_NUMPY_TAIL)
    (version,) = reader.take(_I32)
    words = reader.take(_PYTHON_WORDS)
    has_next, gauss_next = reader.take(_PYTHON_TAIL)
    if reader.offset != len(payload):
        raise ValueError("trailing bytes")
    return Record(
        seq=seq,
        slot=slot,
        step=step,
        point=Point(point),
        torch_rng=torch_rng,
        cuda_rng=cuda,
        numpy_rng=("MT19937", key, pos, has_gauss, cached),
        python_rng=(version, words, gauss_next if has_next else None),
    )


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self.data, self.offset = data, 0

    def bytes(self, size: int) -> bytes:
        if size < 0 or self.offset + size > len(self.data):
            raise ValueError("truncated record")
        self.offset += size
        return bytes(self.data[self.offset - size : self.offset])

    def take(self, layout: struct.Struct) -> tuple[Any, ...]:
        return layout.unpack(self.bytes(layout.size))

    def tensor(self) -> torch.Tensor:
        (size,) = self.take(_U32)
        return torch.frombuffer(bytearray(self.bytes(size)), dtype=torch.uint8)


# ------------------------------------------------------------------ pure: which record
def choose(slots: list[bytes], sealer: Sealer, slot: int, step: int, point: Point) -> Record:
    """The record of ``slot`` taken at ``(step, point)`` among the file's ``slots``; the newest
    if both are (the same place snapshotted twice). :class:`MirrorError` says what was found
    instead (one line)."""
    found: list[str] = []
    matches: list[Record] = []
    for data in slots:
        try:
            record = decode(data, sealer)
        except MirrorError as exc:
            found += [str(exc)] * (str(exc) != "empty")
            continue
        if record.slot != slot:
            found.append(f"a record of slot {record.slot}")
        elif (record.step, record.point) != (step, point):
            found.append(f"step {record.step} at {record.point.name.lower()}")
        else:
            matches.append(record)
    if not matches:
        wanted = f"step {step} at {point.name.lower()}"
        raise MirrorError(f"no record of {wanted} (found: {', '.join(found) or 'nothing'})")
    return max(matches, key=lambda r: r.seq)


def next_seq(slots: list[bytes], sealer: Sealer) -> int:
    """The ``seq`` of the next record written over ``slots``: one past the newest valid one,
    so that it goes to the other slot and the newest survives a torn write."""
    seqs = [-1]
    for data in slots:
        with contextlib.suppress(MirrorError):  # torn or empty: overwritten first
            seqs.append(decode(data, sealer).seq)
    return max(seqs) + 1


# ------------------------------------------------------------------ the file
def mirror_path(run_dir: Path, slot: int) -> Path:
    return run_dir / "rng" / f"slot-{slot}"


class Mirror:
    """A slot's mirror file, open for the worker that holds the slot (see the module doc).

    :meth:`open` and :meth:`write` raise :class:`OSError` (the caller warns and goes on without
    a mirror: a mirror is never worth failing the training for)."""

    def __init__(self, fd: int, slot: int, sealer: Sealer) -> None:
        self.fd, self.slot, self.sealer = fd, slot, sealer
        self.seq = next_seq(self.slots(), sealer)

    @classmethod
    def open(cls, run_dir: Path, slot: int, token: str) -> Mirror:
        """Open (create: 0700 directory, 0600 file of two slots) ``slot``'s mirror file. Its
        size never changes afterwards: CRIU refuses to restore a file whose size did."""
        path = mirror_path(run_dir, slot)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path.parent, 0o700)
        flags = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        directory = os.open(path.parent, os.O_RDONLY | flags)
        try:
            fd = os.open(
                path.name,
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=directory,
            )
        finally:
            os.close(directory)
        try:
            if os.fstat(fd).st_size != 2 * SLOT_BYTES:
                os.ftruncate(fd, 2 * SLOT_BYTES)
            return cls(fd, slot, Sealer(token))
        except BaseException:
            os.close(fd)
            raise

    def slots(self) -> list[bytes]:
        return [os.pread(self.fd, SLOT_BYTES, i * SLOT_BYTES) for i in range(2)]

    def write(self, streams: Boundary, step: int, point: Point) -> None:
        """Record the RNG streams of the boundary snapshot ``streams`` as ``(step, point)``."""
        record = Record(
            seq=self.seq,
            slot=self.slot,
            step=step,
            point=point,
            torch_rng=streams.torch_rng,
            cuda_rng=streams.cuda_rng,
            numpy_rng=streams.numpy_rng,
            python_rng=streams.python_rng,
        )
        os.pwrite(self.fd, encode(record, self.sealer), (self.seq % 2) * SLOT_BYTES)
        self.seq += 1

    def find(self, step: int, point: Point) -> Record:
        """This slot's record of ``(step, point)`` (see :func:`choose`)."""
        return choose(self.slots(), self.sealer, self.slot, step, point)

    def close(self) -> None:
        os.close(self.fd)
