"""Metrics through the OpenTelemetry metrics API, named after the Java library's meters.

Two sources, both cheap by design:

- **Gauges** (and the totals the engine already counts) are *observable* instruments. Their
  callbacks run only when a reader collects, and every callback of one collection reads the
  same :class:`~parallel_consumer.status.Statistics` snapshot (:class:`_Snapshots`): one
  round trip to the controller thread per collection, nothing on the path of a record.
- **Counters** of records processed and failed are the engine's own per-partition totals
  (``Statistics.partition_totals``), read the same way: no hook runs per call for them. The
  rarer events (retries, dead letters, skips, commits) are counted by :class:`MetricsHooks`,
  the controller-side hooks, in plain dicts keyed by partition. **Histograms** and the slow
  records count come from the engine's sample of calls (``hooks.CallSampling``): at most one
  call per interval, plus every call longer than ``slow_after``.

Only the ``opentelemetry-api`` package is imported; the SDK is the user's choice.
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from parallel_consumer.context import RecordContext
from parallel_consumer.hooks import CallSampling, NoHooks
from parallel_consumer.offsets.encoding import OffsetEncoding
from parallel_consumer.status import Lifecycle, Statistics
from parallel_consumer.work.commit_tracker import CommitAnswer, OffsetCommit
from parallel_consumer.work.item import TopicPartition

__all__ = ["STATUS_VALUES", "MetricsHooks", "register_gauges"]

Attributes = dict[str, Any]
T = TypeVar("T")

#: ``pc.status``: the Java library's State values, so dashboards keep their value mappings.
STATUS_VALUES = {
    Lifecycle.NEW: 0,
    Lifecycle.RUNNING: 1,
    Lifecycle.PAUSED: 2,
    Lifecycle.DRAINING: 3,
    Lifecycle.CLOSING: 4,
    Lifecycle.CLOSED: 5,
}

#: Observable counters read from a Statistics field: (meter, field, description). A field this
#: version's Statistics lacks is skipped (``pc.deadline.exceeded`` needs issue #11's
#: ``Statistics.deadline_exceeded``, ``pc.partition.stalls`` its ``partition_stalls``).
_STATISTICS_COUNTERS = (
    ("pc.commits.sent", "commits_sent", "offset commits sent to the broker (per partition)"),
    ("pc.commit.failures", "commit_failures", "offset commits the broker did not acknowledge"),
    ("pc.stalls", "stalls", "times the engine found records waiting and nothing running"),
    ("pc.records.stale", "results_stale", "results dropped: their partition was revoked"),
    ("pc.deadline.exceeded", "deadline_exceeded", "handler calls past processing_timeout"),
    ("pc.partition.stalls", "partition_stalls", "stall episodes of single partitions"),
)

#: Observable counters per partition read from ``Statistics.partition_totals``.
_TOTALS_COUNTERS = (
    ("pc.processed.records", "succeeded", "records processed successfully"),
    ("pc.failed.records", "failed", "failed attempts of records"),
)


class _Snapshots(Generic[T]):
    """One snapshot (``statistics()``, ``health()``) per collection: a reader calls every
    observable callback in a row, so a snapshot younger than ``max_age`` seconds is reused.
    Thread-safe (readers collect on their own threads)."""

    def __init__(self, source: Callable[[], T], max_age: float = 0.5) -> None:
        self._source = source
        self._max_age = max_age
        self._lock = threading.Lock()
        self._taken_at = -max_age
        self._last: T | None = None
        #: Set once the consumer is closed: gauges report nothing any more.
        self.closed = False
        #: The snapshot taken at close: counters keep reporting their final totals.
        self._final: T | None = None

    def close(self) -> None:
        try:
            self._final = self._source()
        except Exception:
            self._final = self._last
        self.closed = True

    def get(self) -> T | None:
        """The snapshot for gauges (None once closed)."""
        if self.closed:
            return None
        return self._current()

    def totals(self) -> T | None:
        """The snapshot for counters: the final one once closed."""
        if self.closed:
            return self._final
        return self._current()

    def _current(self) -> T | None:
        with self._lock:
            now = time.monotonic()
            if self._last is None or now - self._taken_at > self._max_age:
                self._last = self._source()
                self._taken_at = now
            return self._last


def register_gauges(
    meter: Meter,
    source: Callable[[], Statistics],
    *,
    base: Attributes,
    max_metadata_bytes: int,
    health: Callable[[], Any] | None = None,
) -> list[_Snapshots[Any]]:
    """Create the observable instruments over ``source`` (``ParallelConsumer.statistics``)
    and, given ``health`` (``ParallelConsumer.health``, issue #11), ``pc.healthy`` and
    ``pc.partitions.stalled`` over its report (``healthy``, ``stalled_partitions``)."""
    snapshots = _Snapshots(source)
    partition_attributes: dict[TopicPartition, Attributes] = {}

    def attributes_of(topic: str, partition: int) -> Attributes:
        key = (topic, partition)
        found = partition_attributes.get(key)
        if found is None:
            found = partition_attributes[key] = {**base, "topic": topic, "partition": partition}
        return found

    def total(
        read: Callable[[Statistics], float | None], *, counter: bool = False
    ) -> Callable[..., Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            stats = snapshots.totals() if counter else snapshots.get()
            if stats is None:
                return []
            value = read(stats)
            return [] if value is None else [Observation(value, base)]

        return callback

    def per_partition(read: Callable[[Any], float | None]) -> Callable[..., Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            stats = snapshots.get()
            if stats is None:
                return []
            out = []
            for snapshot in stats.partitions:
                value = read(snapshot)
                if value is not None:
                    out.append(
                        Observation(value, attributes_of(snapshot.topic, snapshot.partition))
                    )
            return out

        return callback

    def paused(stats: Statistics) -> int:
        # The poller's count includes partitions it paused by itself while out of credit.
        return stats.paused_partitions if stats.poller is None else stats.poller.paused_partitions

    gauges: list[tuple[str, str, str, Callable[..., Iterable[Observation]]]] = [
        ("pc.status", "1", "lifecycle: 0 new, 1 running, 2 paused, 3 draining, 4 closing, "
         "5 closed", total(lambda s: STATUS_VALUES[s.lifecycle])),
        ("pc.partitions.number", "{partition}", "assigned partitions",
         total(lambda s: len(s.partitions))),
        ("pc.partitions.paused", "{partition}", "partitions paused in the Kafka client",
         total(paused)),
        ("pc.shards", "{shard}", "processing lanes (keys or partitions) with records",
         total(lambda s: s.shards)),
        ("pc.shards.size", "{record}", "records waiting in the shards",
         total(lambda s: s.waiting)),
        ("pc.incomplete.offsets.total", "{record}", "unfinished offsets over all partitions",
         total(lambda s: sum(p.incomplete for p in s.partitions))),
        ("pc.inflight.records", "{record}", "records handed to the runner",
         total(lambda s: s.in_flight)),
        ("pc.waiting.records", "{record}", "records waiting to be dispatched",
         total(lambda s: s.waiting)),
        ("pc.retry.waiting.records", "{record}", "records waiting for their retry delay",
         total(lambda s: s.retry_waiting)),
        ("pc.held.records", "{record}", "records held (bounded by max_buffered_records)",
         total(lambda s: s.held)),
        ("pc.partitions.blocked", "{partition}", "partitions blocked by their offset map's size",
         total(lambda s: s.blocked_partitions)),
        ("pc.partition.incomplete.offsets", "{record}", "unfinished offsets of the partition",
         per_partition(lambda p: p.incomplete)),
        ("pc.partition.highest.completed.offset", "{offset}", "highest succeeded offset",
         per_partition(lambda p: p.highest_succeeded)),
        ("pc.partition.highest.sequential.succeeded.offset", "{offset}",
         "highest offset below which everything succeeded",
         per_partition(lambda p: p.highest_sequential_succeeded)),
        ("pc.partition.highest.seen.offset", "{offset}", "highest offset polled",
         per_partition(lambda p: p.highest_seen)),
        ("pc.partition.latest.committed.offset", "{offset}",
         "last offset the broker acknowledged as committed",
         per_partition(lambda p: p.committed_offset)),
        ("pc.partition.assignment.epoch", "1", "assignment epoch of the partition",
         per_partition(lambda p: p.epoch)),
        ("pc.metadata.space.used", "1",
         "size of the partition's offset map / max_metadata_bytes (1.0 = the limit)",
         per_partition(lambda p: p.metadata_size / max_metadata_bytes)),
    ]  # fmt: skip
    for name, unit, description, callback in gauges:
        meter.create_observable_gauge(name, [callback], unit=unit, description=description)

    def totals(field: str) -> Callable[..., Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            stats = snapshots.totals()
            if stats is None:
                return []
            return [
                Observation(getattr(t, field), attributes_of(t.topic, t.partition))
                for t in stats.partition_totals
                if getattr(t, field)
            ]

        return callback

    for name, field, description in _TOTALS_COUNTERS:
        meter.create_observable_counter(
            name, [totals(field)], unit="{record}", description=description
        )
    fields = Statistics.__dataclass_fields__
    for name, field, description in _STATISTICS_COUNTERS:
        if field in fields:
            meter.create_observable_counter(
                name,
                [total(_field_reader(field), counter=True)],
                unit="1",
                description=description,
            )
    if health is None:
        return [snapshots]
    reports: _Snapshots[Any] = _Snapshots(health)

    def from_health(read: Callable[[Any], float]) -> Callable[..., Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            report = reports.get()
            return [] if report is None else [Observation(read(report), base)]

        return callback

    meter.create_observable_gauge(
        "pc.healthy",
        [from_health(lambda r: int(bool(r.healthy)))],
        unit="1",
        description="1 while health() says healthy, else 0",
    )
    meter.create_observable_gauge(
        "pc.partitions.stalled",
        [from_health(lambda r: len(r.stalled_partitions))],
        unit="{partition}",
        description="partitions in a stall episode (health().stalled_partitions)",
    )
    return [snapshots, reports]


def _field_reader(field: str) -> Callable[[Statistics], float | None]:
    def read(stats: Statistics) -> float | None:
        value: float | None = getattr(stats, field)
        return value

    return read


def encoding_of(metadata: str) -> OffsetEncoding | None:
    """The encoding of an offset map from its first base64 quantum (None: no map)."""
    if len(metadata) < 4:
        return None
    try:
        magic = base64.b64decode(metadata[:4])[0]
    except (binascii.Error, IndexError):
        return None
    return OffsetEncoding.from_magic(magic)


class _Sampler:
    """Lets a histogram take at most one sample per ``interval`` seconds (None: every one).

    An SDK histogram ``record()`` costs tens of microseconds, as much as the engine spends on a
    record: recorded for every call it would double the per-record cost of a fast handler. A
    sample every 10 ms (at most 100 a second, whatever the throughput) keeps the percentiles
    right and the cost flat; exact counts come from the counters."""

    __slots__ = ("_interval", "_next")

    def __init__(self, interval: float | None) -> None:
        self._interval = interval
        self._next = 0.0

    def due(self, now: float) -> bool:
        interval = self._interval
        if interval is None:
            return True
        if now < self._next:
            return False
        self._next = now + interval
        return True


class MetricsHooks(NoHooks):
    """Controller-side hooks behind the counters and histograms. Owned by the controller
    thread: every ``on_*`` method runs on it.

    Counts are plain integers in dicts keyed by partition (an increment costs a fraction of a
    microsecond) and reach OpenTelemetry through observable counters, read when a reader
    collects; histograms take sampled values (see :class:`_Sampler`). Readers copy the dicts
    on their own thread: ``dict.copy()`` runs without releasing the GIL, so it never sees a
    dict half-changed.

    ``on_retry``, ``on_dead_letter`` and ``on_skip`` are the record-fate hooks of issue #11:
    they count as soon as the engine calls them (nothing calls them before that work is merged).
    """

    def __init__(
        self,
        meter: Meter,
        *,
        base: Attributes,
        slow_after: float,
        sample_interval: float | None = 0.01,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._base = base
        self._slow_after = slow_after
        self._wall_clock = wall_clock
        self._monotonic = monotonic
        self._attributes_by_key: dict[Any, Attributes] = {}
        self.sample_interval = sample_interval
        self._commits_sent: dict[tuple[TopicPartition, int, int], float] = {}
        self._commit_sampler = _Sampler(sample_interval)
        # -- counts: key -> running total (key: a partition, (partition, reason), an encoding)
        self.slow: dict[TopicPartition, int] = {}
        self.retries: dict[TopicPartition, int] = {}
        self.dead_lettered: dict[tuple[TopicPartition, str], int] = {}
        self.skipped: dict[tuple[TopicPartition, str], int] = {}
        self.commit_failures: dict[TopicPartition, int] = {}
        self.encodings: dict[str, int] = {}
        counters: list[tuple[str, str, str, dict[Any, int]]] = [
            ("pc.slow.records", "{record}", "records of handler calls longer than slow_after",
             self.slow),
            ("pc.retries", "{record}", "failed attempts that will run again", self.retries),
            ("pc.dead.lettered.records", "{record}", "records sent to the dead-letter topic",
             self.dead_lettered),
            ("pc.skipped.records", "{record}", "records given up on without a dead letter",
             self.skipped),
            ("pc.partition.commit.failures", "{commit}",
             "offset commits of the partition the broker did not acknowledge",
             self.commit_failures),
            ("pc.offsets.encoding.usage", "{commit}", "offset maps committed, by encoding",
             self.encodings),
        ]  # fmt: skip
        for name, unit, description, counts in counters:
            meter.create_observable_counter(
                name, [self._observe(counts)], unit=unit, description=description
            )
        self.processing_time = meter.create_histogram(
            "pc.user.function.processing.time",
            unit="s",
            description="duration of handler calls, dispatch to end (sampled)",
        )
        self.end_to_end = meter.create_histogram(
            "pc.end.to.end.latency",
            unit="s",
            description="record timestamp to the end of its successful handler call (sampled)",
        )
        self.commit_latency = meter.create_histogram(
            "pc.commit.latency", unit="s", description="offset commit sent to its answer (sampled)"
        )

    def _attributes(self, key: Any) -> Attributes:
        """The attributes of a count's key (built once per key)."""
        found = self._attributes_by_key.get(key)
        if found is None:
            if isinstance(key, str):
                found = {**self._base, "encoding": key}
            elif isinstance(key[0], tuple):  # (partition, reason)
                (topic, partition), reason = key
                found = {**self._base, "topic": topic, "partition": partition, "reason": reason}
            else:
                found = {**self._base, "topic": key[0], "partition": key[1]}
            self._attributes_by_key[key] = found
        return found

    def _observe(self, counts: dict[Any, int]) -> Callable[..., Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(n, self._attributes(k)) for k, n in counts.copy().items()]

        return callback

    # -- handler calls (the engine's sample: hooks.CallSampling) --

    def sampling(self) -> CallSampling:
        """What the engine calls instead of a hook per call."""
        return CallSampling(self.sample_interval, self._slow_after, self.sample_call)

    def sample_call(
        self,
        records: Sequence[Any],
        errors: Sequence[BaseException | None],
        duration: float,
        periodic: bool,
    ) -> None:
        """A call the engine sampled: ``periodic`` (at most one per ``sample_interval``) feeds
        the histograms; a call longer than ``slow_after`` (always sampled) counts its records
        as slow."""
        if duration > self._slow_after:
            slow = self.slow
            for message in records:
                tp = (message.topic(), message.partition())
                slow[tp] = slow.get(tp, 0) + 1
        if not periodic:
            return
        self.processing_time.record(duration, self._base)
        for message, error in zip(records, errors, strict=False):
            if error is None:
                kind, millis = message.timestamp()
                if kind != 0 and millis is not None and millis >= 0:
                    tp = (message.topic(), message.partition())
                    latency = max(0.0, self._wall_clock() - millis / 1000)
                    self.end_to_end.record(latency, self._attributes(tp))
                break

    # -- record fates (issue #11's hooks) --

    def on_retry(self, record: RecordContext, error: BaseException, delay: float) -> None:
        tp = (record.topic, record.partition)
        self.retries[tp] = self.retries.get(tp, 0) + 1

    def on_dead_letter(
        self, record: RecordContext, error: BaseException | None, reason: str
    ) -> None:
        key = ((record.topic, record.partition), reason)
        self.dead_lettered[key] = self.dead_lettered.get(key, 0) + 1

    def on_skip(self, record: RecordContext, error: BaseException | None, reason: str) -> None:
        key = ((record.topic, record.partition), reason)
        self.skipped[key] = self.skipped.get(key, 0) + 1

    # -- commits --

    def on_commit_sent(self, commits: Sequence[OffsetCommit]) -> None:
        now = self._monotonic()
        encodings = self.encodings
        for commit in commits:
            self._commits_sent.setdefault((commit.tp, commit.epoch, commit.offset), now)
            encoding = encoding_of(commit.metadata)
            if encoding is not None:
                encodings[encoding.name] = encodings.get(encoding.name, 0) + 1

    def on_commit(self, answers: Sequence[CommitAnswer]) -> None:
        now = self._monotonic()
        for answer in answers:
            commit = answer.commit
            sent = self._commits_sent.pop((commit.tp, commit.epoch, commit.offset), None)
            if sent is not None and self._commit_sampler.due(now):
                self.commit_latency.record(now - sent, self._base)
            if answer.error is not None:
                failures = self.commit_failures
                failures[commit.tp] = failures.get(commit.tp, 0) + 1

    def on_rebalance(self, kind: str, partitions: Sequence[TopicPartition]) -> None:
        if kind != "lost":
            return  # (a revoke's final commit is answered after this hook: keep its entry)
        gone = set(partitions)
        for key in [k for k in self._commits_sent if k[0] in gone]:
            del self._commits_sent[key]
