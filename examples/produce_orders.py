"""Fill topic "orders" (3 partitions, created if missing) with 100 records from 10 customers.

python examples/produce_orders.py 127.0.0.1:41234    # the address `pc kafka start` printed
"""

from __future__ import annotations

import sys

from confluent_kafka import KafkaError, KafkaException, Producer

# NewTopic's documented home; confluent-kafka's stubs re-export it without marking it public.
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

bootstrap = sys.argv[1]
topic = "orders"

admin = AdminClient({"bootstrap.servers": bootstrap})
try:
    admin.create_topics([NewTopic(topic, num_partitions=3)])[topic].result()
except KafkaException as exc:
    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
        raise

producer = Producer({"bootstrap.servers": bootstrap})
for i in range(100):  # the key picks the partition
    producer.produce(topic, key=f"customer-{i % 10}", value=f"order-{i}")
producer.flush()
print(f"produced 100 records to {topic!r}")
