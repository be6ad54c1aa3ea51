"""Shared pieces of the broker-failure tests on the three-broker ``kafka_cluster``.

Inputs are fed by a :class:`Feeder` thread for the whole scenario, so every fault happens
while records are still arriving and being processed ("mid-run"), whatever the machine's pace.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from parallel_consumer import ParallelConsumer
from parallel_consumer.testing import LocalKafka

#: Keys of the fed inputs: KEY order has many lanes, each with many records.
KEYS = 50


def all_brokers_running(cluster: LocalKafka) -> None:
    """Start whatever broker an earlier (failed) test left down."""
    down = [i for i in range(cluster.brokers) if not cluster.broker_running(i)]
    if down:
        cluster.start_broker(*down)


class Feeder:
    """Produces keyed inputs at ``rate`` per second until stopped (idempotent, acks=all), and
    remembers where each landed. Rides out broker failures as any producer does: librdkafka
    retries until ``message.timeout.ms``."""

    def __init__(self, bootstrap_servers: str, topic: str, *, rate: float) -> None:
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap_servers,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
                "log_level": 0,
            }
        )
        self._topic = topic
        self._rate = rate
        self._stop = threading.Event()
        self._lock = threading.Lock()
        #: (partition, offset) of every acknowledged input.
        self.delivered: set[tuple[int, int]] = set()
        self.errors: list[str] = []
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name="test-feeder", daemon=True)
        self._thread.start()

    def _report(self, err: Any, msg: Any) -> None:
        with self._lock:
            if err is not None:
                self.errors.append(str(err))
            else:
                self.delivered.add((msg.partition(), msg.offset()))

    def _run(self) -> None:
        began = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - began) * self._rate)
            while self.sent < due:
                i = self.sent
                try:
                    self._producer.produce(
                        self._topic, f"v{i}", f"k{i % KEYS}", on_delivery=self._report
                    )
                except BufferError:
                    break
                self.sent += 1
            self._producer.poll(0.02)

    def stop(self, timeout: float = 120.0) -> int:
        """Stop feeding; wait until every input is acknowledged; return how many there are."""
        self._stop.set()
        self._thread.join(10)
        left = self._producer.flush(timeout)
        assert left == 0, f"{left} inputs not acknowledged within {timeout} s"
        assert not self.errors, self.errors[:5]
        assert len(self.delivered) == self.sent
        return self.sent

    def wait_for(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.delivered) < count:
            assert time.monotonic() < deadline, f"fewer than {count} inputs in {timeout} s"
            time.sleep(0.05)


class AtRisk:
    """Samples, until stopped, how many outputs were sent whose inputs were not committed yet:
    the only ones a replay can duplicate. ``peak`` (plus the largest rise between two samples)
    bounds the duplicates of an at-least-once run."""

    def __init__(self, pc: ParallelConsumer, every: float = 0.02) -> None:
        self._pc = pc
        self._every = every
        self.peak = 0
        self.largest_step = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-at-risk", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = 0
        while not self._stop.wait(self._every):
            stats = self._pc.statistics()
            committed = sum(max(0, p.committed_offset or 0) for p in stats.partitions)
            # (committed counts records of this assignment only; a revoked partition's are
            # outside both terms' difference)
            risk = max(0, stats.outputs_sent - committed)
            self.peak = max(self.peak, risk)
            self.largest_step = max(self.largest_step, risk - last)
            last = risk

    @property
    def bound(self) -> int:
        return self.peak + self.largest_step

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def sample_while(
    condition: Callable[[], bool], sample: Callable[[], None], *, every: float = 0.1
) -> None:
    """Call ``sample`` every ``every`` seconds while ``condition`` holds."""
    while condition():
        sample()
        time.sleep(every)
