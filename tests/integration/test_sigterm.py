"""A service stopped with SIGTERM (as Kubernetes stops a pod) commits what it finished.

The app (``tests/run_app.py``) runs ``pc.run()`` in its main thread; the commit interval is a
minute, so everything committed at the end was committed by the graceful close. The restart
must then re-run none of the records the first process finished.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = pytest.mark.kafka

APP = Path(__file__).resolve().parents[1] / "run_app.py"
RECORDS = 1_000


class App:
    """The app in a subprocess, its ``done`` lines read as they come."""

    def __init__(self, *args: str) -> None:
        self.done: list[tuple[int, int]] = []
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, str(APP), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("done "):
                _, partition, offset = line.split()
                self.done.append((int(partition), int(offset)))

    def wait(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._reader.join(5)
            assert self.process.stdout is not None
            self.process.stdout.close()
        return code


def _wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_sigterm_commits_what_finished_and_the_restart_replays_only_the_rest(
    kafka: KafkaBroker, topic: TopicFactory, group_id: str
) -> None:
    # Given 1,000 records on 2 partitions and an app processing them (20 ms a call)
    name = topic(2)
    produce_records(
        kafka.bootstrap_servers, name, RECORDS, keys=[f"k{i % 50}" for i in range(RECORDS)]
    )
    first = App(kafka.bootstrap_servers, name, group_id)
    try:
        _wait_for(lambda: len(first.done) >= 200, 60)
        # When it gets SIGTERM mid-run
        first.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = first.wait(45)
    finally:
        if first.process.poll() is None:
            first.process.kill()
    took = time.monotonic() - started
    print(f"\nfirst run: {len(first.done)} records, closed {took:.2f}s after SIGTERM")
    # Then it closed gracefully and exited 0 well within the close bound
    assert code == 0, "\n".join(first.lines[-30:])
    assert "closed" in first.lines
    assert len(first.done) < RECORDS, "the app finished before the signal: nothing to check"
    # When the app starts again (and stops once idle)
    second = App(kafka.bootstrap_servers, name, group_id, "3")
    assert second.wait(120) == 0, "\n".join(second.lines[-30:])
    print(f"second run: {len(second.done)} records")
    # Then it ran exactly the records the first one had not finished: none twice, none lost
    assert not set(first.done) & set(second.done)
    assert len(set(first.done) | set(second.done)) == RECORDS
