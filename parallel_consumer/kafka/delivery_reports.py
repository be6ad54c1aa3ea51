"""The delivery reports of the library's producer, gathered per handler call (or per run) on the
producer thread until the call is settled; and why an output was not delivered (the brokers
refusing the write becomes :class:`~parallel_consumer.errors.AccessDenied`)."""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError

from parallel_consumer.errors import AccessDenied
from parallel_consumer.kafka.access import is_refusal, what_to_grant
from parallel_consumer.produce import ProduceError

__all__ = ["CallDelivery", "RunDelivery", "Settled", "SettledRun", "not_delivered", "refused"]

_DELIVERY_HINTS = {
    KafkaError._MSG_TIMED_OUT: (
        " (within the producer's message.timeout.ms: does the topic exist, and is the broker "
        "reachable?)"
    ),
    KafkaError.UNKNOWN_TOPIC_OR_PART: " (the topic or partition does not exist)",
    KafkaError.MSG_SIZE_TOO_LARGE: " (over the broker's or topic's max message size)",
}


Settled = tuple[int, tuple[tuple[int, int] | BaseException | None, ...]]
#: A run's outputs all settled: (run id, None or the first failure per input index).
SettledRun = tuple[int, dict[int, BaseException] | None]


def not_delivered(index: int, error: Any, message: Any) -> BaseException:
    """Why output ``index`` of a call was not delivered (``error``: a KafkaError of its
    delivery report, or the exception that rejected it)."""
    if isinstance(error, BaseException):
        return error
    topic = message.topic() if message is not None else "?"
    return refused(f"output {index} to {topic} was not delivered", error, topic) or ProduceError(
        f"output {index} to {topic} was not delivered: {error}"
        + (_DELIVERY_HINTS.get(error.code(), "") if isinstance(error, KafkaError) else "")
    )


def refused(what: str, error: Any, topic: str) -> AccessDenied | None:
    """An :class:`AccessDenied` when ``error`` is the brokers refusing the write, else None."""
    if isinstance(error, KafkaError) and is_refusal(error.code()):
        advice = what_to_grant(error.code(), "WRITE", topic)
        return AccessDenied(
            f"{what}: {error} ({advice}; the records are retried until then)", topic=topic
        )
    return None


class CallDelivery:
    """The delivery reports of one call's outputs; once all arrived, the call is settled."""

    __slots__ = ("_lock", "_remaining", "_settled", "batch", "results")

    def __init__(
        self, batch: int, count: int, settled: deque[Settled], lock: threading.Lock
    ) -> None:
        self.batch = batch
        self.results: list[tuple[int, int] | BaseException | None] = [None] * count
        self._remaining = count
        self._lock = lock  # shared by all calls: contention is rare, a lock per call is not
        self._settled = settled

    def call_span(self, index: int) -> tuple[int, int]:
        """The outputs of the call that returned output ``index``: all of them."""
        return 0, len(self.results)

    def report(self, index: int, error: Any, message: Any) -> None:
        # Runs on the producer thread (delivery reports) or the controller (a produce() that
        # failed at once).
        if error is None:
            result: tuple[int, int] | BaseException = (message.partition(), message.offset())
        else:
            result = not_delivered(index, error, message)
        with self._lock:
            self.results[index] = result
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            # Posted by the producer thread, with every other call settled meanwhile.
            self._settled.append((self.batch, tuple(self.results)))


class RunDelivery:
    """The delivery reports of a run's outputs (see RunOutputs): only failures are kept, per
    input (``owners[i]`` returned output ``i``)."""

    __slots__ = ("_lock", "_owners", "_remaining", "_settled", "failures", "run")

    def __init__(
        self,
        run: int,
        owners: Sequence[int],
        settled: deque[SettledRun],
        lock: threading.Lock,
    ) -> None:
        self.run = run
        self._owners = owners
        self._remaining = len(owners)
        self._lock = lock
        self._settled = settled
        self.failures: dict[int, BaseException] | None = None

    def call_span(self, index: int) -> tuple[int, int]:
        """The outputs of the call that returned output ``index`` (``owners`` ascend)."""
        owner = self._owners[index]
        return bisect_left(self._owners, owner), bisect_right(self._owners, owner)

    def report(self, index: int, error: Any, message: Any) -> None:
        with self._lock:
            if error is not None:
                if self.failures is None:
                    self.failures = {}
                owner = self._owners[index]
                if owner not in self.failures:
                    first = self.call_span(index)[0]
                    self.failures[owner] = not_delivered(index - first, error, message)
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self._settled.append((self.run, self.failures))
