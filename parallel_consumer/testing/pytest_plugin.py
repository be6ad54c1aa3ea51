"""pytest plugin: a real Kafka broker and per-test topics and groups for testing handlers.

Installed with the package (entry point ``pytest11``), so any project that depends on
parallel-consumer gets these fixtures:

* ``kafka`` (session): a started :class:`LocalKafka`, or :class:`ExternalKafka` when
  ``PC_TEST_BOOTSTRAP_SERVERS`` is set. Backend from ``PC_TEST_KAFKA_BACKEND`` (``auto`` by
  default; ``apache`` or ``tansu``).
* ``topic``: a factory ``topic(partitions=1, config=None) -> name`` creating uniquely named topics.
* ``group_id``: a fresh consumer group id; ``consumer_config``: client settings for a fast test.
* ``kafka_cluster`` (session): a started ``LocalKafka(brokers=3)`` for broker-failure tests
  (apache only; skipped with tansu or an external broker). Tests using it are marked
  ``cluster``; a test that kills or stops brokers should start them again before it ends.

Tests that use ``kafka`` are marked ``kafka``. A test that needs a broker capability declares it
with ``@pytest.mark.kafka_requires("transactions", ...)`` and is skipped, with the reason, on a
backend that lacks it.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import pytest

from parallel_consumer.testing._capabilities import EXTERNAL_CAPABILITIES, Capabilities
from parallel_consumer.testing.local_kafka import LocalKafka, choose_backend
from parallel_consumer.testing.records import create_topic

__all__ = ["ExternalKafka", "KafkaBroker", "TopicFactory"]


class KafkaBroker(Protocol):
    """What tests may rely on from the ``kafka`` fixture, whichever broker is behind it."""

    @property
    def bootstrap_servers(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def capabilities(self) -> Capabilities: ...


@dataclass(frozen=True)
class ExternalKafka:
    """A broker the tests did not start (``PC_TEST_BOOTSTRAP_SERVERS``); it cannot be restarted."""

    bootstrap_servers: str
    backend: str = "external"
    capabilities: Capabilities = EXTERNAL_CAPABILITIES


class TopicFactory(Protocol):
    def __call__(self, partitions: int = 1, *, config: Mapping[str, str] | None = None) -> str: ...


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kafka_requires(*capabilities): skip unless the kafka fixture's backend has them "
        "(names: fields of parallel_consumer.testing.Capabilities)",
    )
    config.addinivalue_line(
        "markers", "cluster: uses the three-broker kafka_cluster fixture (broker failures)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        uses_kafka = "kafka" in getattr(item, "fixturenames", ())
        if uses_kafka or item.get_closest_marker("kafka_requires"):
            item.add_marker(pytest.mark.kafka)
        if "kafka_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaBroker]:
    """A broker shared by the whole test session."""
    external = os.environ.get("PC_TEST_BOOTSTRAP_SERVERS")
    if external:
        yield ExternalKafka(external)
        return
    backend = choose_backend(os.environ.get("PC_TEST_KAFKA_BACKEND", "auto"))
    broker = LocalKafka(backend=backend)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[LocalKafka]:
    """Three brokers (KRaft, one quorum) shared by the session's broker-failure tests: topics
    get replication factor 3 and ``min.insync.replicas=2``. Started on first use."""
    if os.environ.get("PC_TEST_BOOTSTRAP_SERVERS"):
        pytest.skip("kafka_cluster starts its own brokers; PC_TEST_BOOTSTRAP_SERVERS is set")
    if choose_backend(os.environ.get("PC_TEST_KAFKA_BACKEND", "auto")) != "apache":
        pytest.skip("kafka_cluster needs the apache backend (Java and the Kafka jars)")
    cluster = LocalKafka(brokers=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def _kafka_requires(request: pytest.FixtureRequest) -> None:
    """Skip a test marked ``kafka_requires(...)`` when the broker lacks a capability."""
    marker = request.node.get_closest_marker("kafka_requires")
    if marker is None:
        return
    broker: KafkaBroker = request.getfixturevalue("kafka")
    missing = broker.capabilities.missing(*marker.args)
    if missing:
        why = ", ".join(
            f"{name} ({broker.capabilities.reason(name) or 'not supported'})" for name in missing
        )
        pytest.skip(f"the {broker.backend} broker lacks {why}")


def _slug(request: pytest.FixtureRequest) -> str:
    # Topic names allow [a-zA-Z0-9._-] up to 249 chars; keep the test name for readable logs.
    return re.sub(r"[^a-zA-Z0-9._-]+", "-", request.node.name)[:80].strip("-.")


@pytest.fixture
def topic(kafka: KafkaBroker, request: pytest.FixtureRequest) -> TopicFactory:
    """A factory creating a uniquely named topic per call; topics are never deleted."""
    slug = _slug(request)

    def make(partitions: int = 1, *, config: Mapping[str, str] | None = None) -> str:
        name = f"pc-{slug}-{uuid.uuid4().hex[:8]}"
        return create_topic(kafka.bootstrap_servers, name, partitions=partitions, config=config)

    return make


@pytest.fixture
def group_id(request: pytest.FixtureRequest) -> str:
    """A consumer group id no other test uses."""
    return f"pc-group-{_slug(request)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def consumer_config(kafka: KafkaBroker, group_id: str) -> dict[str, Any]:
    """confluent_kafka Consumer settings for a fast test: fresh group, no auto commit."""
    # Tansu holds each JoinGroup round for about half the session timeout: keep it short there.
    session_timeout = 2000 if kafka.backend == "tansu" else 6000
    return {
        "bootstrap.servers": kafka.bootstrap_servers,
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": session_timeout,
        "heartbeat.interval.ms": 500,
        "fetch.wait.max.ms": 50,
    }
