"""One latency run of each Python contestant: the same client settings and work as its
throughput contestant (``bench/contestants``), plus what latency needs: the time each handler
call returned, when each commit was acknowledged (observed the best way the contestant allows;
:attr:`Driver.commit_clock` says how, and how precisely), a *ready* signal once the handler ran
for the first time, and a *stop* signal after which the run ends whatever is left.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from parallel_consumer.bench.contestants import CONTESTANTS
from parallel_consumer.bench.kafka_io import base_consumer_config, new_group
from parallel_consumer.bench.latency.load import LoadSpec
from parallel_consumer.bench.model import DataSet, Row, Work
from parallel_consumer.bench.work import sync_work

__all__ = ["DRIVERS", "CommitWatcher", "Driver", "Job", "Trace", "row_of"]

Key = tuple[int, int]


def row_of(spec: LoadSpec) -> Row:
    """L1 as a pc-bench row, so that the contestants' own option builders apply unchanged."""
    return Row(
        workload="L1",
        label=f"KEY zipf-{spec.zipf_s:g} {spec.keys} keys C={spec.concurrency}",
        data=DataSet(records=0, partitions=spec.partitions, keys=spec.keys),
        ordering="KEY",
        concurrency=spec.concurrency,
        work=Work("sleep", spec.work_ms),
        commit_interval=spec.commit_interval,
    )


@dataclass(frozen=True)
class Job:
    bootstrap: str
    topic: str
    spec: LoadSpec
    #: Each partition's end offset once the producer is done (the primers included).
    ends: Mapping[int, int]
    #: Set by the driver when its handler returned for the first time.
    ready: threading.Event
    #: Set by the session when the run must end (records may be left).
    stop: threading.Event

    @property
    def expected(self) -> int:
        return sum(self.ends.values())


