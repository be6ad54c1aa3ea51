"""docs/getting-started.md's test of a handler without a broker: the in-memory cluster and a clock
that moves only when the test says so. Run it with ``pytest examples/handler_test.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from parallel_consumer import Options, ParallelConsumer, PollContext
from parallel_consumer.testing import FakeClock, FakeCluster


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_failed_record_is_retried_after_the_delay() -> None:
    cluster = FakeCluster()
    cluster.create_topic("orders", partitions=1)
    cluster.produce("orders", b"order-1", key=b"customer-1")
    clock = FakeClock()
    pc = ParallelConsumer(
        {"bootstrap.servers": "unused:9092", "group.id": "test"},
        Options(retry_delay=30),
        consumer_factory=cluster.consumer,
        clock=clock,
    )
    pc.subscribe("orders")
    attempts: list[int] = []

    @pc.poll
    def handle(ctx: PollContext) -> None:
        attempts.append(ctx.attempts)
        if ctx.attempts == 0:
            raise ConnectionError("payment service down")

    wait_until(lambda: pc.statistics().retry_waiting == 1)
    clock.advance(29)  # not due yet
    assert attempts == [0]
    clock.advance(1)  # due: retried at once, no real waiting
    wait_until(lambda: pc.statistics().records_succeeded == 1)
    pc.close()
    assert attempts == [0, 1]
    assert cluster.committed("test", "orders", 0) == (1, None)  # offset 1, no offset map
