"""``pc``: this library, parallel_consumer."""

from __future__ import annotations

import functools
import time
import uuid
from typing import Any

from parallel_consumer import Options, ParallelConsumer, PollContext, ProcessingOrder, Statistics
from parallel_consumer.bench import features
from parallel_consumer.bench.contestants.base import LogRecorder, RunEnv
from parallel_consumer.bench.kafka_io import base_consumer_config, new_group
from parallel_consumer.bench.model import Observation, Row
from parallel_consumer.bench.work import async_work, burn, cpu_rounds, loop_factory, sync_work
from parallel_consumer.options import CommitMode, RunnerKind
from parallel_consumer.testing import create_topic

__all__ = [
    "ParallelConsumerContestant",
    "ParallelConsumerOtelContestant",
    "committed_to_the_end",
]


def committed_to_the_end(
    stats: Statistics, ends: dict[int, int], deadline: float, what: str
) -> bool:
    """Whether the broker acknowledged the end offset of every partition (where ``pc``'s clock
    stops); RuntimeError once ``deadline`` (time.monotonic) passed without."""
    committed = {s.partition: s.committed_offset for s in stats.partitions}
    if all(committed.get(p) == end for p, end in ends.items() if end > 0):
        return True
    if time.monotonic() > deadline:
        raise RuntimeError(f"{what}: commits did not reach {ends}: {committed}")
    return False


class ParallelConsumerContestant:
    name = "pc"
    description = "parallel_consumer (this library)"

    def unavailable(self) -> str | None:
        return None

    def unsupported(self, row: Row) -> str | None:
        if row.async_handler:
            if row.runner.get("loop_factory") == "uvloop":
                return features.async_handlers_missing() or features.uvloop_missing()
            return features.async_handlers_missing()
        if row.runner.get("runner") == "process":
            return features.process_runner_missing()
        if row.produce is not None:
            return features.poll_and_produce_missing()
        return None

    def options(self, row: Row) -> Options:
        extra: dict[str, Any] = dict(row.runner)
        if "runner" in extra:
            extra["runner"] = RunnerKind(extra["runner"])
        if "loop_factory" in extra:
            extra["loop_factory"] = loop_factory(row)
        if row.produce:
            extra["commit_mode"] = CommitMode[row.produce]
        return Options(
            ordering=ProcessingOrder[row.ordering],
            max_concurrency=row.concurrency,
            batch_size=row.batch_size,
            commit_interval=row.commit_interval,
            max_buffered_records=max(10_000, 4 * row.concurrency * row.batch_size),
            **extra,
        )

    def run(self, env: RunEnv, row: Row, topic: str, ends: dict[int, int]) -> Observation:
        recorder = LogRecorder(sum(ends.values()))
        producer: dict[str, Any] | None = None
        output = ""
        if row.produce is not None:
            # Created before the clocks start: not part of anyone's start-up.
            output = create_topic(env.bootstrap, f"{topic}-out-{uuid.uuid4().hex[:6]}")
            producer = {"linger.ms": 5}
            if row.produce == "PERIODIC_TRANSACTIONAL_PRODUCER":
                producer["transactional.id"] = f"pc-bench-{topic}"
        telemetry, shutdown = self.telemetry()
        pc = ParallelConsumer(
            base_consumer_config(env.bootstrap, new_group("pc")),
            self.options(row),
            producer_config=producer,
            telemetry=telemetry,
        )
        started = time.time()
        in_process = row.runner.get("runner") != "process"
        try:
            pc.subscribe([topic])
            if row.produce is not None:
                handler = self._producing_handler(row, recorder, output)
                pc.poll_and_produce(handler)  # type: ignore[attr-defined, unused-ignore]
            elif in_process:
                pc.poll(self._handler(row, recorder))
            else:
                # Another process runs the handler: it must pickle, and it cannot log here.
                # The run is checked by its commits reaching the end; the clock starts at
                # subscribe. The work is calibrated here, once, so every process does the same.
                pc.poll(functools.partial(_process_handler, cpu_rounds(row.work.ms)))
            if in_process:
                recorder.wait(env.timeout, f"pc {row.name}")
            # The clock stops when the broker acknowledged the end offset of every partition.
            deadline = time.monotonic() + 60
            while not committed_to_the_end(pc.statistics(), ends, deadline, f"pc {row.name}"):
                time.sleep(0.002)
            finished = time.time()
            stats = pc.statistics()
        finally:
            pc.close()
            if shutdown is not None:
                shutdown()
        log = recorder.log
        if not in_process:
            recorder.first_call = started
            per_record = row.work.ms / 1000
            log = [(p, None, o, per_record) for p, end in ends.items() for o in range(end)]
        assert recorder.first_call is not None
        return Observation(
            started=started,
            first_call=recorder.first_call,
            finished=finished,
            log=log,
            extra={
                "commits_acknowledged": stats.commits_acknowledged,
                "partition_pauses": stats.partition_pauses,
                "runs": stats.runs,
                "runs_detached": stats.runs_detached,
            },
        )

    def telemetry(self) -> tuple[Any, Any]:
        """The ``telemetry=`` of the run and what ends it afterwards (none here)."""
        return None, None

    @staticmethod
    def _producing_handler(row: Row, recorder: LogRecorder, output: str) -> Any:
        from parallel_consumer import ProducerRecord  # type: ignore[attr-defined, unused-ignore]

        if row.work.kind == "noop" and row.batch_size == 1:
            # Nothing to do and nothing to time (as _handler's no-op): the log, and the output.
            add_one = recorder.add_one

            def handle_noop(ctx: PollContext) -> Any:
                r = ctx.record
                add_one(r.partition, r.key, r.offset, 0.0)
                return ProducerRecord(output, r.value, key=r.key)

            return handle_noop
        work = sync_work(row.work)

        def handle(ctx: PollContext) -> list[Any]:
            recorder.call(work, [(r.partition, r.key, r.offset) for r in ctx.records])
            return [ProducerRecord(output, r.value, key=r.key) for r in ctx.records]

        return handle

    @staticmethod
    def _handler(row: Row, recorder: LogRecorder) -> Any:
        if row.async_handler:
            work_async = async_work(row.work)

            async def handle_async(ctx: PollContext) -> None:
                if recorder.first_call is None:
                    recorder.first_call = time.time()
                started = time.perf_counter()
                await work_async()
                recorder.add(
                    [(r.partition, r.key, r.offset) for r in ctx.records],
                    time.perf_counter() - started,
                )

            return handle_async
        if row.work.kind == "noop":
            # Nothing to do, and nothing to time: only the log (the same as serial's).
            add_one = recorder.add_one

            def handle_noop(ctx: PollContext) -> None:
                for r in ctx.records:
                    add_one(r.partition, r.key, r.offset, 0.0)

            return handle_noop
        work = sync_work(row.work)

        def handle(ctx: PollContext) -> None:
            recorder.call(work, [(r.partition, r.key, r.offset) for r in ctx.records])

        return handle


