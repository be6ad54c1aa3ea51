"""What a contestant is: something that runs a row on a topic and reports what it saw."""

from __future__ import annotations

import itertools
import threading
import time
from array import array
from collections.abc import Callable, Iterable
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


class _Columns:
    """One thread's share of a log: a flat array of ints (sequence number, partition, offset
    per record), a list of keys and an array of call times, so that logging a record allocates
    no object the garbage collector tracks (a tuple per record would: 200,000 of them, kept to
    the end, set off collections that pause every thread of the contestant)."""

    __slots__ = ("ints", "keys", "took")

    def __init__(self) -> None:
        self.ints = array("q")
        self.keys: list[Any] = []
        self.took = array("d")


def _first(entry: tuple[Any, ...]) -> Any:
    return entry[0]


class LogRecorder:
    """Collects what a handler saw as cheaply as it can (the harness's cost must not weigh on
    any contestant): each thread appends to its own columns, with no lock and no object the
    garbage collector tracks; the checks run after the run, on :attr:`log`.

    ``done`` is set when the last record took its sequence number, possibly before another
    thread finished writing an earlier one: read :attr:`log` once the contestant's threads
    have stopped (every contestant does, after closing its consumer)."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.first_call: float | None = None
        self.done = threading.Event()
        self._local = threading.local()
        self._columns: list[_Columns] = []
        # next() on a C iterator is atomic under the GIL: the count of records logged so far.
        self._counter = itertools.count(1)
        self._count = 0

    def _new_columns(self) -> _Columns:
        columns = self._local.columns = _Columns()
        self._columns.append(columns)
        return columns

    def call(self, work: Callable[[], None], records: list[tuple[int, Any, int]]) -> None:
        """Run ``work`` once for ``records`` (a handler call) and log them."""
        if self.first_call is None:
            self.first_call = time.time()
        started = time.perf_counter()
        work()
        self.add(records, time.perf_counter() - started)

    def add(self, records: Iterable[tuple[int, Any, int]], took: float) -> None:
        """Log ``records`` as one call that took ``took`` seconds."""
        try:
            columns: _Columns = self._local.columns
        except AttributeError:
            columns = self._new_columns()
        ints, keys = columns.ints, columns.keys
        counter = self._counter
        count = 0
        for partition, key, offset in records:
            count = next(counter)
            ints.extend((count, partition, offset))
            keys.append(key)
        if not count:
            return
        added = len(keys) - len(columns.took)
        columns.took.extend(itertools.repeat(took / added, added))
        self._count = count
        if count >= self.expected:
            self.done.set()

    def add_one(self, partition: int, key: Any, offset: int, took: float) -> None:
        """Log one record (:meth:`add` without its sequence); the first sets ``first_call``."""
        if self.first_call is None:
            self.first_call = time.time()
        try:
            columns: _Columns = self._local.columns
        except AttributeError:
            columns = self._new_columns()
        count = self._count = next(self._counter)
        columns.ints.extend((count, partition, offset))
        columns.keys.append(key)
        columns.took.append(took)
        if count >= self.expected:
            self.done.set()

    @property
    def count(self) -> int:
        """About how many records were logged (exact once the contestant's threads stopped)."""
        return self._count

    @property
    def log(self) -> list[tuple[int, Any, int, float]]:
        """Every record logged, one ``(partition, key, offset, seconds)`` each, in the order
        they were logged (across threads). Built on demand: read it after the run."""
        entries: list[tuple[int, int, Any, int, float]] = []
        for c in list(self._columns):
            # (a thread still logging may have written part of its last record: cut it off)
            n = min(len(c.ints) // 3, len(c.keys), len(c.took))
            ints = c.ints
            entries.extend(
                (ints[3 * i], ints[3 * i + 1], c.keys[i], ints[3 * i + 2], c.took[i])
                for i in range(n)
            )
        entries.sort(key=_first)
        return [entry[1:] for entry in entries]

    def wait(self, timeout: float, what: str) -> None:
        if not self.done.wait(timeout):
            raise RuntimeError(
                f"{what}: only {self.count}/{self.expected} records in {timeout:g} s"
            )
