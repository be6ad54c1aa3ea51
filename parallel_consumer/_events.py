"""Typed messages that cross threads. Frozen: once posted, nobody changes them."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from parallel_consumer.work.commit_tracker import CommitAnswer, OffsetCommit
from parallel_consumer.work.item import TopicPartition
from parallel_consumer.work.runs import Run

__all__ = [
    "Acknowledge",
    "Assignment",
    "Commit",
    "CommitAnswer",
    "CommitResult",
    "Control",
    "ControllerEvent",
    "DeadlineExtended",
    "OffsetCommit",
    "OutputsDelivered",
    "PartitionsAssigned",
    "PartitionsLost",
    "PartitionsRevoked",
    "PollerCommand",
    "PollerFailed",
    "PositionsReached",
    "ProducerFailed",
    "RecordUnreadable",
    "RecordsPolled",
    "Release",
    "RunDone",
    "RunnerReport",
    "SetPaused",
    "StopPoller",
    "Transact",
    "WorkDone",
    "WorkDoneMany",
]


# -- poller -> controller ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordsPolled:
    """One ``consume()`` result, grouped by partition, stamped with each partition's epoch."""

    batches: dict[TopicPartition, tuple[int, list[Any]]]  # tp -> (epoch, messages)


@dataclass(frozen=True, slots=True)
class PositionsReached:
    """The client's fetch positions: every offset below one was either delivered in an earlier
    ``RecordsPolled`` or does not exist as a record (transaction markers, aborted records,
    compaction gaps). Lets a partition commit past a trailing transaction marker."""

    positions: tuple[tuple[TopicPartition, int, int], ...]  # (tp, epoch, offset)


@dataclass(frozen=True, slots=True)
class Assignment:
    """A newly assigned partition and what the group committed for it.

    ``exact_metadata``: the metadata is exactly the committed bytes (read with their length
    through librdkafka, ``kafka/committed_reader.py``), not a C string confluent-kafka may
    have read past the end of; the map in it is then decoded whole, never cut conservatively.
    """

    tp: TopicPartition
    epoch: int
    committed_offset: int | None
    metadata: str | None
    exact_metadata: bool = False
    #: A partition of a share group (KIP-932): every member reads it, records come in any
    #: order and again after a release; no offset is committed (``work/partitions.py``).
    shared: bool = False


@dataclass(frozen=True, slots=True)
class PartitionsAssigned:
    assignments: tuple[Assignment, ...]


@dataclass(frozen=True, slots=True)
class PartitionsRevoked:
    """Partitions are being taken away. The controller sends their final commit through the
    committer, then resolves ``reply``; the poller runs that commit before it lets go of them."""

    tps: tuple[TopicPartition, ...]
    reply: Future[None] = field(compare=False)


@dataclass(frozen=True, slots=True)
class PartitionsLost:
    """Partitions were lost without a chance to commit (session timeout, fencing)."""

    tps: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class CommitResult:
    """Answers to one commit request."""

    answers: tuple[CommitAnswer, ...]


@dataclass(frozen=True, slots=True)
class RecordUnreadable:
    """The client could not deliver the record at ``offset`` (corrupt, undeserialisable)."""

    tp: TopicPartition
    offset: int
    error: str


@dataclass(frozen=True, slots=True)
class PollerFailed:
    error: BaseException


# -- runner -> controller ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkDone:
    """A handler call ended.

    ``errors`` holds one outcome per record of the batch, in the batch's order: None where the
    record succeeded, the exception where it failed (a call that raised fails every record).
    ``value`` is what the handler returned (None when it raised). ``partial``: the handler
    returned but failed some records with ``PollContext.fail`` (its value still counts:
    ``poll_and_produce`` outputs are sent).
    """

    batch: int
    errors: Sequence[BaseException | None]
    value: object
    finished_at: float  # clock.monotonic() when the call ended
    partial: bool = False
    #: Seconds the call took on the runner, where the runner measures it (else 0.0): what
    #: adaptive dispatch follows.
    took: float = 0.0


#: One call of a chunk: ``(batch, errors, value, finished_at, partial)`` as in
#: :class:`WorkDone` (a plain tuple: a chunk carries many, and a frozen dataclass costs about a
#: microsecond each to build).
CallResult = tuple[int, Sequence[BaseException | None], object, float, bool]


