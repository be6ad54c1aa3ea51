"""``ParallelConsumer.run()``: it blocks while processing, and SIGTERM or SIGINT close it
gracefully (a second one fast), committing what finished; the default close does not drain."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest

from parallel_consumer import Lifecycle, Options, PollContext, RetriesExhausted
from parallel_consumer._signals import StopSignals


def _installed(signum: int) -> bool:
    """run() (or close()) handles ``signum`` now: sending it cannot kill the test process."""
    handler = signal.getsignal(signum)
    if signum == signal.SIGINT and handler is signal.default_int_handler:
        return True  # a KeyboardInterrupt, which close() handles
    return isinstance(getattr(handler, "__self__", None), StopSignals)


def _signal_when(
    condition, signum: int = signal.SIGTERM, *, times: int = 1, then=lambda: None
) -> threading.Thread:
    """Send ``signum`` to this process (``times`` times, 0.1 s apart) once ``condition()``, and
    only while a handler of the library's is installed: a stray signal would end the test run."""

    def send() -> None:
        deadline = time.monotonic() + 10
        while not (condition() and _installed(signum)) and time.monotonic() < deadline:
            time.sleep(0.005)
        for _ in range(times):
            if not _installed(signum):
                return  # (the test then fails on what it asserts, without a stray signal)
            os.kill(os.getpid(), signum)
            time.sleep(0.1)
        then()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_closes_run_and_commits_what_finished(harness, cluster, signum):
    # Given 200 records in partition order and a handler stuck on record 5
    cluster.create_topic("t")
    for i in range(200):
        cluster.produce("t", b"%d" % i)
    ran: list[int] = []
    gate = threading.Event()

    def handle(ctx: PollContext) -> None:
        if ctx.offset == 5:
            gate.wait(10)
        ran.append(ctx.offset)

    pc = harness.make(Options(ordering="partition"))
    pc.poll(handle)
    previous = signal.getsignal(signum)
    # When the process gets the signal while record 5 runs (and it finishes soon after)
    sender = _signal_when(lambda: ran == [0, 1, 2, 3, 4], signum, then=gate.set)
    pc.run()
    sender.join()
    # Then run() returned after a graceful close: the call in flight finished, nothing after
    # it started, and the commit covers exactly what finished
    assert pc.lifecycle is Lifecycle.CLOSED
    assert ran == [0, 1, 2, 3, 4, 5]
    assert cluster.committed("g", "t", 0) == (6, None)
    # And the process's own handler is back
    assert signal.getsignal(signum) == previous


def test_a_second_signal_closes_at_once_and_keeps_what_finished(harness, cluster):
    # Given a handler hung on record 3 with 0..2 finished
    cluster.create_topic("t")
    for i in range(10):
        cluster.produce("t", b"%d" % i)
    ran: list[int] = []
    hang = threading.Event()

    def handle(ctx: PollContext) -> None:
        if ctx.offset == 3:
            hang.wait(10)
        ran.append(ctx.offset)

    pc = harness.make(Options(ordering="partition", shutdown_timeout=60))
    pc.poll(handle)
    # When two SIGTERMs arrive while record 3 hangs
    sender = _signal_when(lambda: ran == [0, 1, 2], times=2)
    started = time.monotonic()
    pc.run()
    took = time.monotonic() - started
    sender.join()
    hang.set()
    # Then the close did not wait for the hung call (60 s allowed by the first signal)
    assert took < 10
    assert pc.lifecycle is Lifecycle.CLOSED
    # And what finished is committed; the hung record is not
    assert cluster.committed("g", "t", 0) == (3, None)


def test_close_from_another_thread_ends_run(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    ran: list[bytes] = []
    pc = harness.make()
    pc.poll(lambda ctx: ran.append(ctx.value or b""))
    threading.Thread(
        target=lambda: (wait_until(lambda: ran == [b"x"]), pc.close()), daemon=True
    ).start()
    pc.run(handle_signals=False)
    assert pc.lifecycle is Lifecycle.CLOSED
    assert cluster.committed("g", "t", 0) == (1, None)


def test_run_without_a_handler_says_what_is_missing(harness):
    pc = harness.make()
    with pytest.raises(RuntimeError, match="needs a handler"):
        pc.run()
    pc.close()


def test_run_raises_the_failure_that_stopped_processing(harness, cluster):
    # Given a handler that stops the consumer (on_exhausted=STOP after no retries)
    cluster.create_topic("t")
    cluster.produce("t", b"x")

    def handle(ctx: PollContext) -> None:
        raise ValueError("boom")

    pc = harness.make(Options(max_retries=0, on_retries_exhausted="stop"))
    pc.poll(handle)
    # Then run() ends with that failure instead of blocking
    with pytest.raises(RetriesExhausted):
        pc.run(handle_signals=False)


def test_the_default_close_does_not_drain_buffered_records(harness, cluster, wait_until):
    # Given 100 buffered records behind one in flight
    cluster.create_topic("t")
    for i in range(100):
        cluster.produce("t", b"%d" % i)
    ran: list[int] = []
    gate = threading.Event()

    def handle(ctx: PollContext) -> None:
        gate.wait(10)
        ran.append(ctx.offset)

    pc = harness.make(Options(ordering="partition"))
    pc.poll(handle)
    wait_until(lambda: pc.statistics().waiting > 50)
    threading.Timer(0.05, gate.set).start()
    # When close() is called with its defaults
    pc.close()
    # Then only the call in flight finished and was committed
    assert ran == [0]
    assert cluster.committed("g", "t", 0) == (1, None)


def test_an_interrupt_while_closing_closes_fast_without_raising(
    harness, cluster, wait_until, caplog, default_sigint
):
    # Given a handler hung on its record and a close allowed to wait 60 s for it
    cluster.create_topic("t")
    cluster.produce("t", b"a")
    cluster.produce("t", b"b")
    ran: list[bytes] = []
    hang = threading.Event()

    def handle(ctx: PollContext) -> None:
        if ctx.value == b"b":
            hang.wait(10)
        ran.append(ctx.value or b"")

    pc = harness.make(Options(ordering="partition"))
    pc.poll(handle)
    wait_until(lambda: ran == [b"a"] and pc.statistics().in_flight == 1)
    # When Ctrl-C arrives during close()
    sender = _signal_when(lambda: pc.lifecycle is Lifecycle.CLOSING, signal.SIGINT)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        pc.close(timeout=60)
    sender.join()
    hang.set()
    # Then close() returned soon, without a KeyboardInterrupt, and what finished is committed
    assert time.monotonic() - started < 10
    assert pc.lifecycle is Lifecycle.CLOSED
    assert cluster.committed("g", "t", 0) == (1, None)
    assert "interrupted while closing" in caplog.text
