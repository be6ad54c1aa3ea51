"""What a workload is: an id, a title, and its rows at a scale."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from parallel_consumer.bench.model import Row

__all__ = ["Scale", "Workload"]

#: ``full``: the docs/benchmarks.md parameters; ``quick``: the README's run (minutes);
#: ``tiny``: seconds, for tests.
Scale = Literal["full", "quick", "tiny"]


@dataclass(frozen=True)
class Workload:
    id: str
    title: str
    rows: Callable[[Scale], list[Row]]
    #: Why this workload cannot run with this installation (an engine API it needs), or None.
    requires: Callable[[], str | None] = lambda: None