@dataclass(frozen=True, slots=True)
class WorkDoneMany:
    """The calls of one chunk or chain ended (see ``ThreadRunner.submit_chunk`` and
    ``submit_chain``), or calls of the asyncio runner that ended in one pass of its loop: one
    event, one thread hop, for many calls. ``service`` is the mean time per call, handler and
    runner bookkeeping included, that the runner measured over the chunk (0.0: not
    measured)."""

    calls: Sequence[CallResult]
    service: float
    #: Calls of a chain (``ThreadRunner.submit_chain``) that never started because a call
    #: before them failed: their records go back to the front of their lane.
    unstarted: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class RunDone:
    """A run ended (see ``ThreadRunner.submit_run``): its first ``ok`` calls succeeded, and
    the next one failed with ``error`` (None: none failed; the rest was taken back, or the
    runner stopped). ``service`` is the mean time per call the worker measured; ``samples``
    are ``(index, seconds)`` of the calls it timed for metrics (``Run.timed``): the first, and
    every one longer than ``slow_after``. A batched run (``Run.batched``) counts records in
    ``ok`` and ``service``; ``errors`` are then the outcomes of the records of the batch that
    failed (``ok`` is its first), ``error`` the first of them."""

    run: Run
    ok: int
    error: BaseException | None
    finished_at: float
    service: float
    samples: tuple[tuple[int, float], ...] = ()
    errors: tuple[BaseException | None, ...] | None = None


# -- producer -> controller -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutputsDelivered:
    """Handler calls whose outputs are all settled: ``(batch id, results)`` per call, with per
    output, in the order the handler returned them, ``(partition, offset)`` where the broker
    acknowledged it, or the exception that says why it was not delivered."""

    calls: tuple[tuple[int, tuple[tuple[int, int] | BaseException | None, ...]], ...]
    #: Runs whose outputs are all settled: ``(run id, None or {record index: why one of its
    #: outputs was not delivered})``.
    runs: tuple[tuple[int, dict[int, BaseException] | None], ...] = ()


@dataclass(frozen=True, slots=True)
class ProducerFailed:
    """The library's producer cannot go on (a fatal error, e.g. fenced): stop."""

    reason: str


# -- user thread -> controller ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Control:
    """A request from the facade: ``pause``, ``resume``, ``close``, ``statistics``."""

    action: str
    reply: Future[Any] = field(compare=False)
    drain: bool = True
    #: For ``close``: how long buffered (drain) or in-flight work may take before giving up.
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class DeadlineExtended:
    """A handler asked to keep its call alive (``PollContext.extend_deadline``): the call's
    deadline becomes at least ``until`` (engine clock). Posted from the handler's thread."""

    batch: int
    until: float


#: What a runner reports through the ``done`` callback it is started with.
RunnerReport = WorkDone | WorkDoneMany | RunDone

ControllerEvent = (
    RecordsPolled
    | PartitionsAssigned
    | PartitionsRevoked
    | PartitionsLost
    | PositionsReached
    | CommitResult
    | RecordUnreadable
    | PollerFailed
    | WorkDone
    | WorkDoneMany
    | RunDone
    | OutputsDelivered
    | ProducerFailed
    | Control
    | DeadlineExtended
)


# -- controller -> poller ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit these offsets; ``sync`` blocks the poller until answered. ``reply`` gets one
    answer per offset. Offsets of partitions the poller no longer holds in that epoch never
    reach the client (they are answered as failed at once)."""

    offsets: tuple[OffsetCommit, ...]
    sync: bool
    reply: Future[tuple[CommitAnswer, ...]] = field(compare=False)


@dataclass(frozen=True, slots=True)
class Transact:
    """Transactional mode: add these offsets to the open transaction, commit it, begin the
    next. On an abortable error the poller aborts, rewinds every partition it keeps to its
    committed offset (new epochs, posted as PartitionsAssigned before the answer) and answers
    every offset as failed; on a fatal one it answers them as permanent failures."""

    offsets: tuple[OffsetCommit, ...]
    reply: Future[tuple[CommitAnswer, ...]] = field(compare=False)
    #: Abort instead of committing (an output of the transaction was rejected before it
    #: reached the producer, or partitions with outputs in it were lost).
    abort: bool = False


@dataclass(frozen=True, slots=True)
class SetPaused:
    """The partitions the controller wants paused (the poller may pause more for its credit)."""

    tps: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class Release:
    """``count`` records the poller handed over have left the engine: that much credit returns."""

    count: int


@dataclass(frozen=True, slots=True)
class StopPoller:
    """Close the Kafka client and end the poller thread."""


@dataclass(frozen=True, slots=True)
class Acknowledge:
    """Share groups: records that left the engine, each with how the broker should treat it:
    ``accept`` True (done: processed, skipped or dead-lettered) or False (release it for
    another delivery)."""

    acks: tuple[tuple[TopicPartition, int, bool], ...]  # (tp, offset, accept)


PollerCommand = Commit | Transact | SetPaused | Release | Acknowledge | StopPoller
