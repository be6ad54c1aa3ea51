"""``share``: a Kafka share group (KIP-932) through confluent-kafka's ShareConsumer, with a
thread pool doing the work and the poll thread acknowledging each record. UNORDERED rows only:
a share group hands records of one partition to any member, with no order."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import confluent_kafka

from parallel_consumer.bench.contestants.base import RunEnv
from parallel_consumer.bench.kafka_io import new_group
from parallel_consumer.bench.model import Observation, Row
from parallel_consumer.bench.work import sync_work

__all__ = ["ShareContestant", "set_earliest"]


def set_earliest(bootstrap: str, group: str) -> None:
    """A share group starts at the latest offset unless its group config says otherwise: make
    ``group`` start at the earliest."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(
                "share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


class ShareContestant:
    name = "share"
    description = "confluent-kafka ShareConsumer (share group), thread pool of C, explicit acks"

    def unavailable(self) -> str | None:
        if not hasattr(confluent_kafka, "ShareConsumer"):
            return (
                f"confluent-kafka {confluent_kafka.__version__} has no ShareConsumer "
                "(share groups need a newer confluent-kafka; 2.16.1 has it)"
            )
        return None

    def unsupported(self, row: Row) -> str | None:
        if row.produce is not None:
            return "share does not produce (a produce row measures poll_and_produce)"
        if row.ordering != "UNORDERED":
            return "a share group keeps no order; it runs UNORDERED rows only"
        if row.batch_size != 1:
            return "share has no batches: its figure is the row's without batch_size"
        if row.work.kind in ("async_sleep", "cpu"):
            return "share runs thread-pool work only"
        return None

    def run(self, env: RunEnv, row: Row, topic: str, ends: dict[int, int]) -> Observation:
        expected = sum(ends.values())
        group = new_group("share")
        set_earliest(env.bootstrap, group)
        work = sync_work(row.work)

        def handle(message: Any) -> tuple[int, Any, int, float]:
            t0 = time.perf_counter()
            work()
            return message.partition(), message.key(), message.offset(), time.perf_counter() - t0

        consumer = confluent_kafka.ShareConsumer(
            {
                "bootstrap.servers": env.bootstrap,
                "group.id": group,
                "share.acknowledgement.mode": "explicit",
                # The client warns once that share consumers are in preview; noise here.
                "log_level": 3,
            }
        )
        log: list[tuple[int, Any, int, float]] = []
        done: set[tuple[int, int]] = set()
        first_call: float | None = None
        started = time.time()
        deadline = time.monotonic() + env.timeout
        try:
            consumer.subscribe([topic])
            with ThreadPoolExecutor(row.concurrency, thread_name_prefix="bench-share") as pool:
                while len(done) < expected:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"share {row.name}: only {len(done)}/{expected}")
                    messages = [m for m in consumer.poll(1.0) if not m.error()]
                    if not messages:
                        continue
                    if first_call is None:
                        first_call = time.time()
                    # Every record of a poll must be acknowledged before the next poll.
                    for message, entry in zip(messages, pool.map(handle, messages), strict=True):
                        log.append(entry)
                        done.add((entry[0], entry[2]))
                        consumer.acknowledge(message)
                # Returns once the broker acknowledged the acknowledgements.
                consumer.commit_sync(60)
                finished = time.time()
        finally:
            consumer.close()
        assert first_call is not None
        return Observation(
            started=started,
            first_call=first_call,
            finished=finished,
            log=log,
            extra={"clock": "to commit_sync() of the last acknowledgements"},
        )
