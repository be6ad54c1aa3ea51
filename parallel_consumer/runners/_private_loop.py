"""The private event loop of the asyncio runner: making it from ``Options.loop_factory``, and
watching that handlers do not block it. (On the caller's loop neither applies: the application
made that loop, and what blocks it may be its own code.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from parallel_consumer.errors import ConfigurationError

__all__ = ["LAG_CHECK", "LAG_WARNING", "LAG_WARNING_EVERY", "LagWatch", "new_loop"]

log = logging.getLogger("parallel_consumer")

#: The loop checks every LAG_CHECK seconds that its timers run on time; a delay above
#: LAG_WARNING means a handler blocked the loop (time.sleep, a synchronous client, heavy CPU).
LAG_CHECK = 0.25
LAG_WARNING = 0.5
#: At most one blocked-loop warning per this many seconds.
LAG_WARNING_EVERY = 60.0


class LagWatch:
    """Checks, on the loop's thread, that the loop's timers run on time; owns the count of
    blocked passes and when it last warned."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._name = name
        self._last_warning = -LAG_WARNING_EVERY
        #: How often the loop was found blocked for longer than LAG_WARNING.
        self.blocked_count = 0

    def check(self, expected: float) -> None:
        loop = self._loop
        now = loop.time()
        lag = now - expected
        if lag > LAG_WARNING:
            self.blocked_count += 1
            if now - self._last_warning >= LAG_WARNING_EVERY:
                self._last_warning = now
                log.warning(
                    "the event loop %s was blocked for %.2fs: an async handler ran "
                    "blocking code (time.sleep, a synchronous client, heavy CPU) and every other "
                    "call waited; await asyncio.sleep / an async client instead, or move the "
                    "blocking part to loop.run_in_executor",
                    self._name,
                    lag,
                )
        loop.call_later(LAG_CHECK, self.check, now + LAG_CHECK)


def new_loop(factory: Callable[[], asyncio.AbstractEventLoop]) -> asyncio.AbstractEventLoop:
    """A fresh loop from ``factory`` (Options.loop_factory), checked: a wrong factory fails
    the start of the consumer with a clear error, not its first call."""
    try:
        loop = factory()
    except Exception as exc:
        raise ConfigurationError(f"Options.loop_factory {factory!r} failed: {exc!r}") from exc
    if not isinstance(loop, asyncio.AbstractEventLoop):
        raise ConfigurationError(
            f"Options.loop_factory {factory!r} returned {loop!r}, not an asyncio event loop"
        )
    if loop.is_running() or loop.is_closed():
        raise ConfigurationError(
            f"Options.loop_factory {factory!r} returned a loop that is running or closed; it "
            "must make a new loop each time (the runner runs it in its own thread)"
        )
    return loop
