"""A record to be dead-lettered while dead-lettering is off is retried with a WARNING naming it
"at its first such attempt" (docs/failure-handling.md): also when that attempt is not the
record's first one."""

from __future__ import annotations

import logging
import threading

from parallel_consumer import DeadLetter, OnExhausted, Options, PollContext


def test_a_dead_letter_raised_on_a_retry_is_warned_about(harness, cluster, wait_until, caplog):
    # Given default options (dead-lettering off) and a handler that fails once, then asks for
    # a dead letter
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    calls: list[int] = []
    done = threading.Event()

    def handle(ctx: PollContext) -> None:
        calls.append(ctx.attempts)
        if len(calls) == 1:
            raise ValueError("transient")
        if len(calls) >= 3:
            done.set()
        raise DeadLetter("bad order")

    pc = harness.make(Options(retry_delay=0.01))
    with caplog.at_level(logging.DEBUG, logger="parallel_consumer"):
        pc.poll(handle)
        wait_until(done.is_set)
        pc.close()
    # Then a WARNING named the record and said dead-lettering is off
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("t[0]@0 is to be dead-lettered" in m for m in warnings), warnings


def test_a_callback_choosing_dead_letter_without_a_topic_is_warned_about(
    harness, cluster, wait_until, caplog
):
    # Given two retries skipped when exhausted, but a callback that picks DEAD_LETTER, with no
    # dead-letter topic: dead-lettering is off
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    calls: list[int] = []

    def handle(ctx: PollContext) -> None:
        calls.append(ctx.attempts)
        raise ValueError("boom")

    options = Options(
        retry_delay=0.01,
        max_retries=2,
        on_retries_exhausted=OnExhausted.SKIP,
        retries_exhausted_callback=lambda record, error: OnExhausted.DEAD_LETTER,
    )
    pc = harness.make(options)
    with caplog.at_level(logging.DEBUG, logger="parallel_consumer"):
        pc.poll(handle)
        wait_until(lambda: len(calls) >= 5)
        pc.close()
    # Then a WARNING named the record and said dead-lettering is off
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("t[0]@0 is to be dead-lettered" in m for m in warnings), warnings
