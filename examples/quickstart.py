"""The README's example: process topic "orders" with up to 32 calls at once, one at a time per key.

    python examples/quickstart.py 127.0.0.1:41234    # the address `pc kafka start` printed

Ctrl-C or SIGTERM stops it: the calls in flight finish, what finished is committed, and a second
run goes on from there.
"""

from __future__ import annotations

import sys

from parallel_consumer import Options, ParallelConsumer, PollContext, ProcessingOrder


def handle(ctx: PollContext) -> None:
    # Runs on a worker thread. Returning marks the record done; raising retries it later.
    print(f"{ctx.topic}[{ctx.partition}]@{ctx.offset} key={ctx.key!r} value={ctx.value!r}")


pc = ParallelConsumer(
    {
        "bootstrap.servers": sys.argv[1],
        "group.id": "quickstart",
        "auto.offset.reset": "earliest",  # a new group reads the topic from its start
    },
    Options(ordering=ProcessingOrder.KEY, max_concurrency=32),
)
pc.subscribe(["orders"])
pc.poll(handle)  # starts processing in the background and returns
pc.run()  # blocks; SIGTERM or Ctrl-C: calls in flight finish, what finished is committed
