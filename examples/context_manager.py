"""docs/getting-started.md's context-manager form: process topic "orders" for ten seconds.

python examples/context_manager.py 127.0.0.1:41234    # the address `pc kafka start` printed
"""

from __future__ import annotations

import sys
import time

from parallel_consumer import Options, ParallelConsumer, PollContext


def handle(ctx: PollContext) -> None:
    print(ctx.partition, ctx.offset, ctx.value)


config = {
    "bootstrap.servers": sys.argv[1],
    "group.id": "getting-started-with",
    "auto.offset.reset": "earliest",
}
with ParallelConsumer(config, Options(max_concurrency=32)) as pc:
    pc.subscribe(["orders"])
    pc.poll(handle)  # poll() also works as a plain call
    time.sleep(10)  # process for ten seconds
# here: buffered records ran, offsets are committed, the Kafka client is closed
