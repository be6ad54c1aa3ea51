"""Fixtures for engine tests on the in-memory fakes (no broker, no sleeps waiting for time)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from parallel_consumer import Options, ParallelConsumer, ParallelConsumerError
from parallel_consumer.testing.clock import FakeClock
from parallel_consumer.testing.fakes import FakeCluster, FakeConsumer, FakeProducer

WaitUntil = Callable[..., None]


def _wait_until(condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``condition`` until true; fail after ``timeout`` real seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(0.002)


@pytest.fixture
def wait_until() -> WaitUntil:
    return _wait_until


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


class Harness:
    """Builds ParallelConsumers over a FakeCluster and remembers their fake consumers."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.consumers: list[FakeConsumer] = []
        self.instances: list[ParallelConsumer] = []
        self.producers: list[FakeProducer] = []

    def _producer_factory(self, config: dict[str, Any]) -> FakeProducer:
        producer = self.cluster.producer(config)
        self.producers.append(producer)
        return producer

    def _factory(self, config: dict[str, Any]) -> FakeConsumer:
        consumer = self.cluster.consumer(config)
        self.consumers.append(consumer)
        return consumer

    def make(
        self,
        options: Options | None = None,
        *,
        group: str = "g",
        clock: FakeClock | None = None,
        topics: tuple[str, ...] = ("t",),
        hooks: Any = None,
        producer_config: dict[str, Any] | None = None,
        **config: Any,
    ) -> ParallelConsumer:
        pc = ParallelConsumer(
            {"bootstrap.servers": "fake:9092", "group.id": group, **config},
            options,
            hooks=hooks,
            clock=clock,
            consumer_factory=self._factory,
            producer_config=producer_config,
            producer_factory=self._producer_factory,
            admin_factory=self.cluster.admin,
        )
        pc.subscribe(list(topics))
        self.instances.append(pc)
        return pc

    def close_all(self) -> None:
        for pc in self.instances:
            # A test that expected a failure has already checked it.
            with contextlib.suppress(ParallelConsumerError):
                pc.close(drain=False, timeout=5.0)


@pytest.fixture
def harness(cluster: FakeCluster) -> Iterator[Harness]:
    h = Harness(cluster)
    yield h
    h.close_all()


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt, as in a plain Python process, for the test's duration
    (another library of the session, such as pyspark's SparkContext, may have installed its
    own handler)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
