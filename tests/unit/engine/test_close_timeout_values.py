"""``close(timeout=...)`` and ``run(timeout=...)`` take the timeouts a user writes: an infinite
one ("wait as long as it takes") closes, and anything else unusable is refused with a
ValueError before anything happens, never an OverflowError from deep inside with the consumer
left running."""

from __future__ import annotations

import math

import pytest

from parallel_consumer import Lifecycle, PollContext


@pytest.mark.parametrize("timeout", [math.inf, 1e300])
def test_close_with_a_huge_timeout_closes_or_refuses_it_cleanly(
    harness, cluster, wait_until, timeout
):
    # Given a running consumer that finished its record
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    ran: list[int] = []

    def handle(ctx: PollContext) -> None:
        ran.append(ctx.offset)

    pc = harness.make()
    pc.poll(handle)
    wait_until(lambda: ran == [0])
    # When it is closed with that timeout
    try:
        pc.close(timeout=timeout)
    except ValueError:
        pc.close()  # refused up front: the consumer is untouched and closes normally
    # Then it is closed and its record committed
    assert pc.lifecycle is Lifecycle.CLOSED
    assert cluster.committed("g", "t", 0) == (1, None)
