"""The PySpark runner's core, pure Python (no Spark, no Kafka client): run a handler over ordered
slices of Kafka partitions and return the rows to write.

A Spark task hands :func:`process` the records of one or more whole Kafka partitions, each in
offset order. Records are split into the engine's *lanes* by ``Options.ordering`` (one per key of
a partition for ``KEY``, one per partition for ``PARTITION``, one per record for ``UNORDERED``;
see :mod:`parallel_consumer.spark._lane`); a lane runs its records one at a time, in offset
order, retries included, while up to ``Options.max_concurrency`` lanes run at once (worker
threads here, or tasks on one event loop for an ``async def`` handler, in
:mod:`parallel_consumer.spark._aio`). What a record's failure leads to is the engine's own pure
decision (:func:`parallel_consumer.work.outcomes.decide`): retry after the retry delay (the
lane sleeps, so the record's key and the Spark task wait), skip, dead-letter, or stop (the task
fails).

The result is a list of :class:`OutputRow`: the handler's produced records and the dead letters
(with the headers of :mod:`parallel_consumer.dead_letter`), each carrying a :data:`SOURCE_ID`
header that names its input record, so that downstream readers can drop the duplicates of a
replayed micro-batch. Nothing here is shared between calls: every call owns its lanes and tallies.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor

from parallel_consumer.context import PollContext
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.options import Options, RunnerKind
from parallel_consumer.runners.base import handler_kind
from parallel_consumer.spark._aio import run_lanes
from parallel_consumer.spark._lane import Lane, lanes_of, run_record
from parallel_consumer.spark._records import (
    SOURCE_ID,
    InputRecord,
    OutputRow,
    PartitionTally,
    Result,
)

__all__ = [
    # (the records the core takes and gives, from spark._records)
    "SOURCE_ID",
    "InputRecord",
    "OutputRow",
    "PartitionTally",
    "Result",
    "check_options",
    "process",
]

log = logging.getLogger("parallel_consumer.spark")


def check_options(options: Options, handler: Callable[..., object]) -> None:
    """Refuse the settings the Spark runner cannot honour, with what to do instead."""
    if not callable(handler):
        raise ConfigurationError(
            f"the handler must be a callable taking a PollContext: {handler!r}"
        )
    if options.batch_size != 1:
        raise ConfigurationError(
            f"Options.batch_size={options.batch_size}: the Spark runner calls the handler with "
            "one record at a time; remove batch_size (Spark already batches by micro-batch)"
        )
    if options.processing_timeout is not None:
        log.warning(
            "Options.processing_timeout=%s is not applied by the Spark runner (a call runs to "
            "its end); Spark's own task timeouts and speculation are the tools there",
            options.processing_timeout,
        )
    if options.runner is RunnerKind.PROCESS:
        raise ConfigurationError(
            "Options.runner='process' does not apply on Spark: each Spark task already runs in "
            "its own Python worker process; scale CPU-bound work with more Spark cores instead"
        )


def _run_lane_sync(
    lane: Lane,
    records: Sequence[InputRecord],
    handler: Callable[[PollContext], object],
    sleep: Callable[[float], None],
    stopping: threading.Event,
) -> Lane:
    try:
        for record in records:
            if stopping.is_set():  # another lane stopped the call: its result is an error anyway
                break
            run_record(lane, record, handler, sleep, stopping)
    except BaseException:
        stopping.set()  # (a SystemExit or KeyboardInterrupt of the handler stops the others)
        raise
    return lane


def process(
    records: Iterable[InputRecord],
    handler: Callable[[PollContext], object],
    options: Options,
    *,
    group: str = "spark",
    executor: Executor | None = None,
    sleep: Callable[[float], None] = time.sleep,
    wall: Callable[[], float] = time.time,
) -> Result:
    """Run ``handler`` over ``records`` (whole Kafka partitions, each in offset order) and return
    the rows to write. ``group`` fills the dead letters' ``pc.dlq.group`` header; ``executor``
    (threads, reused across calls by the Spark adapter) runs the lanes of a plain handler,
    else a pool of ``max_concurrency`` threads is made for this call; ``sleep`` waits out retry
    delays of a plain handler and ``wall`` stamps failures (tests pass fakes).

    Raises :class:`~parallel_consumer.errors.RetriesExhausted` when a record's failure leads
    to a stop (``OnExhausted.STOP``): the Spark task fails, Spark retries it and in the end
    fails the query.
    """
    lanes = list(lanes_of(records, options.ordering).values())
    result = Result()
    if not lanes:
        return result
    if handler_kind(handler) == "async":
        with asyncio.Runner(loop_factory=options.loop_factory) as runner:
            done = runner.run(run_lanes(lanes, handler, options, group, wall))
    else:
        done = _run_threads(lanes, handler, options, group, executor, sleep, wall)
    for lane in done:
        result.rows.extend(lane.rows)
        for tp, tally in lane.tally_of.items():
            total = result.partitions.get(tp)
            if total is None:
                result.partitions[tp] = tally
            else:
                total.add(tally)
    return result


def _run_threads(
    lanes: list[list[InputRecord]],
    handler: Callable[[PollContext], object],
    options: Options,
    group: str,
    executor: Executor | None,
    sleep: Callable[[float], None],
    wall: Callable[[], float],
) -> list[Lane]:
    own = None
    if executor is None:
        own = executor = ThreadPoolExecutor(
            min(options.max_concurrency, len(lanes)), thread_name_prefix=f"{options.name}-spark"
        )
    stopping = threading.Event()
    futures = [
        executor.submit(_run_lane_sync, Lane(options, group, wall), lane, handler, sleep, stopping)
        for lane in lanes
    ]
    try:
        done = [future.result() for future in futures]
    except BaseException:
        stopping.set()  # the lanes still running end after their current record
        # A stop (or an interrupt): lanes not started yet need not run, and the caller gets
        # control back without waiting for the lanes still running.
        for future in futures:
            future.cancel()
        if own is not None:
            own.shutdown(wait=False, cancel_futures=True)
        raise
    if own is not None:
        own.shutdown(wait=True)
    return done
