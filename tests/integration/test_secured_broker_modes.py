"""LocalKafka's secured listeners besides SASL_SSL (which the secured-cluster tests use):
SASL_PLAINTEXT and mTLS. A user with an ACL writes and reads with ``client_config(user)``
alone; one without is refused, which shows the ACLs are enforced."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, Producer

from parallel_consumer.testing import LocalKafka, create_topic, produce_records, read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.security]


@pytest.mark.parametrize("security", ["sasl_plaintext", "ssl"])
def test_a_user_with_an_acl_reads_and_writes_and_one_without_is_refused(security: str) -> None:
    with LocalKafka(security=security) as kafka:  # type: ignore[arg-type]
        print(f"{security}: started in {kafka.start_seconds:.1f} s")
        # Given a topic, a user allowed to use it and one with no ACLs
        topic = create_topic(kafka.bootstrap_servers, "orders", client_config=kafka.client_config())
        kafka.add_user("alice")
        kafka.add_user("mallory")
        kafka.grant("alice", "topic", topic, "READ", "WRITE")
        kafka.grant("alice", "group", "pc-read-topic-unused", "READ")  # read_topic's (unused)
        # When alice writes and reads with her settings alone
        produce_records(
            kafka.bootstrap_servers, topic, 5, producer_config=kafka.client_config("alice")
        )
        records = read_topic(
            kafka.bootstrap_servers, topic, client_config=kafka.client_config("alice")
        )
        # Then she gets them back
        assert [r.value for r in records] == [f"value-{i}".encode() for i in range(5)]
        # And mallory's write is refused by the authorizer
        errors: list[KafkaError] = []
        producer = Producer({**kafka.client_config("mallory"), "message.timeout.ms": 10_000})
        producer.produce(topic, b"x", on_delivery=lambda err, _: errors.append(err))
        producer.flush(15)
        assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
