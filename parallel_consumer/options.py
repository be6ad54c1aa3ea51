"""Options: one frozen, keyword-only settings object, validated once at construction.

Everything inside the engine trusts an :class:`Options` instance; nothing re-checks it.
"""

from __future__ import annotations

import enum
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from parallel_consumer._failure_options import OnExhausted, checked_failure_settings
from parallel_consumer.errors import ConfigurationError

if TYPE_CHECKING:
    import asyncio

    from parallel_consumer.context import RecordContext

__all__ = [
    "CommitMode",
    "GroupProtocol",
    "InvalidMetadataPolicy",
    "OnExhausted",
    "Options",
    "ProcessingOrder",
    "RunnerKind",
    "StallPolicy",
]

Duration = float | int | timedelta


class ProcessingOrder(enum.Enum):
    """Which records may be processed at the same time.

    - ``KEY``: at most one record per (topic, partition, key) in flight, in offset order.
    - ``PARTITION``: at most one record per partition in flight, in offset order.
    - ``UNORDERED``: any record may run at any time; only the committed offset is ordered.
    """

    KEY = "key"
    PARTITION = "partition"
    UNORDERED = "unordered"


class CommitMode(enum.Enum):
    """How offsets (and the offset map in their metadata) are committed."""

    #: The poller sends ``commit(asynchronous=True)``; a partition is clean only once the
    #: broker's acknowledgement arrives in the commit callback.
    PERIODIC_CONSUMER_ASYNC = "periodic_consumer_async"
    #: The poller blocks on ``commit(asynchronous=False)``; the result is known at once.
    PERIODIC_CONSUMER_SYNC = "periodic_consumer_sync"
    #: Exactly-once for ``poll_and_produce``: outputs and input offsets (with the offset map)
    #: commit atomically in the library's producer's transaction, every ``commit_interval``
    #: (0.1 s by default in this mode). Needs ``transactional.id`` in ``producer_config``.
    PERIODIC_TRANSACTIONAL_PRODUCER = "periodic_transactional_producer"


class GroupProtocol(enum.Enum):
    """Which kind of Kafka group the instance joins (docs/share-groups.md)."""

    #: A consumer group: partitions are assigned to members; offsets (and the offset map)
    #: are committed.
    CONSUMER = "consumer"
    #: A share group (KIP-932, Apache Kafka 4.2+): every member reads every partition; each
    #: record is acknowledged on its own (accept or release). ``UNORDERED`` only.
    SHARE = "share"


class RunnerKind(enum.Enum):
    """Where handler calls run (``Options.runner``; strings ``"thread"``/``"threads"``,
    ``"async"``/``"asyncio"`` and ``"process"``/``"processes"`` work too).

    Unset (``None``, the default), the handler picks: ``ASYNCIO`` for an ``async def``
    handler, else ``THREADS``. See docs/runners.md.
    """

    #: A pool of ``max_concurrency`` worker threads calling a plain function.
    THREADS = "threads"
    #: ``async def`` handlers as up to ``max_concurrency`` tasks on one event loop in its own
    #: thread (``<name>-aio-loop``).
    ASYNCIO = "asyncio"
    #: A plain, picklable handler in ``Options.processes`` worker processes (CPU-bound work).
    PROCESS = "process"


_RUNNER_ALIASES = {
    "thread": RunnerKind.THREADS,
    "threads": RunnerKind.THREADS,
    "async": RunnerKind.ASYNCIO,
    "asyncio": RunnerKind.ASYNCIO,
    "process": RunnerKind.PROCESS,
    "processes": RunnerKind.PROCESS,
}


class InvalidMetadataPolicy(enum.Enum):
    """What to do when a committed offset carries metadata this library cannot decode."""

    #: Log an error naming the partition and offset, and replay from the committed offset.
    REPLAY = "replay"
    #: Stop the consumer with an :class:`~parallel_consumer.errors.InternalError`.
    FAIL = "fail"


