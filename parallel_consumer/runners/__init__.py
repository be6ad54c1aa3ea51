"""Where user code runs. The controller drives every runner through :class:`Runner`."""

from __future__ import annotations

from parallel_consumer.runners.base import Runner
from parallel_consumer.runners.threads import ThreadRunner

__all__ = ["Runner", "ThreadRunner"]
