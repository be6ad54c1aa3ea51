"""Lifecycle states and the statistics snapshot of a ParallelConsumer."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from parallel_consumer.work.backpressure import Pauses
from parallel_consumer.work.commit_tracker import CommitTracker
from parallel_consumer.work.counters import Counters
from parallel_consumer.work.inflight import InFlight
from parallel_consumer.work.item import TopicPartition
from parallel_consumer.work.partitions import PartitionSnapshot, PartitionState, RecordTotals
from parallel_consumer.work.shards import ShardMap

__all__ = [
    "Lifecycle",
    "PartitionSnapshot",
    "PartitionTotals",
    "PollerStatistics",
    "Statistics",
    "assemble_statistics",
]


class Lifecycle(enum.Enum):
    """Where a ParallelConsumer is in its life. Moves only forward, except PAUSED <-> RUNNING."""

    NEW = "new"  #: constructed, no handler registered yet
    RUNNING = "running"  #: polling and dispatching
    PAUSED = "paused"  #: pause(): nothing new dispatched or fetched; in-flight calls finish
    DRAINING = "draining"  #: close(drain=True): no new fetches; buffered records still run
    CLOSING = "closing"  #: waiting for in-flight calls, final commit, client close
    CLOSED = "closed"  #: every thread has ended


@dataclass(frozen=True, slots=True)
class PollerStatistics:
    """The poller's side: the Kafka client and the bound on buffered records."""

    #: Records handed to the engine and not yet returned (never above ``limit``).
    held: int
    #: ``Options.max_buffered_records``.
    limit: int
    #: ``limit - held``: how many more records the poller may fetch.
    credit: int
    assigned_partitions: int
    #: Partitions paused in the client right now (by the controller or, while no credit is
    #: left for long, all of them).
    paused_partitions: int
    #: Seconds since the poller last called ``consume()`` (None before the first call). A
    #: value that keeps growing while ``credit`` is high means the poller is stuck.
    since_last_poll: float | None
    #: Seconds the poller has been waiting for credit (None while it has enough).
    waiting_for_credit: float | None
    #: Seconds the commit request on its way has waited for the broker's answer (None when
    #: none is on its way). One request at a time: commits sent meanwhile wait behind it.
    commit_unanswered_for: float | None = None
    #: Commits waiting for that answer before they go out (as one request).
    commits_queued: int = 0
    #: Seconds since the Kafka client reported every broker down or unreachable (None while
    #: one answers). ``health()`` is unhealthy once it passes ``BROKERS_DOWN_UNHEALTHY_AFTER``.
    brokers_down_for: float | None = None
    #: Subscriptions (names or ``^regex``) that match no topic of the cluster.
    missing_topics: tuple[str, ...] = ()
    #: Seconds since no subscription matches any topic (None while one does).
    missing_topics_for: float | None = None
    #: The brokers' refusals of the consumer in force (a failed login, a missing ACL on the
    #: group or a topic); ``health()`` is unhealthy while there is one.
    access_refused: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionTotals:
    """One partition's records since the consumer started, over all its assignments (also
    after it was revoked): what the metrics counters ``pc.processed.records`` and
    ``pc.failed.records`` report."""

    topic: str
    partition: int
    #: Records processed successfully (skipped and dead-lettered ones excluded).
    succeeded: int
    #: Failed handler attempts (each retry that fails counts again).
    failed: int