def _process_handler(rounds: int, ctx: PollContext) -> None:
    """W5's handler in the process runner: module level, so that it pickles."""
    burn(rounds)


class ParallelConsumerOtelContestant(ParallelConsumerContestant):
    """This library with OpenTelemetry metrics on, as an operator would run it: the SDK's
    MeterProvider with a periodic reader exporting every second (to a discarded console
    stream). Its figures beside ``pc``'s are the cost of the metrics."""

    name = "pc-otel"
    description = "parallel_consumer with OpenTelemetry metrics (SDK, periodic reader, 1 s)"
    EXPORT_EVERY_MS = 1000

    def unavailable(self) -> str | None:
        try:
            import opentelemetry.sdk.metrics  # noqa: F401
        except ImportError:
            return "needs the OpenTelemetry SDK: pip install -e '.[otel]' in a clone"
        return None

    def telemetry(self) -> tuple[Any, Any]:
        import os

        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            PeriodicExportingMetricReader,
        )

        from parallel_consumer.telemetry import Telemetry

        sink = open(os.devnull, "w")  # noqa: SIM115 - closed by shutdown below
        reader = PeriodicExportingMetricReader(
            ConsoleMetricExporter(out=sink), export_interval_millis=self.EXPORT_EVERY_MS
        )
        provider = MeterProvider(metric_readers=[reader])

        def shutdown() -> None:
            provider.shutdown()
            sink.close()

        return Telemetry(meter_provider=provider), shutdown
