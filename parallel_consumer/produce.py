"""What a ``poll_and_produce`` handler returns, and what ``on_produced`` receives.

A handler registered with :meth:`ParallelConsumer.poll_and_produce` returns a
:class:`ProducerRecord`, a list (or tuple) of them, or ``None``. Its input records count as done
only once the broker acknowledged every output; a failed delivery fails them (they are retried).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from parallel_consumer.errors import InvalidOutput, ProduceError

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


def _as_payload(value: object) -> Any:
    """A key or value: bytes as bytes (str UTF-8 encoded); any other object as it is, for
    ``Options.key_serializer`` / ``value_serializer`` to serialize (see :func:`outputs_of`)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


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
    input key one output key (or partition). With ``Options.value_serializer`` (or
    ``key_serializer``) set, ``value`` (``key``) may be any object the serializer takes."""

    topic: str
    value: Any
    key: Any = None
    headers: HeaderList = field(default_factory=list)
    partition: int | None = None
    #: A str key / value as given, for ``Options.key_serializer`` / ``value_serializer``
    #: (``key`` and ``value`` hold its UTF-8 bytes, for everything else).
    _key_text: str | None = field(default=None, init=False, repr=False, compare=False)
    _value_text: str | None = field(default=None, init=False, repr=False, compare=False)

    def __init__(
        self,
        topic: str,
        value: object,
        key: object = None,
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
        setattr_(self, "value", _as_payload(value))
        setattr_(self, "key", _as_payload(key))
        setattr_(self, "_value_text", value if isinstance(value, str) else None)
        setattr_(self, "_key_text", key if isinstance(key, str) else None)
        setattr_(self, "headers", _headers(headers))
        setattr_(self, "partition", partition)

    def __repr__(self) -> str:
        where = self.topic if self.partition is None else f"{self.topic}[{self.partition}]"
        if self.value is None or isinstance(self.value, bytes):
            size = 0 if self.value is None else len(self.value)
            return f"<ProducerRecord {where} key={self.key!r} value={size} bytes>"
        return f"<ProducerRecord {where} key={self.key!r} value={type(self.value).__name__}>"


@dataclass(frozen=True, slots=True)
class ProduceResult:
    """Passed to ``on_produced`` once the broker acknowledged one output."""

    #: The handler's input (one record, or a batch with ``batch_size > 1``).
    context: PollContext
    record: ProducerRecord
    partition: int
    offset: int


def outputs_of(value: object) -> list[ProducerRecord]:
    """The outputs a ``poll_and_produce`` handler returned, ready to produce
    (:class:`InvalidOutput` otherwise: a programming error, never retried)."""
    outputs = returned_outputs(value)
    for output in outputs:
        for part in ("key", "value"):
            data = getattr(output, part)
            if data is not None and not isinstance(data, bytes):
                raise InvalidOutput(
                    f"the {part} of an output to {output.topic} is a {type(data).__name__}: pass "
                    f"bytes or str, or set Options.{part}_serializer to serialize it"
                )
    return outputs


def returned_outputs(value: object) -> list[ProducerRecord]:
    """The ``ProducerRecord`` s a handler returned, their keys and values not checked yet."""
    if value is None:
        return []
    if isinstance(value, ProducerRecord):
        outputs = [value]
    elif isinstance(value, list | tuple):
        for item in value:
            if not isinstance(item, ProducerRecord):
                raise InvalidOutput(
                    "a poll_and_produce handler must return a ProducerRecord, a list of them or "
                    f"None; the list holds {type(item).__name__}"
                )
        outputs = list(value)
    else:
        raise InvalidOutput(
            "a poll_and_produce handler must return a ProducerRecord, a list of them or None, "
            f"got {type(value).__name__}"
        )
    return outputs
