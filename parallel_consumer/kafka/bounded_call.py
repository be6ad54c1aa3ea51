"""A blocking client call with a deadline of the library's own.

librdkafka's transactional calls take a timeout, but after a coordinator failover
``send_offsets_to_transaction`` was seen to block for minutes past it. :func:`call_within`
runs such a call on a helper thread and gives up waiting after ``seconds``; the caller then
abandons the client (the call ends with it, on its own thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["CallStuck", "call_within"]


class CallStuck(Exception):
    """The call did not return within its deadline (it still runs on its thread)."""


def call_within(call: Callable[[], object], seconds: float, *, name: str) -> None:
    """Run ``call`` on a daemon thread named ``name``; raise what it raised, or
    :class:`CallStuck` if it has not returned after ``seconds``."""
    done = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the caller
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    if not done.wait(seconds):
        raise CallStuck(f"{name} did not return within {seconds:.0f}s")
    if failure:
        raise failure[0]
