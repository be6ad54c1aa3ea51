"""Where user code runs. The controller drives every runner through :class:`Runner`."""

from __future__ import annotations

from parallel_consumer.runners.asyncio_loop import AsyncioRunner
from parallel_consumer.runners.base import CallCancelled, Runner
from parallel_consumer.runners.processes import (
    DetachedRecord,
    ProcessRunner,
    RemoteError,
    WorkerCrashed,
)
from parallel_consumer.runners.threads import ThreadRunner

__all__ = [
    "AsyncioRunner",
    "CallCancelled",
    "DetachedRecord",
    "ProcessRunner",
    "RemoteError",
    "Runner",
    "ThreadRunner",
    "WorkerCrashed",
]
