"""An unreachable broker is said once also when the consumer produces (``poll_and_produce``,
or dead letters): the library's producer reaches the same brokers, and two clients' WARNINGs
for one outage are one too many (issue 35, item 4: "log one WARNING, not a flood"). The real
client, no broker at all."""

from __future__ import annotations

import logging
import time

from parallel_consumer import ParallelConsumer

#: Nothing listens on port 1: every connection is refused at once.
UNREACHABLE = "127.0.0.1:1"


def test_an_unreachable_broker_is_one_warning_for_a_consumer_that_produces(caplog):
    caplog.set_level(logging.DEBUG, logger="parallel_consumer")
    # Given a producing consumer of a broker nobody runs
    pc = ParallelConsumer({"bootstrap.servers": UNREACHABLE, "group.id": "unreachable"})
    pc.subscribe(["t"])
    pc.poll_and_produce(lambda ctx: None)
    try:
        # When both clients have seen every broker down
        deadline = time.monotonic() + 10.0
        while pc.statistics().poller.brokers_down_for is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)
    finally:
        pc.close()
    # Then one WARNING said so
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1, loud
