"""Exactly-once under crashes: a transactional pipeline SIGKILLed again and again.

A worker process (``tests/produce_worker.py``) turns 20,000 inputs into one output each while
the test kills it with SIGKILL at random points of its progress and starts it again. A
``read_committed`` reader of the output must then see every input's output exactly once. The
same test with the asynchronous consumer commit mode must see duplicates: it shows the test can
tell the difference.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from engine_support import committed, end_offsets
from produce_support import read_outputs

from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = pytest.mark.kafka

RECORDS = 20_000
PARTITIONS = (0, 1, 2, 3)
KILLS = 5
WORKER = Path(__file__).resolve().parents[1] / "produce_worker.py"


class Worker:
    """One run of the worker process; ``produced`` follows its progress lines."""

    def __init__(self, args: list[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.produced = 0
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("produced "):
                self.produced = int(line.split()[1])

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self._done()

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(60)
        self._done()
        return code

    def _done(self) -> None:
        self._reader.join(5)
        assert self.process.stdout is not None
        self.process.stdout.close()


def run_with_kills(
    kafka: KafkaBroker, source: str, sink: str, group: str, mode: str, seed: int
) -> list[int]:
    """Run the worker, SIGKILL it KILLS times at random progress, then let a last run finish.
    Returns how many outputs each killed run had acknowledged when it was killed."""
    rng = random.Random(seed)
    args = [kafka.bootstrap_servers, source, sink, group, mode, "member-1"]
    progress = []
    for _ in range(KILLS):
        worker = Worker(args)
        target = rng.randrange(300, 2_500)
        deadline = time.monotonic() + 60
        while worker.produced < target and worker.process.poll() is None:
            if time.monotonic() > deadline:
                worker.kill()
                pytest.fail(f"worker made no progress to {target}: {worker.lines[-20:]}")
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.05))
        worker.kill()
        progress.append(worker.produced)
    worker = Worker(args)
    ends = end_offsets(kafka.bootstrap_servers, source, PARTITIONS)
    deadline = time.monotonic() + 120
    while True:
        offsets = committed(
            {"bootstrap.servers": kafka.bootstrap_servers, "group.id": group}, source, PARTITIONS
        )
        if all(offsets[p][0] == ends[p] for p in PARTITIONS):
            break
        if worker.process.poll() is not None or time.monotonic() > deadline:
            worker.kill()
            pytest.fail(f"the last run did not commit to the end: {offsets} {worker.lines[-20:]}")
        time.sleep(0.2)
    assert worker.stop() == 0, worker.lines[-20:]
    return progress


@pytest.mark.kafka_requires("transactions")
@pytest.mark.parametrize("mode", ["transactional", "async"])
def test_only_the_transactional_pipeline_outputs_each_input_exactly_once_across_kills(
    kafka: KafkaBroker, topic: TopicFactory, group_id: str, mode: str
) -> None:
    # Given 20,000 inputs with 100 keys over 4 partitions
    seed = random.randrange(2**32)
    print(f"\nseed {seed}")
    source, sink = topic(len(PARTITIONS)), topic(len(PARTITIONS))
    produce_records(kafka.bootstrap_servers, source, RECORDS, keys=[f"k{i}" for i in range(100)])
    # When the pipeline is SIGKILLed five times mid-stream, then runs to the end
    progress = run_with_kills(kafka, source, sink, group_id, mode, seed)
    print(f"killed after {progress} outputs")
    # Then a read_committed reader finds every input's output
    outputs = read_outputs(kafka.bootstrap_servers, sink, PARTITIONS)
    ends = end_offsets(kafka.bootstrap_servers, source, PARTITIONS)
    assert set(outputs.inputs) == {(p, o) for p in PARTITIONS for o in range(ends[p])}
    print(f"duplicates: {outputs.duplicates}")
    if mode == "transactional":
        # exactly once, in key order; the aborted outputs are in the log, invisible to it
        assert outputs.duplicates == 0
        assert outputs.order_violations() == []
        everything = read_outputs(kafka.bootstrap_servers, sink, PARTITIONS, read_committed=False)
        print(f"outputs in the log including aborted ones: {sum(everything.inputs.values())}")
    else:
        # while without transactions the same kills leave duplicates: the test tells them apart
        assert outputs.duplicates > 0
