"""Runs: consecutive records of one partition handed to one worker, for calls much shorter than
a thread hand-over (docs/performance.md#runs).

A worker runs a run's records one after another, and reports once at the end. A run holds each
of its lanes' records in offset order (in KEY order, records of different keys may come in any
order). At most one run of a partition is out at a time, and each lane's records are either all
in runs or all in the lanes (shards), never in both at once: so every lane sees its records in
offset order, one at a time, exactly as the lane would have run them. (A lane that only has
records waiting joins the runs with them, see ShardMap.take_idle.) The controller needs no
per-record bookkeeping for a run (no work item, no lane, no in-flight entry): it registers the
polled batch, and settles the run's records as one stretch of offsets when it ends.

A record that fails leaves the run: the worker stops there, and the controller puts the failed
record and every record after it (of the run and of runs queued behind it) into the lanes, where
retries, dead letters and the failure policies work as for any record. A run whose current
call takes long (a call that hangs, or calls that turned slow) is *detached* the same way while
it runs: the call in progress stays in flight as a single call, and the records not started go
to the lanes.

With ``batch_size`` > 1 a run's worker calls the handler with batches of its consecutive
records (``Run.batched``): ``pending`` then holds the batches, cut by the controller (in KEY
order where a key repeats, so that a lane gives at most one record per batch), and ``done``
counts the records of the batches that succeeded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, TypeVar

from parallel_consumer.work.item import TopicPartition

__all__ = ["Detached", "Run", "Runs", "cut_batches", "drain_left"]

T = TypeVar("T")


def drain_left(items: deque[T]) -> list[T]:
    """Take every item from the left of ``items`` with ``popleft`` (atomic): safe while another
    thread takes from the same end, each item goes to exactly one of the two."""
    out = []
    while True:
        try:
            out.append(items.popleft())
        except IndexError:
            return out


def cut_batches(messages: list[Any], size: int, lanes: list[object] | None) -> list[list[Any]]:
    """``messages`` as consecutive batches of at most ``size`` records. With ``lanes`` (each
    message's lane, KEY order) a batch is also cut before a record whose lane it holds
    already: a lane gives at most one record per batch (docs/ordering.md "Batches")."""
    if lanes is None:
        return [messages[i : i + size] for i in range(0, len(messages), size)]
    batches: list[list[Any]] = []
    batch: list[Any] = []
    seen: set[object] = set()
    for message, lane in zip(messages, lanes, strict=True):
        if len(batch) == size or lane in seen:
            batches.append(batch)
            batch = []
            seen = set()
        batch.append(message)
        seen.add(lane)
    if batch:
        batches.append(batch)
    return batches


class Run:
    """Consecutive records of one partition, run in offset order by one worker.

    Shared with the worker that runs it: ``pending`` (the messages not started: both sides
    take from its left with ``popleft``, which is atomic, so each message is started by the
    worker or taken back by the controller, never both), ``done`` (how many calls succeeded,
    written only by the worker after each call), ``outputs`` (appended by the worker before it
    counts the call in ``done``; the controller reads only entries below ``done``, or all once
    the run reported), ``started`` and ``call_started`` (written by the worker). Every other
    field belongs to the controller thread.
    """

    __slots__ = (
        "adopted",
        "batched",
        "call_started",
        "detached",
        "done",
        "epoch",
        "id",
        "look_at",
        "look_done",
        "messages",
        "outputs",
        "pending",
        "progress_at",
        "settled",
        "slow_since",
        "started",
        "timed",
        "tp",
    )

    def __init__(
        self,
        run_id: int,
        tp: TopicPartition,
        epoch: int,
        messages: list[Any],
        *,
        timed: float | None = None,
        batches: list[list[Any]] | None = None,
    ) -> None:
        self.id = run_id
        self.tp = tp
        self.epoch = epoch
        self.messages = messages
        #: ``poll_and_produce``: what each call returned, as a ProducerRecord or a list of them
        #: (appended by the worker before it counts the call in ``done``); None otherwise.
        self.outputs: list[Any] | None = None
        #: The worker calls the handler with the batches of ``pending`` (lists of consecutive
        #: records of ``messages``), not with one record a call.
        self.batched = batches is not None
        self.pending: deque[Any] = deque(messages if batches is None else batches)
        #: Calls that succeeded, from the first (the worker's count).
        self.done = 0
        #: time.perf_counter() when a worker took the run (0.0 while queued).
        self.started = 0.0
        #: Metrics' ``slow_after`` when the worker times every call (metrics want the slow
        #: ones and a periodic sample), else None.
        self.timed = timed
        #: time.perf_counter() when the current call began (written by the worker if timed).
        self.call_started = 0.0
        #: Records already settled by the controller (a prefix of ``messages``).
        self.settled = 0
        #: After a detach: (indices, batch id) of the call that was in progress (its records),
        #: now a call in the in-flight table, settled when the run's report comes.
        self.adopted: tuple[range, int] | None = None
        self.detached = False
        #: The stuck check's last look (time.perf_counter(), as ``started``) and ``done``
        #: then, and when ``done`` last changed.
        self.look_at = 0.0
        self.look_done = 0
        self.progress_at = 0.0
        #: When the stuck check first found the run stuck or slow, in the looks since (0.0
        #: while it looks fine): it is detached only if a later look agrees.
        self.slow_since = 0.0

    def __len__(self) -> int:
        return len(self.messages)

    def __repr__(self) -> str:
        first = self.messages[0].offset() if self.messages else None
        return (
            f"<Run {self.id} {self.tp[0]}[{self.tp[1]}]@{first}+{len(self.messages)} "
            f"done={self.done} settled={self.settled}{' detached' if self.detached else ''}>"
        )


class Detached:
    """What :meth:`Runs.detach` took from a run: ``finished`` the indices of records that
    succeeded and are not settled yet (the caller settles or drops them, and moves
    ``Run.settled``), ``running`` the indices of the records of the call possibly in progress
    (None: none), ``drained`` the messages never started."""

    __slots__ = ("drained", "finished", "running")

    def __init__(self, finished: range, running: range | None, drained: list[Any]) -> None:
        self.finished = finished
        self.running = running
        self.drained = drained


class Runs:
    """The runs out and the records queued for runs, per partition. Owned by the controller."""

    __slots__ = ("_ids", "active", "out", "queued", "records_out")

    def __init__(self) -> None:
        self._ids = 0
        #: Per partition: its run out (at most one), until it reports or is detached.
        self.active: dict[TopicPartition, Run] = {}
        #: Every run handed to the runner whose report has not come (detached ones too).
        self.out: dict[int, Run] = {}
        #: Per partition: (epoch, messages) polled for runs, not handed out yet.
        #: (A deque: runs take from its left, as short as a run of distinct keys may be.)
        self.queued: dict[TopicPartition, tuple[int, deque[Any]]] = {}
        #: Records of runs out, not settled and not taken back (``statistics().in_flight``).
        self.records_out = 0

    def queue(self, tp: TopicPartition, epoch: int, messages: list[Any]) -> None:
        queued = self.queued.get(tp)
        if queued is None or queued[0] != epoch:
            self.queued[tp] = (epoch, deque(messages))
        else:
            queued[1].extend(messages)

    def start(
        self,
        tp: TopicPartition,
        epoch: int,
        messages: list[Any],
        *,
        timed: float | None,
        batches: list[list[Any]] | None = None,
    ) -> Run:
        self._ids += 1
        run = Run(self._ids, tp, epoch, messages, timed=timed, batches=batches)
        self.active[tp] = run
        self.out[run.id] = run
        self.records_out += len(messages)
        return run

    def detach(self, run: Run) -> Detached:
        """Take back what ``run`` has not started; the worker ends it after its current call.
        The records it finished and the one in progress are the caller's to settle."""
        drained = drain_left(run.pending)
        if run.batched:
            drained = [message for batch in drained for message in batch]
        # Read after the drain: the worker cannot start another call now, so it has started
        # exactly len(run) - len(drained) records, all but possibly the last call's finished.
        started = len(run.messages) - len(drained)
        done = run.done
        running = range(done, started) if done < started else None
        if self.active.get(run.tp) is run:
            del self.active[run.tp]
        run.detached = True
        self.records_out -= len(run.messages) - run.settled
        return Detached(range(run.settled, done), running, drained)

    def ended(self, run: Run) -> None:
        """``run`` reported: it is no longer out (call before settling its records)."""
        self.out.pop(run.id, None)
        if self.active.get(run.tp) is run:
            del self.active[run.tp]
        if not run.detached:
            self.records_out -= len(run.messages) - run.settled

    def settled_early(self, count: int) -> None:
        """``count`` records of a run still out were settled before its report: they are no
        longer out."""
        self.records_out -= count

    def take_queued(self, tp: TopicPartition) -> tuple[int, deque[Any]] | None:
        return self.queued.pop(tp, None)

    def queued_records(self) -> int:
        return sum(len(messages) for _, messages in self.queued.values()) if self.queued else 0

    def busy(self, tp: TopicPartition) -> bool:
        """``tp`` has a run out or records queued for one (its next records join them)."""
        return tp in self.active or tp in self.queued

    def __iter__(self) -> Iterator[Run]:
        return iter(list(self.out.values()))

    def __bool__(self) -> bool:
        return bool(self.out)

    def __repr__(self) -> str:
        return (
            f"<Runs out={len(self.out)} records_out={self.records_out} "
            f"queued={sum(len(m) for _, m in self.queued.values())}>"
        )
