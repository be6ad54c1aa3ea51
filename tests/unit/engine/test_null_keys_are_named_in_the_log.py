"""In KEY order, records with a null key share one lane per partition and run one at a time:
the consumer says so once per partition (issue 35, item 9), not silently."""

from __future__ import annotations

import logging

from parallel_consumer import Options, PollContext, ProcessingOrder


def test_null_keyed_records_in_key_order_are_logged_once_per_partition(
    harness, cluster, wait_until, caplog
):
    # Given 20 records without a key in partition 0, and KEY order
    cluster.create_topic("t")
    for i in range(20):
        cluster.produce("t", b"%d" % i)
    ran: list[int] = []

    def handle(ctx: PollContext) -> None:
        ran.append(ctx.offset)

    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=8))
    with caplog.at_level(logging.DEBUG, logger="parallel_consumer"):
        pc.poll(handle)
        wait_until(lambda: len(ran) == 20)
        pc.close()
    # Then one log line names the partition and says null keys run one at a time
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.INFO and "null" in r.getMessage().lower()
    ]
    assert len(lines) == 1, lines
    assert "t[0]" in lines[0]
