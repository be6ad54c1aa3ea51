"""docs/getting-started.md's complete example: produce 100 orders from 10 customers, then process
them with a handler that takes 100 ms per record, 32 calls at once, one at a time per customer.

    python examples/getting_started.py 127.0.0.1:41234    # the address `pc kafka start` printed
"""

from __future__ import annotations

import sys
import threading
import time

from confluent_kafka import KafkaError, KafkaException, Producer

# NewTopic's documented home; confluent-kafka's stubs re-export it without marking it public.
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from parallel_consumer import Options, ParallelConsumer, PollContext, ProcessingOrder

bootstrap = sys.argv[1]  # e.g. 127.0.0.1:41234, as printed by `pc kafka start`
topic = "orders"

# A topic with 3 partitions (kept if it exists already).
admin = AdminClient({"bootstrap.servers": bootstrap})
try:
    admin.create_topics([NewTopic(topic, num_partitions=3)])[topic].result()
except KafkaException as exc:
    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
        raise

# 100 orders from 10 customers; the key decides the partition.
producer = Producer({"bootstrap.servers": bootstrap})
for i in range(100):
    producer.produce(topic, key=f"customer-{i % 10}", value=f"order-{i}")
producer.flush()

pc = ParallelConsumer(
    {
        "bootstrap.servers": bootstrap,
        "group.id": "getting-started",
        "auto.offset.reset": "earliest",  # a new group starts at the beginning
    },
    Options(ordering=ProcessingOrder.KEY, max_concurrency=32),
)
pc.subscribe([topic])

lock = threading.Lock()
done: list[str] = []


@pc.poll  # registers the handler and starts processing in the background
def handle(ctx: PollContext) -> None:
    time.sleep(0.1)  # stands in for a call to another service
    with lock:
        done.append(f"{ctx.key!r}: {ctx.value!r}")


started = time.monotonic()
while len(done) < 100 and time.monotonic() - started < 60:
    time.sleep(0.05)
print(f"{len(done)} records in {time.monotonic() - started:.1f} s")
stats = pc.statistics()
print(
    f"succeeded={stats.records_succeeded} failed={stats.records_failed} in_flight={stats.in_flight}"
)
pc.close()  # runs what is still buffered, commits, leaves the group
