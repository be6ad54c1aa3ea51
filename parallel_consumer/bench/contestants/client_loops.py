"""``serial`` and ``raw``: plain confluent-kafka loops, what users write without a framework."""

from __future__ import annotations

import time

from confluent_kafka import Consumer

from parallel_consumer.bench.contestants.base import LogRecorder, RunEnv
from parallel_consumer.bench.kafka_io import base_consumer_config, new_group
from parallel_consumer.bench.model import Observation, Row
from parallel_consumer.bench.work import sync_work

__all__ = ["RawContestant", "SerialContestant"]

#: The serial loop commits synchronously every this many records (and once at the end).
SERIAL_COMMIT_EVERY = 1000


class SerialContestant:
    name = "serial"
    description = (
        f"confluent-kafka poll loop, one record at a time, commit every {SERIAL_COMMIT_EVERY}"
    )

    def unavailable(self) -> str | None:
        return None

    def unsupported(self, row: Row) -> str | None:
        if row.produce is not None:
            return "serial does not produce (a produce row measures poll_and_produce)"
        if row.work.kind == "async_sleep":
            return "serial runs plain functions only"
        if row.batch_size != 1:
            return "serial has no batches: its figure is the row's without batch_size"
        return None

    def run(self, env: RunEnv, row: Row, topic: str, ends: dict[int, int]) -> Observation:
        expected = sum(ends.values())
        work = sync_work(row.work)
        noop = row.work.kind == "noop"  # nothing to do, nothing to time (as in pc's handler)
        consumer = Consumer(base_consumer_config(env.bootstrap, new_group("serial")))
        recorder = LogRecorder(expected)
        add = recorder.add_one
        first_call: float | None = None
        started = time.time()
        deadline = time.monotonic() + env.timeout
        try:
            consumer.subscribe([topic])
            since_commit = 0
            while recorder.count < expected:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"serial {row.name}: only {recorder.count}/{expected} records"
                    )
                message = consumer.poll(1.0)
                if message is None or message.error():
                    continue
                if first_call is None:
                    first_call = time.time()
                if noop:
                    took = 0.0
                else:
                    t0 = time.perf_counter()
                    work()
                    took = time.perf_counter() - t0
                add(message.partition() or 0, message.key(), message.offset() or 0, took)
                since_commit += 1
                if since_commit >= SERIAL_COMMIT_EVERY:
                    consumer.commit(asynchronous=False)
                    since_commit = 0
            # commit(asynchronous=False) returns once the broker acknowledged it; when the last
            # record closed a batch of SERIAL_COMMIT_EVERY, that commit already was the last.
            if since_commit:
                consumer.commit(asynchronous=False)
            finished = time.time()
        finally:
            consumer.close()
        assert first_call is not None
        return Observation(
            started=started, first_call=first_call, finished=finished, log=recorder.log
        )


class RawContestant:
    name = "raw"
    description = "confluent-kafka consume(num_messages=500), no work, no commits: the ceiling"

    def unavailable(self) -> str | None:
        return None

    def unsupported(self, row: Row) -> str | None:
        if row.work.kind != "noop":
            return "raw does no work; it runs no-op rows only (the client's ceiling)"
        if row.batch_size != 1:
            return "raw has no batches: its figure is the row's without batch_size"
        return None

    def run(self, env: RunEnv, row: Row, topic: str, ends: dict[int, int]) -> Observation:
        expected = sum(ends.values())
        consumer = Consumer(base_consumer_config(env.bootstrap, new_group("raw")))
        recorder = LogRecorder(expected)
        first_call: float | None = None
        started = time.time()
        deadline = time.monotonic() + env.timeout
        try:
            consumer.subscribe([topic])
            while recorder.count < expected:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"raw {row.name}: only {recorder.count}/{expected} records")
                batch = consumer.consume(num_messages=500, timeout=1.0)
                if batch and first_call is None:
                    first_call = time.time()
                records = (
                    (m.partition() or 0, m.key(), m.offset() or 0) for m in batch if not m.error()
                )
                recorder.add(records, 0.0)
            finished = time.time()
        finally:
            consumer.close()
        assert first_call is not None
        return Observation(
            started=started,
            first_call=first_call,
            finished=finished,
            log=recorder.log,
            extra={"clock": "first to last record read; raw commits nothing"},
        )
