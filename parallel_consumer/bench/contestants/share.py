"""``share``: a Kafka share group (KIP-932) through confluent-kafka's ShareConsumer, with a
thread pool doing the work and the poll thread acknowledging each record. UNORDERED rows only:
a share group hands records of one partition to any member, with no order."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import confluent_kafka

from parallel_consumer.bench.contestants.base import RunEnv
from parallel_consumer.bench.kafka_io import new_group
from parallel_consumer.bench.model import Observation, Row
from parallel_consumer.bench.work import sync_work

__all__ = [
    "ShareContestant",
    "new_share_group",
    "set_earliest",
    "share_unavailable",
    "share_unsupported",
]


def new_share_group(bootstrap: str) -> str:
    """A new share group's id, set to start at the earliest offset."""
    group = new_group("share")
    set_earliest(bootstrap, group)
    return group


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


def share_unavailable() -> str | None:
    if not hasattr(confluent_kafka, "ShareConsumer"):
        return (
            f"confluent-kafka {confluent_kafka.__version__} has no ShareConsumer "
            "(share groups need a newer confluent-kafka; 2.16.1 has it)"
        )
    return None


def share_unsupported(row: Row) -> str | None:
    """Rows a share group cannot run (any contestant on one)."""
    if row.ordering != "UNORDERED":
        return "a share group keeps no order; it runs UNORDERED rows only"
    return None


class ShareContestant:
    name = "share"
    description = "confluent-kafka ShareConsumer (share group), thread pool of C, explicit acks"

    def unavailable(self) -> str | None:
        return share_unavailable()

    def unsupported(self, row: Row) -> str | None:
        if row.produce is not None:
            return "share does not produce (a produce row measures poll_and_produce)"
        if (why := share_unsupported(row)) is not None:
            return why
        if row.batch_size != 1:
            return "share has no batches: its figure is the row's without batch_size"
        if row.work.kind in ("async_sleep", "cpu"):
            return "share runs thread-pool work only"
        return None

    def run(self, env: RunEnv, row: Row, topic: str, ends: dict[int, int]) -> Observation:
        expected = sum(ends.values())
        group = new_share_group(env.bootstrap)
        work = sync_work(row.work)

        def handle(message: Any) -> tuple[int, Any, int, float]:
            t0 = time.perf_counter()
            work()
            return message.partition(), message.key(), message.offset(), time.perf_counter() - t0

        consumers = [
            confluent_kafka.ShareConsumer(
                {
                    "bootstrap.servers": env.bootstrap,
                    "group.id": group,
                    "share.acknowledgement.mode": "explicit",
                    # The client warns once that share consumers are in preview; noise here.
                    "log_level": 3,
                }
            )
            for _ in range(row.instances)
        ]
        log: list[tuple[int, Any, int, float]] = []
        done: set[tuple[int, int]] = set()
        lock = threading.Lock()
        first_call: list[float] = []
        started = time.time()
        deadline = time.monotonic() + env.timeout

        def member(consumer: Any) -> None:
            """One member of the group: its own poll loop and pool of C threads."""
            consumer.subscribe([topic])
            with ThreadPoolExecutor(row.concurrency, thread_name_prefix="bench-share") as pool:
                while len(done) < expected:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"share {row.name}: only {len(done)}/{expected}")
                    messages = [m for m in consumer.poll(0.1) if not m.error()]
                    if not messages:
                        continue
                    if not first_call:
                        first_call.append(time.time())
                    # Every record of a poll must be acknowledged before the next poll.
                    entries = list(pool.map(handle, messages))
                    for message in messages:
                        consumer.acknowledge(message)
                    with lock:
                        log.extend(entries)
                        done.update((e[0], e[2]) for e in entries)
            # Returns once the broker acknowledged the acknowledgements.
            consumer.commit_sync(60)

        try:
            with ThreadPoolExecutor(row.instances, thread_name_prefix="bench-member") as members:
                for future in [members.submit(member, c) for c in consumers]:
                    future.result()
            finished = time.time()
        finally:
            for consumer in consumers:
                consumer.close()
        assert first_call
        return Observation(
            started=started,
            first_call=first_call[0],
            finished=finished,
            log=log,
            extra={"clock": "to commit_sync() of the last acknowledgements"},
        )
