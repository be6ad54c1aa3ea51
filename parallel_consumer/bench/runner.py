"""Run rows: prepare each data set once, run every contestant on it with its own group, measure.

Repeats are interleaved (run 1 of every contestant, then run 2 ...) so that a machine that slows
down over the minutes does not favour whoever ran first.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from parallel_consumer.bench.contestants import CONTESTANTS, MANY_INSTANCES, RunEnv
from parallel_consumer.bench.kafka_io import end_offsets, prepare_topic
from parallel_consumer.bench.measure import Measurement, Summary, measure, summarise
from parallel_consumer.bench.model import DataSet, Row

__all__ = ["Progress", "RowResult", "run_rows"]


@dataclass
class RowResult:
    row: Row
    topic: str
    produce_seconds: float
    summaries: dict[str, Summary] = field(default_factory=dict)
    #: Contestant -> why it did not run this row.
    skipped: dict[str, str] = field(default_factory=dict)
    #: Contestant -> what went wrong (the other contestants still ran).
    failed: dict[str, str] = field(default_factory=dict)


class Progress(Protocol):
    """What the runner tells the display as it goes."""

    def row_started(self, row: Row, runs: int) -> None: ...

    def data_ready(self, row: Row, topic: str, produce_seconds: float, reused: bool) -> None: ...

    def run_started(self, row: Row, contestant: str, index: int) -> None: ...

    def run_finished(self, row: Row, contestant: str, result: Measurement) -> None: ...

    def run_skipped(self, row: Row, contestant: str, reason: str) -> None: ...

    def run_failed(self, row: Row, contestant: str, reason: str) -> None: ...


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def warm_up(bootstrap: str) -> None:
    """Commit once in a throw-away group, so that the broker creates its offsets topic now and
    not inside the first contestant's start-up."""
    from confluent_kafka import Consumer

    from parallel_consumer.bench.kafka_io import base_consumer_config, new_group

    topic, _ = prepare_topic(bootstrap, DataSet(records=1, partitions=1, keys=1), "warm-up")
    consumer = Consumer(base_consumer_config(bootstrap, new_group("warm-up")))
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                consumer.commit(message=message, asynchronous=False)
                return
    finally:
        consumer.close()


def run_rows(
    env: RunEnv,
    rows: Sequence[Row],
    contestants: Sequence[str],
    repeat: int,
    progress: Progress,
) -> list[RowResult]:
    topics: dict[DataSet, tuple[str, float, dict[int, int]]] = {}
    results = []
    warm_up(env.bootstrap)
    for row in rows:
        chosen = []
        skipped = {}
        for name in contestants:
            reason = (
                "runs one instance only"
                if row.instances > 1 and name not in MANY_INSTANCES
                else CONTESTANTS[name].unsupported(row)
            )
            if reason is None:
                chosen.append(name)
            else:
                skipped[name] = reason
        progress.row_started(row, len(chosen) * repeat)
        reused = row.data in topics
        if not reused:
            topic, seconds = prepare_topic(env.bootstrap, row.data, row.workload.lower())
            topics[row.data] = (
                topic,
                seconds,
                end_offsets(env.bootstrap, topic, row.data.partitions),
            )
        topic, seconds, ends = topics[row.data]
        progress.data_ready(row, topic, seconds, reused)
        result = RowResult(row=row, topic=topic, produce_seconds=seconds, skipped=skipped)
        for name, reason in skipped.items():
            progress.run_skipped(row, name, reason)
        runs: dict[str, list[Measurement]] = {name: [] for name in chosen}
        for index in range(repeat):
            for name in chosen:
                if name in result.failed:
                    continue
                progress.run_started(row, name, index)
                try:
                    observation = CONTESTANTS[name].run(env, row, topic, ends)
                except Exception as exc:
                    result.failed[name] = one_line(exc)
                    progress.run_failed(row, name, result.failed[name])
                    continue
                measurement = measure(row, observation, ends)
                runs[name].append(measurement)
                progress.run_finished(row, name, measurement)
        for name, measured in runs.items():
            if measured:
                result.summaries[name] = summarise(row.label, name, measured)
        results.append(result)
    return results
