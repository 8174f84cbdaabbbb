"""A handover's boundary as one rank sees it (runtime.handover_boundary): the watch thread is
told, the training thread looks after each commit; a rank told after its look at the boundary
knows it is late."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from torchrelay.control.protocol import Handover, Message, Report, ToldLate
from torchrelay.runtime.control_link import ControlLink
from torchrelay.runtime.handover_boundary import HandoverBoundary
from torchrelay.runtime.posting import Poster


def test_a_rank_told_in_time_halts_right_after_committing_the_boundary() -> None:
    boundary = HandoverBoundary()
    assert not boundary.due(0, 20)
    assert said(boundary, 0, 27) == []  # it looked at 20: in time
    assert [boundary.due(0, step) for step in range(21, 28)] == [False] * 6 + [True]
    assert not boundary.due(0, 28)  # once: the next generation goes on


def test_a_rank_told_after_looking_past_the_boundary_is_late_and_halts_at_its_next_commit():
    boundary = HandoverBoundary()
    assert not boundary.due(0, 27)  # committed 27 and looked: nothing told yet
    assert said(boundary, 0, 27) == [27]  # inside step 28 now
    assert boundary.due(0, 28)  # told late, all ranks: they halt after 28


def test_a_boundary_of_another_generation_is_neither_late_nor_due() -> None:
    boundary = HandoverBoundary()
    assert not boundary.due(1, 30)
    assert said(boundary, 0, 27) == []  # an old generation's boundary, told after a recovery
    assert not boundary.due(1, 31)


def said(boundary: HandoverBoundary, generation: int, step: int) -> list[int]:
    """What the rank says (``told_late``) when told ``step`` of ``generation``."""
    late: list[int] = []
    boundary.tell(generation, step, late.append)
    return late


def race() -> tuple[bool, list[int]]:
    """The training thread's look at 27 and the watch thread's tell of 27, started at once."""
    boundary, results = HandoverBoundary(), {}
    start = threading.Barrier(2)

    def train() -> None:
        start.wait()
        results["due"] = boundary.due(0, 27)

    def watch() -> None:
        start.wait()
        results["late"] = said(boundary, 0, 27)

    threads = [threading.Thread(target=train), threading.Thread(target=watch)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results["due"], results["late"]


def test_whatever_the_interleaving_a_rank_is_either_due_or_late() -> None:
    """The boundary is never missed: the rank halts at it, or is told it is late."""
    for _ in range(200):
        due, late = race()
        assert due != (late == [27])


class Stream:
    """A controller's watch stream that delivers ``messages`` and ends; records reports."""

    def __init__(self, *messages: Message) -> None:
        self.messages = messages
        self.sent: list[Report] = []

    def watch(self) -> Iterator[Message]:
        yield from self.messages

    def send(self, report: Report) -> dict:
        self.sent.append(report)
        return {}


class Link(ControlLink):
    """A worker's control link in generation 0 whose training thread last looked at
    ``looked_at``, around ``stream``."""

    def __init__(self, stream: Stream, looked_at: int) -> None:
        self.generation = 0
        self._client = stream  # type: ignore[assignment]
        self._poster = Poster(stream.send, lambda report, exc: None)
        self._inbox = queue.Queue()
        self._handover = HandoverBoundary()
        self._handover.due(0, looked_at)


def test_the_watch_thread_of_a_rank_told_late_says_so_and_keeps_the_boundary() -> None:
    stream = Stream(Handover(generation=0, step=27))
    link = Link(stream, looked_at=27)
    link._watch()
    link._poster.flush()
    assert stream.sent == [ToldLate(generation=0, step=27)]
    assert link._handover.due(0, 28) and link._inbox.empty()


def test_the_watch_thread_of_a_rank_told_in_time_says_nothing() -> None:
    stream = Stream(Handover(generation=0, step=27))
    link = Link(stream, looked_at=20)
    link._watch()
    link._poster.flush()
    assert stream.sent == [] and link._handover.due(0, 27)
