"""The process runner's part in deadlines, on its own: ``cancel`` of a call inside a worker
process terminates and replaces that worker, and ``ctx.extend_deadline`` in a worker reaches
the parent's context over the pipe. Handlers are module-level (spawned workers import them)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Message

from parallel_consumer import DeadlineExceeded, PollContext
from parallel_consumer._clock import SystemClock
from parallel_consumer._events import WorkDone
from parallel_consumer.context import RecordContext
from parallel_consumer.hooks import NoHooks
from parallel_consumer.runners import ProcessRunner, WorkerCrashed


def hang_or_keep_alive(ctx: PollContext) -> int:
    """``hang`` sleeps for ten minutes; ``alive`` asks twice for more time, then returns."""
    if ctx.value == b"hang":
        time.sleep(600)
    if ctx.value == b"alive":
        ctx.extend_deadline(7)
        ctx.extend_deadline(11)
    return ctx.offset


def _context(offset: int, value: bytes, keep_alive=None) -> PollContext:
    message = Message(topic="t", partition=0, offset=offset, key=b"k", value=value)
    return PollContext([RecordContext(message)], keep_alive=keep_alive)


class Shipped(NoHooks):
    def __init__(self) -> None:
        self.event = threading.Event()

    def on_call_start(self, batch: int, context: PollContext) -> None:
        self.event.set()


@pytest.fixture
def shipped() -> Shipped:
    return Shipped()


@pytest.fixture
def runner(shipped) -> Iterator[tuple[ProcessRunner, queue.SimpleQueue[WorkDone]]]:
    results: queue.SimpleQueue[WorkDone] = queue.SimpleQueue()
    started = ProcessRunner(1, SystemClock(), name="pdl", hooks=shipped, call_timeout=60.0)
    started.start(hang_or_keep_alive, results.put)
    yield started, results
    started.stop(1.0)


def test_cancel_terminates_the_worker_running_the_call_and_a_replacement_serves(runner, shipped):
    process_runner, results = runner
    # Given a call that hangs in the only worker process
    process_runner.submit(1, _context(1, b"hang"))
    assert shipped.event.wait(20)
    pid = process_runner._workers[0].process.pid
    # When it is cancelled (its deadline passed)
    process_runner.cancel(1, DeadlineExceeded("late"))
    # Then it reports a terminated worker, and a new worker process runs the next call
    done = results.get(timeout=20)
    assert done.batch == 1
    assert isinstance(done.errors[0], WorkerCrashed)
    assert "terminated" in str(done.errors[0])
    process_runner.submit(2, _context(2, b"ok"))
    done = results.get(timeout=30)
    assert (done.batch, done.errors, done.value) == (2, (None,), 2)
    assert process_runner.restarts == 1
    assert process_runner._workers[0].process.pid != pid


def test_extend_deadline_in_a_worker_reaches_the_parents_context(runner):
    process_runner, results = runner
    asked: list[float] = []
    seen = threading.Event()

    def keep_alive(seconds: float) -> None:
        asked.append(seconds)
        if 7.0 in asked and 11.0 in asked:
            seen.set()

    process_runner.submit(1, _context(1, b"alive", keep_alive))
    done = results.get(timeout=20)
    assert done.errors == (None,)
    assert seen.wait(10)
    # (60.0: the runner restarts the deadline when it ships the call to a worker)
    assert asked[0] == 60.0
    assert 7.0 in asked
    assert 11.0 in asked
