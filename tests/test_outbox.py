"""The outbox between controller threads and the server's event loop."""

from __future__ import annotations

import asyncio
import queue
import threading

import pytest

from torchrelay.control.outbox import Outbox


def test_put_from_another_thread_wakes_an_awaiting_stream():
    outbox = Outbox()

    async def consume() -> list:
        got = []
        while len(got) < 3:
            message = await outbox.next(timeout=30)
            assert message is not None, "the stream was never woken"
            got.append(message)
        return got

    async def main() -> list:
        consumer = asyncio.ensure_future(consume())
        await asyncio.sleep(0)  # the consumer is awaiting now
        producer = threading.Thread(target=lambda: [outbox.put({"n": i}) for i in range(3)])
        producer.start()
        got = await consumer
        producer.join()
        return got

    assert asyncio.run(main()) == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert outbox.empty()


def test_next_times_out_with_none_and_cancellation_loses_nothing():
    outbox = Outbox()

    async def main() -> None:
        assert await outbox.next(timeout=0.01) is None
        waiting = asyncio.ensure_future(outbox.next(timeout=30))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        outbox.put({"type": "finish"})
        assert await outbox.next(timeout=30) == {"type": "finish"}

    asyncio.run(main())


def test_synchronous_get_behaves_like_a_queue():
    outbox = Outbox()
    with pytest.raises(queue.Empty):
        outbox.get_nowait()
    threading.Timer(0.05, outbox.put, args=({"type": "plan"},)).start()
    assert outbox.get(timeout=30) == {"type": "plan"}
    with pytest.raises(queue.Empty):
        outbox.get(timeout=0.01)


def test_wait_drained_returns_once_the_stream_has_taken_every_message():
    # The controller stops serving only once a node's stream took its finish (wait_all_gone).
    outbox = Outbox()
    outbox.put({"type": "finish"})
    assert not outbox.wait_drained(timeout=0)
    taken: list = []

    async def stream() -> None:
        taken.append(await outbox.next(timeout=30))

    consumer = threading.Thread(target=lambda: asyncio.run(stream()))
    consumer.start()
    assert outbox.wait_drained(timeout=60)
    consumer.join()
    assert taken == [{"type": "finish"}]
    assert Outbox().wait_drained(timeout=0)  # nothing put: drained at once