class StallPolicy(enum.Enum):
    """What to do when a partition made no progress for ``Options.stall_threshold`` (see
    docs/health.md)."""

    #: Log a warning once per episode and call ``Hooks.on_partition_stall``.
    WARN = "warn"
    #: Warn, then fail the record holding the partition (its lowest unfinished offset) through
    #: the normal failure path, as if its call had passed its deadline.
    DEAD_LETTER = "dead_letter"
    #: Warn, then stop the consumer with a :class:`~parallel_consumer.errors.PartitionStalled`
    #: failure.
    STOP = "stop"


def _seconds(name: str, value: object, *, allow_zero: bool = True) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfigurationError(
            f"Options.{name} must be seconds (int or float) or a timedelta, got {value!r}"
        )
    if (
        math.isnan(seconds)
        or math.isinf(seconds)
        or seconds < 0
        or (seconds == 0 and not allow_zero)
    ):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(f"Options.{name} must be finite and {bound}, got {value!r}")
    return seconds


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"Options.{name} must be an int >= 1, got {value!r}")
    return value


def _member(name: str, enum_type: type[enum.Enum], value: object) -> Any:
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        for member in enum_type:
            if value.lower() in (member.name.lower(), str(member.value).lower()):
                return member
    choices = ", ".join(f"{enum_type.__name__}.{m.name}" for m in enum_type)
    raise ConfigurationError(f"Options.{name} must be one of {choices}; got {value!r}")


