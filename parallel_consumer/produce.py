"""What a ``poll_and_produce`` handler returns, and what ``on_produced`` receives.

A handler registered with :meth:`ParallelConsumer.poll_and_produce` returns a
:class:`ProducerRecord`, a list (or tuple) of them, or ``None``. Its input records count as done
only once the broker acknowledged every output; a failed delivery fails them (they are retried).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from parallel_consumer.errors import ProduceError

if TYPE_CHECKING:
    from parallel_consumer.context import PollContext

__all__ = ["ProduceError", "ProduceResult", "ProducerRecord", "outputs_of"]

Bytes = bytes | str | None
HeaderList = list[tuple[str, bytes | None]]


def _as_bytes(name: str, value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"ProducerRecord.{name} must be bytes, str or None, got {type(value).__name__}")


def _headers(value: object) -> HeaderList:
    if value is None:
        return []
    pairs: Any = value.items() if isinstance(value, Mapping) else value
    out: HeaderList = []
    try:
        for name, header in pairs:
            if not isinstance(name, str):
                raise TypeError
            out.append((name, _as_bytes("headers", header)))
    except (TypeError, ValueError):
        raise TypeError(
            "ProducerRecord.headers must be a dict or a list of (str, bytes | str | None) pairs, "
            f"got {value!r}"
        ) from None
    return out


@dataclass(frozen=True, slots=True, init=False)
class ProducerRecord:
    """One record to produce: ``topic`` and ``value`` (bytes or str; str is UTF-8 encoded),
    optional ``key``, ``headers`` (a dict or a list of pairs) and ``partition`` (default: the
    producer's partitioner, by key). To keep per-key order in the output, give outputs of one
    input key one output key (or partition)."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    headers: HeaderList = field(default_factory=list)
    partition: int | None = None

    def __init__(
        self,
        topic: str,
        value: Bytes,
        key: Bytes = None,
        headers: Mapping[str, Bytes] | list[tuple[str, Bytes]] | None = None,
        partition: int | None = None,
    ) -> None:
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"ProducerRecord.topic must be a non-empty str, got {topic!r}")
        if partition is not None and (
            not isinstance(partition, int) or isinstance(partition, bool) or partition < 0
        ):
            raise TypeError(f"ProducerRecord.partition must be an int >= 0, got {partition!r}")
        setattr_ = object.__setattr__
        setattr_(self, "topic", topic)
        setattr_(self, "value", _as_bytes("value", value))
        setattr_(self, "key", _as_bytes("key", key))
        setattr_(self, "headers", _headers(headers))
        setattr_(self, "partition", partition)

    def __repr__(self) -> str:
        where = self.topic if self.partition is None else f"{self.topic}[{self.partition}]"
        size = 0 if self.value is None else len(self.value)
        return f"<ProducerRecord {where} key={self.key!r} value={size} bytes>"


@dataclass(frozen=True, slots=True)
class ProduceResult:
    """Passed to ``on_produced`` once the broker acknowledged one output."""

    #: The handler's input (one record, or a batch with ``batch_size > 1``).
    context: PollContext
    record: ProducerRecord
    partition: int
    offset: int


def outputs_of(value: object) -> list[ProducerRecord]:
    """The outputs a ``poll_and_produce`` handler returned (raises TypeError otherwise)."""
    if value is None:
        return []
    if isinstance(value, ProducerRecord):
        return [value]
    if isinstance(value, list | tuple):
        for item in value:
            if not isinstance(item, ProducerRecord):
                raise TypeError(
                    "a poll_and_produce handler must return a ProducerRecord, a list of them or "
                    f"None; the list holds {type(item).__name__}"
                )
        return list(value)
    raise TypeError(
        "a poll_and_produce handler must return a ProducerRecord, a list of them or None, "
        f"got {type(value).__name__}"
    )
