"""``pyrallel``: pyrallel-consumer from PyPI (asyncio execution mode, its default)."""

from __future__ import annotations

import asyncio
import gc
import importlib.metadata
import logging
import threading
import time
from typing import Any

from parallel_consumer.bench.contestants.base import LogRecorder, RunEnv
from parallel_consumer.bench.kafka_io import new_group, wait_committed
from parallel_consumer.bench.model import Observation, Row
from parallel_consumer.bench.work import async_work

__all__ = ["PyrallelContestant", "pyrallel_config"]

INSTALL = "pip install --ignore-requires-python pyrallel-consumer"


def pyrallel_config(bootstrap: str, group: str, row: Row) -> Any:
    """pyrallel-consumer's settings for ``row``: its asyncio mode, ``max_in_flight`` = C, the
    row's ordering, from the earliest offset, no dead-letter topic."""
    from pyrallel_consumer import ExecutionConfig, KafkaConfig, OrderingMode, ParallelConsumerConfig

    ordering = {
        "KEY": OrderingMode.KEY_HASH,
        "PARTITION": OrderingMode.PARTITION,
        "UNORDERED": OrderingMode.UNORDERED,
    }[row.ordering]
    return KafkaConfig(
        BOOTSTRAP_SERVERS=bootstrap,
        CONSUMER_GROUP=group,
        AUTO_OFFSET_RESET="earliest",
        SESSION_TIMEOUT_MS=10000,
        dlq_enabled=False,
        parallel_consumer=ParallelConsumerConfig(
            ordering_mode=ordering,
            execution=ExecutionConfig(mode="async", max_in_flight=row.concurrency),
        ),
    )


class PyrallelContestant:
    name = "pyrallel"
    description = "pyrallel-consumer (PyPI), asyncio execution mode, max_in_flight = C"

    def unavailable(self) -> str | None:
        try:
            import pyrallel_consumer  # noqa: F401
        except ImportError:
            return f"pyrallel-consumer is not installed ({INSTALL})"
        return None

    def unsupported(self, row: Row) -> str | None:
        if row.produce is not None:
            return "pyrallel is not run on produce rows (a produce row measures poll_and_produce)"
        if row.work.kind == "cpu":
            return "pyrallel's asyncio mode runs no CPU-bound work in parallel"
        if row.batch_size != 1:
            return "pyrallel has no handler batches"
        return None

    def run(self, env: RunEnv, row: Row, topic: str, ends: dict[int, int]) -> Observation:
        from pyrallel_consumer import PyrallelConsumer

        recorder = LogRecorder(sum(ends.values()))
        work = async_work(row.work)
        group = new_group("pyrallel")

        async def worker(item: Any) -> None:
            if recorder.first_call is None:
                recorder.first_call = time.time()
            t0 = time.perf_counter()
            await work()
            recorder.add([(item.tp.partition, item.key, item.offset)], time.perf_counter() - t0)

        config = pyrallel_config(env.bootstrap, group, row)
        started = time.time()
        finished: list[float] = []

        def watch() -> None:
            finished.append(wait_committed(env.bootstrap, group, topic, ends, timeout=env.timeout))

        async def main() -> None:
            consumer = PyrallelConsumer(config, worker, topic)
            await consumer.start()
            watcher = threading.Thread(target=watch, name="bench-pyrallel-watch", daemon=True)
            watcher.start()
            try:
                while watcher.is_alive():
                    await asyncio.sleep(0.01)
            finally:
                await consumer.stop()

        # It warns on every back-pressure pause and rebalance (routine here): keep the output
        # to the benchmark's own lines; errors still show.
        logging.getLogger("pyrallel_consumer").setLevel(logging.ERROR)
        asyncio.run(main())
        # It leaves its producer to the garbage collector: collect it now, while the broker is
        # up, not at exit after a local broker stopped (librdkafka would log the disconnect).
        gc.collect()
        if not finished:
            raise RuntimeError(f"pyrallel {row.name}: commits never reached {ends}")
        assert recorder.first_call is not None
        return Observation(
            started=started,
            first_call=recorder.first_call,
            finished=finished[0],
            log=recorder.log,
            extra={
                "version": importlib.metadata.version("pyrallel-consumer"),
                "clock": "commit seen by polling the group's committed offsets every 5 ms",
            },
        )
