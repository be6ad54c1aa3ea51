"""What ``pc.statistics()`` and ``pc.health()`` show: snapshots assembled from the parts on
the controller thread (pure reads; nothing here changes state)."""

from __future__ import annotations

from parallel_consumer.engine.delivery import Delivery
from parallel_consumer.engine.dispatch import Dispatch
from parallel_consumer.engine.ledger import Ledger
from parallel_consumer.engine.runs import RunDispatch
from parallel_consumer.engine.watches import Watches
from parallel_consumer.health import HealthReport, health_report, partition_health
from parallel_consumer.options import Options
from parallel_consumer.status import Lifecycle, PollerStatistics, Statistics, assemble_statistics

__all__ = ["health", "statistics"]


def health(
    lifecycle: Lifecycle,
    *,
    ledger: Ledger,
    dispatch: Dispatch,
    runs: RunDispatch,
    poller: PollerStatistics,
    options: Options,
    failure: BaseException | None,
    now: float,
) -> HealthReport:
    return health_report(
        lifecycle,
        partitions=partition_health(
            ledger.partitions.values(),
            progress=ledger.progress,
            in_flight=ledger.in_flight,
            runs=runs.runs,
            waiting=ledger.shards.waiting_by_tp,
            blocked=ledger.commits.blocked,
            now=now,
        ),
        dead_letter_failures=ledger.counters.dead_letter_failures,
        deadline_exceeded=ledger.counters.deadline_exceeded,
        overrunning_calls=dispatch.deadlines.overruns,
        stall_threshold=options.stall_threshold,
        failure=failure,
        brokers_down_for=poller.brokers_down_for,
        missing_topics=poller.missing_topics,
        missing_topics_for=poller.missing_topics_for,
        access_refused=poller.access_refused + ledger.refusals.texts,
    )


def statistics(
    lifecycle: Lifecycle,
    *,
    ledger: Ledger,
    delivery: Delivery,
    dispatch: Dispatch,
    runs: RunDispatch,
    watches: Watches,
    poller: PollerStatistics,
) -> Statistics:
    return assemble_statistics(
        lifecycle,
        counters=ledger.counters,
        shards=ledger.shards,
        in_flight=ledger.in_flight,
        delivering=delivery.pending.records,
        retries=len(ledger.retries),
        pauses=watches.pauses,
        commits=ledger.commits,
        partitions=ledger.partitions.values(),
        poller=poller,
        overrunning_calls=dispatch.deadlines.overruns,
        chunk_size=dispatch.chunk_size,
        totals=ledger.totals,
        runs_out=runs.runs.records_out,
    )
