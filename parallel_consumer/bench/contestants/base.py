"""What a contestant is: something that runs a row on a topic and reports what it saw."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from parallel_consumer.bench.model import Observation, Row

__all__ = ["Contestant", "LogRecorder", "RunEnv"]


@dataclass(frozen=True)
class RunEnv:
    """Where and how long: the broker, and the most a single run may take."""

    bootstrap: str
    timeout: float = 600.0


class Contestant(Protocol):
    """One way of consuming: this library, a peer library, or a plain client loop."""

    #: Name on the command line and in the table.
    name: str
    #: One line for ``pc-bench list`` and the docs.
    description: str

    def unavailable(self) -> str | None:
        """Why this contestant cannot run at all here (missing package, Java ...), or None."""

    def unsupported(self, row: Row) -> str | None:
        """Why this contestant does not run ``row`` (an ordering it lacks ...), or None."""

    def run(self, env: RunEnv, row: Row, topic: str, ends: dict[int, int]) -> Observation:
        """Consume ``topic`` (data from offset 0 up to ``ends``) with a fresh group, doing the
        row's work per record, until every record is processed and its commit acknowledged."""


class LogRecorder:
    """Collects what a handler saw as cheaply as it can: one list append per record (atomic
    under the GIL, no lock); the checks run after the run (``measure``)."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.first_call: float | None = None
        self.log: list[tuple[int, Any, int, float]] = []
        self.done = threading.Event()

    def call(self, work: Callable[[], None], records: list[tuple[int, Any, int]]) -> None:
        """Run ``work`` once for ``records`` (a handler call) and log them."""
        if self.first_call is None:
            self.first_call = time.time()
        started = time.perf_counter()
        work()
        self.add(records, time.perf_counter() - started)

    def add(self, records: list[tuple[int, Any, int]], took: float) -> None:
        share = took / len(records)
        append = self.log.append
        for partition, key, offset in records:
            append((partition, key, offset, share))
        if len(self.log) >= self.expected:
            self.done.set()

    def wait(self, timeout: float, what: str) -> None:
        if not self.done.wait(timeout):
            raise RuntimeError(
                f"{what}: only {len(self.log)}/{self.expected} records in {timeout:g} s"
            )