@dataclass
class Trace:
    """What a run saw. ``done``: ``(partition, offset, epoch)`` per handler return; ``commits``:
    ``(epoch, partition, committed offset)`` per acknowledged offset commit; ``acks``: per-record
    acknowledgements instead (share groups commit no offsets)."""

    done: list[tuple[int, int, float]] = field(default_factory=list)
    commits: list[tuple[float, int, int]] = field(default_factory=list)
    acks: dict[Key, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def first_done(self) -> dict[Key, float]:
        out: dict[Key, float] = {}
        for partition, offset, t in self.done:
            out.setdefault((partition, offset), t)
        return out


class Driver(Protocol):
    name: str
    #: How the commit acknowledgement is observed, and how precisely.
    commit_clock: str
    #: What differs from the other contestants on this workload (or "").
    note: str

    def run(self, job: Job) -> Trace: ...


def reached(commits: Sequence[tuple[float, int, int]], ends: Mapping[int, int]) -> bool:
    top: dict[int, int] = {}
    for _, partition, offset in commits:
        top[partition] = max(top.get(partition, -1), offset)
    return all(top.get(p, -1) >= end for p, end in ends.items() if end > 0)


class CommitWatcher:
    """Polls a group's committed offsets (OffsetFetch) every ``interval`` seconds on a thread
    of its own and logs each change with the time it was seen."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: Sequence[int]) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.commits: list[tuple[float, int, int]] = []
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        self._wanted = [TopicPartition(topic, p) for p in partitions]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="bench-commit-watch", daemon=True)

    INTERVAL = 0.005

    def start(self) -> CommitWatcher:
        self._thread.start()
        return self

    def _watch(self) -> None:
        last: dict[int, int] = {}
        while not self._stop.is_set():
            try:
                answer = self._consumer.committed(self._wanted, timeout=10)
            except Exception:
                continue
            now = time.time()
            for tp in answer:
                if tp.offset >= 0 and last.get(tp.partition) != tp.offset:
                    last[tp.partition] = tp.offset
                    self.commits.append((now, tp.partition, tp.offset))
            self._stop.wait(self.INTERVAL)

    def stop(self) -> list[tuple[float, int, int]]:
        self._stop.set()
        self._thread.join(30)
        self._consumer.close()
        return self.commits


def _wait_until_complete(job: Job, trace: Trace) -> None:
    while not job.stop.is_set():
        if len(trace.done) >= job.expected and reached(trace.commits, job.ends):
            return
        job.stop.wait(0.01)


class PcDriver:
    name = "pc"
    commit_clock = (
        "the library's Hooks.on_commit (called on the controller thread when the broker's "
        "answer is processed): exact to a controller turn"
    )
    note = ""

    def run(self, job: Job) -> Trace:
        from parallel_consumer import NoHooks, ParallelConsumer
        from parallel_consumer.bench.contestants.pc import ParallelConsumerContestant

        trace = Trace()
        done = trace.done
        commits = trace.commits

        class CommitLog(NoHooks):
            def on_commit(self, answers: Any) -> None:
                now = time.time()
                for answer in answers:
                    if answer.error is None:
                        commits.append((now, answer.commit.tp[1], answer.commit.offset))

        work = sync_work(Work("sleep", job.spec.work_ms))
        ready = job.ready

        def handle(ctx: Any) -> None:
            work()
            now = time.time()
            for r in ctx.records:
                done.append((r.partition, r.offset, now))
            ready.set()

        options = ParallelConsumerContestant().options(row_of(job.spec))
        pc = ParallelConsumer(
            base_consumer_config(job.bootstrap, new_group("pc-l1")), options, hooks=CommitLog()
        )
        try:
            pc.subscribe([job.topic])
            pc.poll(handle)
            _wait_until_complete(job, trace)
        finally:
            pc.close()
        return trace


class SerialDriver:
    name = "serial"
    commit_clock = (
        "commit(asynchronous=False) returns once the broker acknowledged: exact; on L1 the loop "
        "commits every commit interval (0.1 s) instead of every 1,000 records"
    )
    note = "one record at a time"

    def run(self, job: Job) -> Trace:
        from confluent_kafka import Consumer, KafkaException

        trace = Trace()
        work = sync_work(Work("sleep", job.spec.work_ms))
        consumer = Consumer(base_consumer_config(job.bootstrap, new_group("serial-l1")))
        interval = job.spec.commit_interval
        last_commit = time.monotonic()
        pending = False
        try:
            consumer.subscribe([job.topic])
            while not job.stop.is_set():
                message = consumer.poll(0.02)
                if message is not None and not message.error():
                    work()
                    trace.done.append(
                        (message.partition() or 0, message.offset() or 0, time.time())
                    )
                    job.ready.set()
                    pending = True
                if pending and time.monotonic() - last_commit >= interval:
                    try:
                        answer = consumer.commit(asynchronous=False)
                    except KafkaException:
                        answer = None
                    now = time.time()
                    last_commit = time.monotonic()
                    pending = False
                    for tp in answer or []:
                        if tp.offset >= 0 and not tp.error:
                            trace.commits.append((now, tp.partition, tp.offset))
                complete = not pending and len(trace.done) >= job.expected
                if complete and reached(trace.commits, job.ends):
                    break
        finally:
            consumer.close()
        return trace


class RawDriver:
    name = "raw"
    commit_clock = "raw commits nothing"
    note = (
        "no work, no commits: produced -> poll() returned, the client path's floor (not a peer "
        "in the goals)"
    )

    def run(self, job: Job) -> Trace:
        from confluent_kafka import Consumer

        trace = Trace()
        consumer = Consumer(base_consumer_config(job.bootstrap, new_group("raw-l1")))
        try:
            consumer.subscribe([job.topic])
            while not job.stop.is_set() and len(trace.done) < job.expected:
                message = consumer.poll(0.02)
                if message is not None and not message.error():
                    seen = time.time()
                    trace.done.append((message.partition() or 0, message.offset() or 0, seen))
                    job.ready.set()
        finally:
            consumer.close()
        return trace


class PyrallelDriver:
    name = "pyrallel"
    commit_clock = (
        "the group's committed offsets polled (OffsetFetch) every 5 ms from a thread in the same "
        "process: late by at most 5 ms plus one round trip"
    )
    note = "asyncio execution mode, max_in_flight = C, KEY_HASH order"

    def run(self, job: Job) -> Trace:
        from pyrallel_consumer import PyrallelConsumer

        from parallel_consumer.bench.contestants.pyrallel import pyrallel_config

        trace = Trace()
        seconds = job.spec.work_ms / 1000
        group = new_group("pyrallel-l1")

        async def worker(item: Any) -> None:
            await asyncio.sleep(seconds)
            trace.done.append((item.tp.partition, item.offset, time.time()))
            job.ready.set()

        config = pyrallel_config(job.bootstrap, group, row_of(job.spec))
        watcher = CommitWatcher(job.bootstrap, group, job.topic, list(job.ends)).start()
        trace.commits = watcher.commits

        async def main() -> None:
            consumer = PyrallelConsumer(config, worker, job.topic)
            await consumer.start()
            try:
                while not job.stop.is_set():
                    if len(trace.done) >= job.expected and reached(trace.commits, job.ends):
                        return
                    await asyncio.sleep(0.01)
            finally:
                await consumer.stop()

        logging.getLogger("pyrallel_consumer").setLevel(logging.ERROR)
        try:
            asyncio.run(main())
        finally:
            watcher.stop()
            gc.collect()  # its producer, while the broker is up (see contestants/pyrallel.py)
        return trace


class ShareDriver:
    name = "share"
    commit_clock = (
        "the share consumer's acknowledgement-commit callback (commit_async after each poll's "
        "acknowledgements; the callback runs inside a later poll): late by at most one poll"
    )
    note = "share groups keep no order: UNORDERED, not KEY"

    def run(self, job: Job) -> Trace:
        import confluent_kafka

        from parallel_consumer.bench.contestants.share import set_earliest

        trace = Trace(acks={})
        acks = trace.acks
        assert acks is not None
        group = new_group("share-l1")
        set_earliest(job.bootstrap, group)
        work = sync_work(Work("sleep", job.spec.work_ms))

        def handle(message: Any) -> tuple[int, int, float]:
            work()
            return message.partition(), message.offset(), time.time()

        def acknowledged(offsets: Any, error: Any) -> None:
            if error is not None:
                return
            now = time.time()
            for tp, done_offsets in offsets.items():
                for offset in done_offsets:
                    acks.setdefault((tp.partition, offset), now)

        consumer = confluent_kafka.ShareConsumer(
            {
                "bootstrap.servers": job.bootstrap,
                "group.id": group,
                "share.acknowledgement.mode": "explicit",
                "log_level": 3,
            }
        )
        consumer.set_acknowledgement_commit_callback(acknowledged)
        expected = job.expected
        try:
            consumer.subscribe([job.topic])
            with ThreadPoolExecutor(job.spec.concurrency, thread_name_prefix="bench-share") as pool:
                while not job.stop.is_set() and len(acks) < expected:
                    messages = [m for m in consumer.poll(0.05) if not m.error()]
                    if not messages:
                        continue
                    for message, entry in zip(messages, pool.map(handle, messages), strict=True):
                        trace.done.append(entry)
                        job.ready.set()
                        consumer.acknowledge(message)
                    consumer.commit_async()
                if not job.stop.is_set():
                    consumer.commit_sync(30)
        finally:
            consumer.close()
        return trace


#: The contestants L1 runs, in table order (pc first).
DRIVERS: dict[str, Driver] = {
    d.name: d for d in (PcDriver(), SerialDriver(), PyrallelDriver(), ShareDriver(), RawDriver())
}


def unavailable(name: str) -> str | None:
    """Why a contestant cannot run here (its throughput contestant's reason), or None."""
    return CONTESTANTS[name].unavailable()
