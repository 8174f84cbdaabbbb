"""Posted reports: sent off the caller's thread, in order, before any later synchronous one."""

from __future__ import annotations

import threading

from torchrelay.control.client import ControlError
from torchrelay.control.protocol import PhaseDone, Progress, Report
from torchrelay.runtime.control_link import ControlLink
from torchrelay.runtime.posting import Poster


class GatedSender:
    """Records what it sends; holds every send until ``gate`` is set."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.sent: list[Report] = []
        self.threads: set[str] = set()

    def send(self, report: Report) -> dict:
        self.gate.wait()
        self.threads.add(threading.current_thread().name)
        self.sent.append(report)
        return {}


def test_posted_reports_go_out_in_order_off_the_callers_thread_and_flush_waits_for_them():
    sender = GatedSender()
    poster = Poster(sender.send, lambda report, exc: None)
    reports = [Progress(step=s) for s in range(5)]
    for report in reports:
        poster.post(report)  # returns although every send is held
    assert sender.sent == []
    flushed = threading.Event()
    waiter = threading.Thread(target=lambda: (poster.flush(), flushed.set()))
    waiter.start()
    assert not flushed.wait(0.05)  # still held: flush must not return
    sender.gate.set()
    waiter.join()
    assert flushed.is_set()
    assert sender.sent == reports
    assert sender.threads == {"torchrelay-poster"}


def test_a_failed_report_goes_to_on_error_and_the_next_is_still_sent():
    failures: list[tuple[Report, Exception]] = []
    sent: list[Report] = []

    def send(report: Report) -> dict:
        if report.step == 1:  # type: ignore[attr-defined]
            raise ControlError("INVALID_ARGUMENT", "refused")
        sent.append(report)
        return {}

    poster = Poster(send, lambda report, exc: failures.append((report, exc)))
    for step in range(3):
        poster.post(Progress(step=step))
    poster.flush()
    assert [r.step for r in sent] == [0, 2]  # type: ignore[attr-defined]
    assert [(r.step, e.code) for r, e in failures] == [(1, "INVALID_ARGUMENT")]  # type: ignore[attr-defined]


def test_flush_from_the_posters_own_thread_returns_at_once():
    # A new leader's callback runs inside the send in flight and sends again: it must not
    # wait for the send it runs in.
    poster: Poster
    inner_done = threading.Event()

    def send(report: Report) -> dict:
        poster.flush()
        inner_done.set()
        return {}

    poster = Poster(send, lambda report, exc: None)
    poster.post(Progress(step=0))
    poster.flush()
    assert inner_done.is_set()


class Link(ControlLink):
    """The worker's control link around a recording client."""

    def __init__(self, client: GatedSender) -> None:
        self.generation = 4
        self._last_commit_t = None
        self._client = client  # type: ignore[assignment]
        self._poster = Poster(client.send, lambda report, exc: None)


def test_a_synchronous_report_waits_for_those_posted_before_it():
    client = GatedSender()
    link = Link(client)
    done = PhaseDone(phase="transfer_done", t=1.0, bytes=0, seconds=0.0)
    link._post(done)
    link.generation = 5  # posted reports keep the generation they were posted from
    sent = threading.Thread(target=lambda: link._send(Progress(step=9)))
    sent.start()
    client.gate.set()
    sent.join()
    assert [type(r) for r in client.sent] == [PhaseDone, Progress]
    assert [r.generation for r in client.sent] == [4, 5]
