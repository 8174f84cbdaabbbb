"""The per-slot RNG mirror (transparent/rng_mirror.py, slot_rng.py), in one process: the sealed
record format, the choice of a record, the file, and a clone adopting a dead slot's streams."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from torchrelay.transparent.boundary import Boundary
from torchrelay.transparent.rng_mirror import (
    SLOT_BYTES,
    Mirror,
    MirrorError,
    Point,
    Record,
    Sealer,
    choose,
    decode,
    encode,
    mirror_path,
)
from torchrelay.transparent.slot_rng import WARNING_KIND, SlotStreams

TOKEN = "rng-mirror-test-token"
SEALER = Sealer(TOKEN)


def seed(value: int) -> None:
    torch.manual_seed(value)
    np.random.seed(value)
    random.seed(value)
    # Leave a cached Gaussian in numpy's and random's states: they must travel too.
    np.random.standard_normal()
    random.gauss(0.0, 1.0)


def draws() -> tuple[list[float], list[float], list[float]]:
    """What a step draws from each stream (dropout masks, numpy and random augmentations)."""
    return (
        torch.rand(4).tolist(),
        np.random.standard_normal(3).tolist(),
        [random.gauss(0.0, 1.0), random.random()],
    )


def record(seq: int, step: int, point: Point = Point.FETCH, slot: int = 1) -> Record:
    b = Boundary.take([])
    return Record(seq, slot, step, point, b.torch_rng, b.cuda_rng, b.numpy_rng, b.python_rng)


def test_a_record_round_trips_every_stream() -> None:
    seed(7)
    sealed = encode(record(3, 17), SEALER)
    assert len(sealed) < SLOT_BYTES
    expected = draws()
    seed(8)  # other streams meanwhile
    got = decode(sealed, SEALER)
    assert (got.seq, got.slot, got.step, got.point) == (3, 1, 17, Point.FETCH)
    got.apply()
    assert draws() == expected


def test_cuda_states_round_trip_as_bytes() -> None:
    states = [torch.arange(16, dtype=torch.uint8), torch.full((16,), 9, dtype=torch.uint8)]
    made = record(0, 2)
    made = Record(**{**made.__dict__, "cuda_rng": states})
    got = decode(encode(made, SEALER), SEALER)
    assert got.cuda_rng is not None
    assert [s.tolist() for s in got.cuda_rng] == [s.tolist() for s in states]
    assert decode(encode(record(0, 2), SEALER), SEALER).cuda_rng is None


def test_a_forged_or_tampered_record_is_refused() -> None:
    sealed = encode(record(0, 5), SEALER)
    with pytest.raises(MirrorError, match="MAC"):
        decode(sealed, Sealer("another-jobs-token"))
    tampered = bytearray(sealed)
    tampered[-100] ^= 1  # one bit of random's state
    with pytest.raises(MirrorError, match="MAC"):
        decode(bytes(tampered), SEALER)
    with pytest.raises(MirrorError, match="empty"):
        decode(bytes(SLOT_BYTES), SEALER)


def test_the_record_of_the_wanted_place_is_chosen_and_a_stale_one_is_not() -> None:
    slots = [encode(record(4, 16), SEALER), encode(record(5, 17), SEALER)]
    assert choose(slots, SEALER, 1, 16, Point.FETCH).seq == 4
    assert choose(slots, SEALER, 1, 17, Point.FETCH).seq == 5
    with pytest.raises(MirrorError, match="no record of step 18 at fetch") as stale:
        choose(slots, SEALER, 1, 18, Point.FETCH)
    assert "step 16 at fetch, step 17 at fetch" in str(stale.value)
    # The same step snapshotted at another place of the script is not that place.
    with pytest.raises(MirrorError, match="no record of step 17 at commit"):
        choose(slots, SEALER, 1, 17, Point.COMMIT)
    # Another slot's file (copied, or a mix-up) is refused: its records name their slot.
    with pytest.raises(MirrorError, match="a record of slot 1"):
        choose(slots, SEALER, 2, 17, Point.FETCH)
    # The same place twice (the step's snapshot taken again): the newest wins.
    twice = [encode(record(9, 17), SEALER), encode(record(8, 17), SEALER)]
    assert choose(twice, SEALER, 1, 17, Point.FETCH).seq == 9


def test_a_torn_slot_falls_back_to_the_other(tmp_path: Path) -> None:
    mirror = Mirror.open(tmp_path, 1, TOKEN)
    seed(1)
    mirror.write(Boundary.take([]), 16, Point.FETCH)
    expected = draws()
    seed(2)
    mirror.write(Boundary.take([]), 17, Point.FETCH)
    # The worker dies in the middle of its next write: half of slot 0's record is new bytes.
    torn = encode(record(2, 18), SEALER)
    os.pwrite(mirror.fd, torn[: len(torn) // 2], 0)
    with pytest.raises(MirrorError, match="torn or forged"):
        mirror.find(18, Point.FETCH)
    assert mirror.find(17, Point.FETCH).seq == 1
    with pytest.raises(MirrorError, match="no record of step 16"):
        mirror.find(16, Point.FETCH)  # overwritten, as a record two writes old is
    mirror.close()
    # Reopened (a clone taking the slot): the next write goes over the torn record.
    again = Mirror.open(tmp_path, 1, TOKEN)
    assert again.seq == 2
    seed(1)
    again.write(Boundary.take([]), 18, Point.FETCH)
    seed(3)
    again.find(18, Point.FETCH).apply()
    assert draws() == expected
    assert again.find(17, Point.FETCH).seq == 1
    again.close()


def test_the_file_is_private_fixed_in_size_and_never_a_link(tmp_path: Path) -> None:
    mirror = Mirror.open(tmp_path, 0, TOKEN)
    mirror.write(Boundary.take([]), 0, Point.SETUP)
    mirror.close()
    path = mirror_path(tmp_path, 0)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_size == 2 * SLOT_BYTES  # CRIU restores a file only at its size
    mirror_path(tmp_path, 1).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        Mirror.open(tmp_path, 1, TOKEN)
    assert not (tmp_path / "elsewhere").exists()


def fake_relay(run_dir: Path, rank: int | None, warnings: list[tuple[str, str]]) -> SimpleNamespace:
    """What :class:`SlotStreams` uses of a relay: its slot, run dir, token and warnings."""
    env = SimpleNamespace(run_dir=run_dir, token=TOKEN)
    warn = lambda line, what: warnings.append((what, line))  # noqa: E731
    return SimpleNamespace(rank=rank, env=env, _warn=warn)


def test_a_clone_adopts_the_dead_slots_streams_where_it_resumes(tmp_path: Path, capsys) -> None:
    warnings: list[tuple[str, str]] = []
    donor = SlotStreams(fake_relay(tmp_path, 0, warnings))  # type: ignore[arg-type]
    dead = SlotStreams(fake_relay(tmp_path, 1, warnings))  # type: ignore[arg-type]
    for step in (16, 17):
        seed(100 + step)  # rank 1's own streams
        dead.record(Boundary.take([]), step, Point.FETCH)
        seed(step)  # rank 0's
        donor.record(Boundary.take([]), step, Point.FETCH)
    seed(117)
    expected = draws()
    # The copy of the donor takes slot 1 and resumes at the voided step 17's fetch.
    seed(17)
    donor.take(1)
    assert donor.mirror is None  # the donor's file is the donor's from now on
    donor.adopt_due(17, Point.FETCH)
    assert draws() == expected
    assert "slot 1 goes on with its own random streams" in capsys.readouterr().err
    assert warnings == []
    assert donor.mirror is not None and donor.mirror.slot == 1 and donor.mirror.seq == 2
    donor.adopt_due(17, Point.FETCH)  # once adopted, nothing more is due
    assert warnings == []


def test_no_record_keeps_the_donors_streams_and_says_so(tmp_path: Path) -> None:
    warnings: list[tuple[str, str]] = []
    clone = SlotStreams(fake_relay(tmp_path, 0, warnings))  # type: ignore[arg-type]
    clone.take(3)  # the dead rank of slot 3 ran on another node: no file here
    seed(5)
    expected = draws()
    seed(5)
    clone.adopt_due(17, Point.FETCH)
    assert draws() == expected
    [(what, line)] = warnings
    assert what == WARNING_KIND
    assert "slot 3's random streams are not mirrored here (no record of step 17" in line
    assert "found: nothing" in line


def test_a_mirror_that_cannot_be_opened_is_said_once(tmp_path: Path) -> None:
    warnings: list[tuple[str, str]] = []
    (tmp_path / "rng").write_text("not a directory")
    streams = SlotStreams(fake_relay(tmp_path, 0, warnings))  # type: ignore[arg-type]
    streams.record(Boundary.take([]), 0, Point.SETUP)  # no mirror: nothing written, no error
    assert streams.mirror is None
    streams.take(1)
    streams.adopt_due(1, Point.FETCH)
    assert [what for what, _ in warnings] == [WARNING_KIND, WARNING_KIND]
    assert "cannot be mirrored" in warnings[0][1]
    assert "mirror file cannot be opened" in warnings[1][1]


def test_a_write_that_fails_is_said_once_and_the_training_goes_on(tmp_path: Path) -> None:
    warnings: list[tuple[str, str]] = []
    streams = SlotStreams(fake_relay(tmp_path, 0, warnings))  # type: ignore[arg-type]
    assert streams.mirror is not None
    os.close(streams.mirror.fd)  # the file is gone from under it (EBADF on the next write)
    streams.record(Boundary.take([]), 0, Point.SETUP)
    streams.record(Boundary.take([]), 1, Point.FETCH)
    assert streams.mirror is None
    [(what, line)] = warnings
    assert what == WARNING_KIND and "slot 0's random streams cannot be mirrored" in line
