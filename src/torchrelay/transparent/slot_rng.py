"""A transparent worker's side of the RNG mirror: record every boundary, adopt a taken slot's.

:class:`SlotStreams` is what :class:`~torchrelay.transparent.hook.TransparentWorker` calls:

- :meth:`SlotStreams.record` after each boundary snapshot: the snapshot's RNG streams go to the
  worker's slot's mirror file (:mod:`rng_mirror`) as ``(step, point)``.
- :meth:`SlotStreams.take` when the worker (a clone, see :mod:`torchrelay.transparent.cloner`)
  is given a slot: it stops writing the donor's file (the donor writes it) and writes nothing
  to the new slot's file yet, which still holds the dead rank's records.
- :meth:`SlotStreams.adopt_due` before the clone's next snapshot, at ``(step, point)``: the
  dead rank's record of that very place becomes the process's streams, and the mirror file is
  the clone's from then on.

Which place that is. A clone is restored where its donor parked: waiting for the plan inside a
recovery. Usually the donor voided the step in flight (:mod:`boundary`): its streams went back
to that step's snapshot, and the worker's first act after the recovery is to snapshot again at
the voided snapshot's ``(step, point)`` -- so the clone adopts exactly the record the dead rank
wrote at the start of the step everyone redoes. A donor that recovered right after a commit
(the step's poison came during ``optimizer.step()``) snapshots next at the next step's commit
point or first fetch, and the clone adopts the dead rank's record of that place, if the dead
rank got there; its draws in between (an LR scheduler's step, a new epoch's ``DataLoader``
iterator) were its donor's.

Never fatal: a file that cannot be opened or written, or no record of the wanted place (the
dead rank died before it got there, its node is another one), is said once per occasion, on
the worker's stderr and in the ledger (a ``warning`` event, ``what="rng_not_mirrored"``), and
the training goes on -- a clone then keeps its donor's streams.

The mirror records what :class:`~torchrelay.transparent.boundary.Boundary` covers: the global
torch CPU and CUDA generators, numpy's global ``RandomState`` and ``random``'s. The streams of
``torch.Generator`` objects the script made itself are not (nor are they rewound by a voided
step). The relay seeds the global streams when it starts; the hook puts the script's back
(``hook._rng_kept``) before this worker exists, so the first record is already the script's.
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

from torchrelay.transparent.boundary import Boundary
from torchrelay.transparent.rng_mirror import Mirror, MirrorError, Point

if TYPE_CHECKING:
    from torchrelay.runtime.relay import Relay

WARNING_KIND = "rng_not_mirrored"


class SlotStreams:
    """One worker's mirror of its slot's RNG streams (see the module doc)."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self._warned = False  # a mirror that cannot be written is said once per process
        self.mirror = None if relay.rank is None else self._open(relay.rank)
        self.adopting: int | None = None  # a slot just taken, whose streams are due

    def record(self, boundary: Boundary, step: int, point: Point) -> None:
        """Mirror ``boundary``'s streams as this slot's ``(step, point)``."""
        if self.mirror is None:
            return
        try:
            self.mirror.write(boundary, step, point)
        except (OSError, ValueError) as exc:  # a full disk; a state that is not MT19937
            slot = self.mirror.slot
            self._close()
            self._lost(slot, exc)

    def take(self, slot: int) -> None:
        """This process holds ``slot`` from now on; :meth:`adopt_due` adopts its streams."""
        self._close()
        self.adopting = slot

    def adopt_due(self, step: int, point: Point) -> None:
        """If a slot was just taken: set the process's streams from its record of ``(step,
        point)`` (or keep them and warn), and mirror to its file from now on."""
        slot = self.adopting
        if slot is None:
            return
        self.adopting = None
        self.mirror = self._open(slot)
        try:
            if self.mirror is None:
                raise MirrorError("its mirror file cannot be opened")
            self.mirror.find(step, point).apply()
        except (MirrorError, OSError) as exc:
            self.relay._warn(
                f"torchrelay: slot {slot}'s random streams are not mirrored here ({exc}); its "
                "copy goes on with its donor's (its random draws differ from a failure-free "
                "run's)",
                what=WARNING_KIND,
            )
            return
        print(
            f"torchrelay: slot {slot} goes on with its own random streams (mirrored at step "
            f"{step}, {point.name.lower()})",
            file=sys.stderr,
            flush=True,
        )

    def _open(self, slot: int) -> Mirror | None:
        try:
            return Mirror.open(self.relay.env.run_dir, slot, self.relay.env.token)
        except OSError as exc:
            self._lost(slot, exc)
            return None

    def _close(self) -> None:
        if self.mirror is not None:
            with contextlib.suppress(OSError):
                self.mirror.close()
            self.mirror = None

    def _lost(self, slot: int, exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            self.relay._warn(
                f"torchrelay: slot {slot}'s random streams cannot be mirrored "
                f"({getattr(exc, 'strerror', None) or exc}); a copy that replaces it would "
                "keep its donor's",
                what=WARNING_KIND,
            )
