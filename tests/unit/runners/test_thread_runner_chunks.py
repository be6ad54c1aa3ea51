"""The thread runner's chunks (adaptive dispatch): many short calls, one hand-over each way."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import pytest
from confluent_kafka import Message

from parallel_consumer._clock import SystemClock
from parallel_consumer._events import WorkDone, WorkDoneMany
from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.runners.threads import ThreadRunner


def context(offset: int, key: bytes = b"k") -> PollContext:
    message = Message(topic="t", partition=0, offset=offset, key=key, value=b"v")
    return PollContext.of_one(RecordContext(message))


@pytest.fixture
def runners() -> Iterator[list[ThreadRunner]]:
    started: list[ThreadRunner] = []
    yield started
    for runner in started:
        runner.stop(5.0)


def start(
    runners: list[ThreadRunner], handler: object, capacity: int = 2
) -> queue.SimpleQueue[WorkDone | WorkDoneMany]:
    events: queue.SimpleQueue[WorkDone | WorkDoneMany] = queue.SimpleQueue()
    runner = ThreadRunner(capacity, SystemClock(), name="chunks")
    runner.start(handler, events.put)  # type: ignore[arg-type]
    runners.append(runner)
    return events


def test_a_chunk_runs_its_calls_in_order_on_one_worker_and_reports_once(
    runners: list[ThreadRunner],
) -> None:
    seen: list[tuple[int, str]] = []

    def handle(ctx: PollContext) -> int:
        seen.append((ctx.offset, threading.current_thread().name))
        return ctx.offset * 10

    events = start(runners, handle)
    runners[0].submit_chunk([(i + 1, context(i)) for i in range(5)])

    event = events.get(timeout=10)
    assert isinstance(event, WorkDoneMany)
    assert [call[0] for call in event.calls] == [1, 2, 3, 4, 5]
    assert [call[2] for call in event.calls] == [0, 10, 20, 30, 40]  # each call's own value
    assert all(call[1] == (None,) for call in event.calls)
    assert event.service > 0
    assert [offset for offset, _ in seen] == [0, 1, 2, 3, 4]
    assert len({name for _, name in seen}) == 1
    assert events.empty()


def test_a_failing_call_fails_only_itself_and_the_chunk_goes_on(
    runners: list[ThreadRunner],
) -> None:
    def handle(ctx: PollContext) -> None:
        if ctx.offset == 1:
            raise ValueError("bad record")

    events = start(runners, handle)
    runners[0].submit_chunk([(i + 1, context(i)) for i in range(3)])

    event = events.get(timeout=10)
    assert isinstance(event, WorkDoneMany)
    errors = [call[1][0] for call in event.calls]
    assert errors[0] is None
    assert isinstance(errors[1], ValueError)
    assert errors[2] is None


def test_single_calls_report_how_long_they_took(runners: list[ThreadRunner]) -> None:
    events = start(runners, lambda ctx: None)
    runners[0].submit(7, context(0))
    event = events.get(timeout=10)
    assert isinstance(event, WorkDone)
    assert event.batch == 7
    assert event.took > 0


def test_queued_chunks_are_taken_back_whole(runners: list[ThreadRunner]) -> None:
    # Given the only worker busy, and a chunk queued behind it
    busy = threading.Event()
    release = threading.Event()

    def handle(ctx: PollContext) -> None:
        busy.set()
        release.wait(10)

    events = start(runners, handle, capacity=1)
    runner = runners[0]
    runner.submit(1, context(0))
    assert busy.wait(10)
    runner.submit_chunk([(2, context(1)), (3, context(2))])

    # When queued work is taken back (close), then the worker is released
    cancelled = runner.cancel_queued()
    release.set()

    # Then the chunk's calls are all taken back, never run, never reported
    assert cancelled == [2, 3]
    event = events.get(timeout=10)
    assert isinstance(event, WorkDone)
    assert event.batch == 1
    assert runner.stop(5.0)
    assert events.empty()


def test_no_call_of_a_chunk_starts_after_stop(runners: list[ThreadRunner]) -> None:
    # Given a chunk whose first call blocks until the runner is being stopped
    started = threading.Event()
    release = threading.Event()
    calls: list[int] = []

    def handle(ctx: PollContext) -> None:
        calls.append(ctx.offset)
        if ctx.offset == 0:
            started.set()
            release.wait(10)

    events = start(runners, handle, capacity=1)
    runner = runners[0]
    runner.submit_chunk([(1, context(0)), (2, context(1)), (3, context(2))])
    assert started.wait(10)

    # When stop() closes the gate while that call runs, then lets it end
    stopper = threading.Thread(target=runner.stop, args=(10.0,))
    stopper.start()
    while runner._open:  # the gate closes first thing in stop()
        threading.Event().wait(0.001)
    release.set()
    stopper.join(10)

    # Then the running call is reported, and the rest of the chunk never started
    assert calls == [0]
    event = events.get(timeout=10)
    assert isinstance(event, WorkDoneMany)
    assert [call[0] for call in event.calls] == [1]
    assert events.empty()


# -- chains: consecutive records of one lane, each only after the one before succeeded --------


def test_a_chain_runs_its_calls_in_order_on_one_worker_and_reports_once(
    runners: list[ThreadRunner],
) -> None:
    seen: list[tuple[int, str]] = []

    def handle(ctx: PollContext) -> None:
        seen.append((ctx.offset, threading.current_thread().name))

    events = start(runners, handle)
    runners[0].submit_chain([(i + 1, context(i)) for i in range(4)])
    event = events.get(timeout=10)
    assert isinstance(event, WorkDoneMany)
    assert [call[0] for call in event.calls] == [1, 2, 3, 4]
    assert not event.unstarted
    assert [offset for offset, _ in seen] == [0, 1, 2, 3]
    assert len({name for _, name in seen}) == 1


@pytest.mark.parametrize("how", ["raises", "ctx.fail"])
def test_a_chain_stops_at_a_failed_call_and_gives_the_rest_back_unstarted(
    runners: list[ThreadRunner], how: str
) -> None:
    # Given a chain whose third call fails
    seen: list[int] = []

    def handle(ctx: PollContext) -> None:
        seen.append(ctx.offset)
        if ctx.offset == 2:
            if how == "raises":
                raise RuntimeError("boom")
            ctx.fail(ctx.records[0], RuntimeError("boom"))

    events = start(runners, handle)
    runners[0].submit_chain([(i + 1, context(i)) for i in range(5)])
    # Then the calls after it never start, and come back as unstarted
    event = events.get(timeout=10)
    assert isinstance(event, WorkDoneMany)
    assert [call[0] for call in event.calls] == [1, 2, 3]
    assert event.calls[2][1][0] is not None
    assert list(event.unstarted) == [4, 5]
    assert seen == [0, 1, 2]


def test_a_cancelled_call_ends_a_chain_and_the_rest_comes_back(
    runners: list[ThreadRunner],
) -> None:
    gate = threading.Event()
    seen: list[int] = []

    def handle(ctx: PollContext) -> None:
        gate.wait(10)
        seen.append(ctx.offset)

    events = start(runners, handle, capacity=1)
    runners[0].submit_chain([(i + 1, context(i)) for i in range(4)])
    runners[0].cancel(2)  # (the engine gave up on it before it started)
    gate.set()
    event = events.get(timeout=10)
    assert isinstance(event, WorkDoneMany)
    assert [call[0] for call in event.calls] == [1, 2]
    assert list(event.unstarted) == [3, 4]
    assert seen == [0]


def test_release_stuck_reports_a_chains_finished_calls_but_never_moves_the_rest(
    runners: list[ThreadRunner],
) -> None:
    # Given a chain whose second call hangs, and an idle worker beside it
    release = threading.Event()
    seen: list[tuple[int, str]] = []

    def handle(ctx: PollContext) -> None:
        seen.append((ctx.offset, threading.current_thread().name))
        if ctx.offset == 1:
            release.wait(10)

    events = start(runners, handle, capacity=2)
    runner = runners[0]
    runner.submit_chain([(i + 1, context(i)) for i in range(4)])
    while len(seen) < 2:
        threading.Event().wait(0.001)
    # When the controller's stuck check finds the chain (any age counts as stuck here)
    moved = runner.release_stuck(0.0, events.put)
    # Then the finished call is reported, and nothing went to the idle worker's queue
    assert moved == 0
    assert runner._tasks.qsize() == 0
    early = events.get(timeout=10)
    assert isinstance(early, WorkDoneMany)
    assert [call[0] for call in early.calls] == [1]
    assert [offset for offset, _ in seen] == [0, 1]
    # And once the call returns, the rest runs after it on the same worker, in order
    release.set()
    rest = events.get(timeout=10)
    assert isinstance(rest, WorkDoneMany)
    assert [call[0] for call in rest.calls] == [2, 3, 4]
    assert [offset for offset, _ in seen] == [0, 1, 2, 3]
    assert len({name for _, name in seen}) == 1


def test_release_stuck_hands_its_report_to_the_caller_not_to_done(
    runners: list[ThreadRunner],
) -> None:
    # Given a chunk whose second call hangs
    release = threading.Event()
    seen: list[int] = []

    def handle(ctx: PollContext) -> None:
        seen.append(ctx.offset)
        if ctx.offset == 1:
            release.wait(10)

    events = start(runners, handle, capacity=1)
    runner = runners[0]
    runner.submit_chunk([(i + 1, context(i)) for i in range(3)])
    while len(seen) < 2:
        threading.Event().wait(0.001)
    # When the controller's stuck check passes its own report callback
    reported: list[WorkDoneMany] = []
    moved = runner.release_stuck(0.0, reported.append)
    # Then the finished call comes back to it at once, not as a posted event
    assert moved == 1
    assert [[call[0] for call in event.calls] for event in reported] == [[1]]
    assert events.empty()
    release.set()


def test_queued_chain_calls_are_taken_back_on_close(runners: list[ThreadRunner]) -> None:
    gate = threading.Event()
    running = threading.Event()

    def handle(ctx: PollContext) -> None:
        running.set()
        gate.wait(10)

    start(runners, handle, capacity=1)
    runner = runners[0]
    runner.submit_chain([(1, context(0)), (2, context(1)), (3, context(2))])
    assert running.wait(10)  # (the first call is running)
    assert sorted(runner.cancel_queued()) == [2, 3]
    gate.set()