@dataclass(frozen=True, slots=True)
class Statistics:
    """A consistent snapshot taken on the controller thread."""

    lifecycle: Lifecycle
    #: Records polled and registered for processing (skips of finished records excluded).
    records_registered: int
    #: Records skipped because the restored offset map marked them finished.
    records_skipped: int
    records_succeeded: int
    #: Failed handler attempts (each retry that fails counts again).
    records_failed: int
    #: Results dropped because their partition was revoked while they ran.
    results_stale: int
    #: Records waiting to be dispatched.
    waiting: int
    #: Records handed to the runner: inside handler calls or queued for the next free worker.
    in_flight: int
    #: Records waiting for their retry delay.
    retry_waiting: int
    #: Records held by the engine (waiting + in flight + retry waiting + delivering): bounded
    #: by Options.max_buffered_records.
    held: int
    shards: int
    commits_sent: int
    commits_acknowledged: int
    commit_failures: int
    #: Partitions the controller asked the poller to pause (a full per-partition backlog,
    #: pause(), close). When ``held`` reaches the bound the poller also pauses every partition
    #: by itself, which this count does not include.
    paused_partitions: int
    #: How many times a partition was paused so far (back-pressure, pause(), close): a number
    #: that keeps growing quickly means the buffer is too small for the fetch pattern.
    partition_pauses: int
    #: Partitions whose offset map is near or over the metadata limit (only holes run there).
    blocked_partitions: int
    #: Times the engine found records waiting with nothing running and nothing due (a bug:
    #: it logs a warning with details each time).
    stalls: int
    partitions: tuple[PartitionSnapshot, ...]
    #: The poller's side (None before processing starts).
    poller: PollerStatistics | None = None
    #: poll_and_produce: records whose handler finished and whose outputs are not yet all
    #: acknowledged by the broker (or, transactional mode, wait for the next transaction).
    delivering: int = 0
    #: poll_and_produce: outputs handed to the producer / acknowledged / not delivered.
    outputs_sent: int = 0
    outputs_acknowledged: int = 0
    outputs_failed: int = 0
    #: Records written to their dead-letter topic (acknowledged by the broker).
    records_dead_lettered: int = 0
    #: Records given up on without a dead letter: ``Skip`` raised, or the SKIP policy.
    records_skipped_on_failure: int = 0
    #: Records whose retries were exhausted (``max_retries``, or a ``non_retryable`` error)
    #: and to which ``on_retries_exhausted`` applied.
    retries_exhausted: int = 0
    #: Dead-letter writes that failed (the record stays uncommitted and is written again).
    dead_letter_failures: int = 0
    #: Handler calls that ran past Options.processing_timeout (their records were retried).
    deadline_exceeded: int = 0
    #: Of those, calls still running (a thread cannot be interrupted): each holds a worker.
    overrunning_calls: int = 0
    #: Stall episodes of single partitions so far (Options.stall_threshold; see health()).
    partition_stalls: int = 0
    #: Adaptive dispatch: how many calls the engine hands to one worker at a time (1 for calls
    #: longer than a thread hand-over, up to 64 for very short ones; docs/performance.md).
    chunk_size: int = 1
    #: Per partition ever assigned: records processed and attempts failed since the start.
    partition_totals: tuple[PartitionTotals, ...] = ()
    #: Runs handed out so far (a partition's consecutive records run by one worker, for very
    #: short calls; docs/performance.md#runs), and runs detached because a call took long.
    runs: int = 0
    runs_detached: int = 0
    #: Chains handed out so far (a lane's next records run by the worker of the record before
    #: them, for calls of about a millisecond; docs/performance.md#chains).
    chains: int = 0
    #: Bundles handed out so far (a few long calls of different lanes to one worker at once,
    #: while many more records are ready than the workers can start;
    #: docs/performance.md#bundles).
    bundles: int = 0


def assemble_statistics(
    lifecycle: Lifecycle,
    *,
    counters: Counters,
    shards: ShardMap,
    in_flight: InFlight,
    retries: int,
    delivering: int = 0,
    pauses: Pauses,
    commits: CommitTracker,
    partitions: Iterable[PartitionState],
    poller: PollerStatistics | None,
    chunk_size: int = 1,
    overrunning_calls: int = 0,
    totals: Mapping[TopicPartition, RecordTotals] | None = None,
    runs_out: int = 0,
) -> Statistics:
    """One snapshot from the views of the controller's parts (on the controller thread)."""
    snapshots = []
    for state in partitions:
        size, status = commits.metadata(state.tp)
        snapshots.append(
            state.snapshot(
                blocked=state.tp in commits.blocked, metadata_size=size, metadata_status=status
            )
        )
    return Statistics(
        lifecycle=lifecycle,
        records_registered=counters.registered,
        records_skipped=counters.skipped,
        records_succeeded=counters.succeeded,
        records_failed=counters.failed,
        results_stale=counters.stale,
        waiting=shards.waiting,
        in_flight=in_flight.records + runs_out,
        retry_waiting=retries,
        held=shards.waiting + in_flight.records + runs_out + retries + delivering,
        shards=len(shards),
        commits_sent=counters.commits_sent,
        commits_acknowledged=counters.commits_acknowledged,
        commit_failures=counters.commit_failures,
        paused_partitions=len(pauses.paused),
        partition_pauses=pauses.count,
        blocked_partitions=len(commits.blocked),
        stalls=counters.stalls,
        partitions=tuple(snapshots),
        poller=poller,
        delivering=delivering,
        outputs_sent=counters.outputs_sent,
        outputs_acknowledged=counters.outputs_acknowledged,
        outputs_failed=counters.outputs_failed,
        records_dead_lettered=counters.dead_lettered,
        records_skipped_on_failure=counters.skipped_on_failure,
        retries_exhausted=counters.retries_exhausted,
        dead_letter_failures=counters.dead_letter_failures,
        deadline_exceeded=counters.deadline_exceeded,
        overrunning_calls=overrunning_calls,
        partition_stalls=counters.partition_stalls,
        chunk_size=chunk_size,
        runs=counters.runs,
        runs_detached=counters.runs_detached,
        chains=counters.chains,
        bundles=counters.bundles,
        partition_totals=tuple(
            PartitionTotals(tp[0], tp[1], t.succeeded, t.failed) for tp, t in (totals or {}).items()
        ),
    )