def _check_share_settings(ordering: ProcessingOrder, commit_mode: CommitMode) -> None:
    if ordering is not ProcessingOrder.UNORDERED:
        raise ConfigurationError(
            f"Options.ordering={ordering.value!r} cannot hold on a share group: the broker hands "
            "the records of one partition to any member, in any order, and redelivers released "
            "ones later; set ordering='unordered' (or use a consumer group for KEY/PARTITION "
            "order)"
        )
    if commit_mode is CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER:
        raise ConfigurationError(
            "Options.commit_mode=PERIODIC_TRANSACTIONAL_PRODUCER needs a consumer group: a share "
            "group's acknowledgements cannot join a producer transaction (KIP-932 has no "
            "exactly-once); use the default commit_mode with group_protocol='share'"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Options:
    """Settings of a :class:`~parallel_consumer.ParallelConsumer`.

    Durations accept seconds (``int``/``float``) or :class:`~datetime.timedelta` and are stored
    as float seconds. Enum settings also accept their names as strings (``ordering="key"``).
    """

    #: Which records may run concurrently (see :class:`ProcessingOrder`).
    ordering: ProcessingOrder = ProcessingOrder.KEY
    #: How many handler calls may run at once (worker threads of the thread runner).
    max_concurrency: int = 16
    #: Where handler calls run (see :class:`RunnerKind`); ``None`` lets the handler pick:
    #: ``ASYNCIO`` for an ``async def`` handler, ``THREADS`` for a plain function.
    runner: RunnerKind | None = None
    #: Worker processes of ``runner="process"`` (``None``: ``os.cpu_count()``); each runs one
    #: call at a time. Only valid with ``runner="process"``.
    processes: int | None = None
    #: Makes the event loop of the asyncio runner (``None``: ``asyncio.new_event_loop``), as
    #: ``asyncio.Runner(loop_factory=...)`` does; e.g. ``uvloop.new_event_loop`` for a faster
    #: loop. Only for ``async def`` handlers (docs/async-handlers.md#the-event-loop).
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    #: Records per handler call; the handler receives a PollContext of up to this many records.
    batch_size: int = 1
    commit_mode: CommitMode = CommitMode.PERIODIC_CONSUMER_ASYNC
    #: A consumer group (default) or a share group (``"share"``, see docs/share-groups.md).
    group_protocol: GroupProtocol = GroupProtocol.CONSUMER
    #: Time between commits of the offsets (and offset maps) of changed partitions. ``None``
    #: picks 5 s, or 0.1 s in the transactional mode (a transaction stays open that long,
    #: and ``read_committed`` readers see its outputs only once it commits).
    commit_interval: float | None = None
    #: Delay before a failed record is retried, unless ``retry_delay_provider`` or
    #: ``Retry(delay=...)`` says otherwise.
    retry_delay: float = 1.0
    #: Called with the failed record's RecordContext (attempts already counted); returns the
    #: delay before the next attempt, as seconds or a timedelta.
    retry_delay_provider: Callable[[RecordContext], Duration] | None = None
    #: Failed retries allowed after the first failed attempt; ``None`` (default) retries forever,
    #: as the Java library does; ``0`` gives up at the first failure. A record's handler runs
    #: at most ``max_retries + 1`` times before ``on_retries_exhausted`` applies.
    max_retries: int | None = None
    #: What to do with a record once its retries are exhausted (see :class:`OnExhausted`).
    on_retries_exhausted: OnExhausted = OnExhausted.DEAD_LETTER
    #: Optional: called (on the controller thread) with the RecordContext and the last error of
    #: a record whose retries are exhausted; it may return an :class:`OnExhausted` for this
    #: record, or None to apply ``on_retries_exhausted``. If it raises, the error is logged and
    #: ``on_retries_exhausted`` applies.
    retries_exhausted_callback: (
        Callable[[RecordContext, BaseException], OnExhausted | None] | None
    ) = None
    #: Exception types that are not retried: a failure with one of them (or a subclass) goes
    #: straight to ``on_retries_exhausted``.
    non_retryable: tuple[type[BaseException], ...] = ()
    #: The dead-letter topic of every input topic; ``None`` means ``<topic>.dlq`` per input
    #: topic. Setting it turns dead-lettering on (see :attr:`dead_lettering`).
    dead_letter_topic: str | None = None
    #: Deserialize each record's key / value before the handler sees it: a callable
    #: ``(bytes, SerializationContext) -> object``, such as confluent-kafka's
    #: ``StringDeserializer()`` or a Schema Registry ``AvroDeserializer``. The handler reads
    #: the result as ``ctx.key`` / ``ctx.value`` (the bytes stay in ``raw_key`` / ``raw_value``);
    #: a record that fails to deserialize is never retried (docs/serialization.md).
    key_deserializer: Callable[[Any, Any], Any] | None = None
    value_deserializer: Callable[[Any, Any], Any] | None = None
    #: Serialize the key / value of each ``poll_and_produce`` output that is not bytes or str
    #: (``(object, SerializationContext) -> bytes``, such as confluent-kafka's serializers).
    key_serializer: Callable[[Any, Any], Any] | None = None
    value_serializer: Callable[[Any, Any], Any] | None = None
    #: Upper bound on records held by the engine (buffered awaiting processing + in flight).
    #: ``None`` picks ``max(10_000, 4 * max_concurrency * batch_size)``.
    max_buffered_records: int | None = None
    #: The broker's ``offset.metadata.max.bytes``; offset maps larger than this are not sent
    #: inline (they spill, see :attr:`spill_offset_maps`).
    max_metadata_bytes: int = 4096
    #: Offset maps over ``max_metadata_bytes`` go to a compacted side topic and the commit
    #: carries a reference to them; ``False``: such a partition runs only its unfinished records
    #: until its map fits again (as the Java library does). See docs/offset-metadata.md.
    spill_offset_maps: bool = True
    #: The side topic of spilled maps; ``None`` means ``<group.id>.pc-offsets``. Created
    #: (1 partition, ``cleanup.policy=compact``) on the first spill if it does not exist.
    offset_map_topic: str | None = None
    #: How long ``close()`` waits, by default, for buffered work (``drain=True``) and in-flight
    #: handler calls before it gives up on them; ``close(timeout=...)`` overrides it per call.
    shutdown_timeout: float = 30.0
    #: What to do with committed metadata that cannot be decoded (see InvalidMetadataPolicy).
    invalid_metadata_policy: InvalidMetadataPolicy = InvalidMetadataPolicy.REPLAY
    #: Most records the poller takes from the client per ``consume()`` call.
    fetch_batch_size: int = 500
    #: Longest a handler call may run before its records fail with ``DeadlineExceeded`` and are
    #: retried (``None``: no deadline). A handler extends it with ``ctx.extend_deadline()``.
    #: See docs/deadlines.md for what each runner does with a call past its deadline.
    processing_timeout: float | None = None
    #: A partition whose lowest unfinished record has held it, and whose committed offset has
    #: not moved, for this long counts as stalled (``None``: never). See docs/health.md.
    stall_threshold: float | None = 60.0
    #: What to do about a stalled partition (see :class:`StallPolicy`).
    on_stall: StallPolicy = StallPolicy.WARN
    #: Prefix of the instance's thread names (``<name>-<n>-controller``, ``-poller``,
    #: ``-worker-<i>``, ``-aio-loop``, ``-proc-pool``; ``n`` counts instances in the process).
    name: str = field(default="pc")

    def __post_init__(self) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "ordering", _member("ordering", ProcessingOrder, self.ordering))
        setattr_(self, "commit_mode", _member("commit_mode", CommitMode, self.commit_mode))
        setattr_(
            self, "group_protocol", _member("group_protocol", GroupProtocol, self.group_protocol)
        )
        if self.group_protocol is GroupProtocol.SHARE:
            _check_share_settings(self.ordering, self.commit_mode)
        if self.runner is not None:
            runner = self.runner
            if isinstance(runner, str):
                runner = _RUNNER_ALIASES.get(runner.lower(), runner)
            setattr_(self, "runner", _member("runner", RunnerKind, runner))
        if self.runner is RunnerKind.PROCESS:
            if self.processes is None:
                setattr_(self, "processes", os.cpu_count() or 1)
            _positive_int("processes", self.processes)
        elif self.processes is not None:
            raise ConfigurationError(
                f"Options.processes={self.processes!r} only applies to runner='process' "
                f"(runner is {self.runner!r}); remove it or set runner='process'"
            )
        if self.loop_factory is not None:
            if not callable(self.loop_factory):
                raise ConfigurationError(
                    "Options.loop_factory must be a callable returning an asyncio event loop "
                    f"(such as uvloop.new_event_loop), got {self.loop_factory!r}"
                )
            if self.runner is RunnerKind.THREADS or self.runner is RunnerKind.PROCESS:
                raise ConfigurationError(
                    f"Options.loop_factory only applies to async def handlers (the asyncio "
                    f"runner); runner is {self.runner!r}: remove loop_factory or the runner"
                )
        setattr_(
            self,
            "invalid_metadata_policy",
            _member("invalid_metadata_policy", InvalidMetadataPolicy, self.invalid_metadata_policy),
        )
        _positive_int("max_concurrency", self.max_concurrency)
        _positive_int("batch_size", self.batch_size)
        _positive_int("fetch_batch_size", self.fetch_batch_size)
        if self.commit_interval is None:
            transactional = self.commit_mode is CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER
            setattr_(self, "commit_interval", 0.1 if transactional else 5.0)
        setattr_(
            self,
            "commit_interval",
            _seconds("commit_interval", self.commit_interval, allow_zero=False),
        )
        setattr_(self, "retry_delay", _seconds("retry_delay", self.retry_delay))
        setattr_(self, "shutdown_timeout", _seconds("shutdown_timeout", self.shutdown_timeout))
        for name, off in (("processing_timeout", "deadline"), ("stall_threshold", "detection")):
            value = getattr(self, name)
            if value is not None:
                try:
                    setattr_(self, name, _seconds(name, value, allow_zero=False))
                except ConfigurationError as exc:
                    raise ConfigurationError(f"{exc} (None for no {off})") from None
        setattr_(self, "on_stall", _member("on_stall", StallPolicy, self.on_stall))
        if self.retry_delay_provider is not None and not callable(self.retry_delay_provider):
            raise ConfigurationError(
                "Options.retry_delay_provider must be a callable taking a RecordContext, "
                f"got {self.retry_delay_provider!r}"
            )
        for codec in (
            "key_deserializer",
            "value_deserializer",
            "key_serializer",
            "value_serializer",
        ):
            value = getattr(self, codec)
            if isinstance(value, type):
                raise ConfigurationError(
                    f"Options.{codec} is the class {value.__name__}: pass an instance, "
                    f"{value.__name__}(...)"
                )
            if value is not None and not callable(value):
                raise ConfigurationError(
                    f"Options.{codec} must be a callable (data, SerializationContext) -> object, "
                    f"such as confluent_kafka.serialization.StringDeserializer(); got {value!r}"
                )
        policy, non_retryable = checked_failure_settings(
            max_retries=self.max_retries,
            on_retries_exhausted=self.on_retries_exhausted,
            retries_exhausted_callback=self.retries_exhausted_callback,
            non_retryable=self.non_retryable,
            dead_letter_topic=self.dead_letter_topic,
        )
        setattr_(self, "on_retries_exhausted", policy)
        setattr_(self, "non_retryable", non_retryable)
        in_flight = self.max_concurrency * self.batch_size
        if self.max_buffered_records is None:
            setattr_(self, "max_buffered_records", max(10_000, 4 * in_flight))
        else:
            _positive_int("max_buffered_records", self.max_buffered_records)
            if self.max_buffered_records < 2 * in_flight:
                raise ConfigurationError(
                    f"Options.max_buffered_records={self.max_buffered_records} must be at least "
                    f"2 * max_concurrency * batch_size = {2 * in_flight}, so that records can "
                    "wait while others run; raise it or lower max_concurrency"
                )
        if not isinstance(self.max_metadata_bytes, int) or self.max_metadata_bytes < 16:
            raise ConfigurationError(
                "Options.max_metadata_bytes must be an int >= 16 (the broker's "
                f"offset.metadata.max.bytes, 4096 by default), got {self.max_metadata_bytes!r}"
            )
        if not isinstance(self.spill_offset_maps, bool):
            raise ConfigurationError(
                f"Options.spill_offset_maps must be a bool, got {self.spill_offset_maps!r}"
            )
        topic = self.offset_map_topic
        if topic is not None and not (
            isinstance(topic, str) and re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic)
        ):
            raise ConfigurationError(
                "Options.offset_map_topic must be a topic name ([a-zA-Z0-9._-], at most 249 "
                f"characters) or None, got {topic!r}"
            )
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError(f"Options.name must be a non-empty string, got {self.name!r}")

    @property
    def dead_lettering(self) -> bool:
        """Records may be dead-lettered: ``dead_letter_topic`` is set, or
        ``on_retries_exhausted`` is DEAD_LETTER and retries can be exhausted (``max_retries``
        or ``non_retryable`` set), or ``on_stall`` is DEAD_LETTER. Then the library's producer
        is created and the dead-letter topics are checked (or created) at start."""
        if self.dead_letter_topic is not None or self.on_stall is StallPolicy.DEAD_LETTER:
            return True
        return self.on_retries_exhausted is OnExhausted.DEAD_LETTER and (
            self.max_retries is not None or bool(self.non_retryable)
        )

    @property
    def commit_every(self) -> float:
        """``commit_interval`` after defaults were applied."""
        assert self.commit_interval is not None
        return self.commit_interval

    @property
    def share_group(self) -> bool:
        return self.group_protocol is GroupProtocol.SHARE

    @property
    def transactional(self) -> bool:
        return self.commit_mode is CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER

    @property
    def buffer_limit(self) -> int:
        """``max_buffered_records`` after defaults were applied."""
        assert self.max_buffered_records is not None
        return self.max_buffered_records
