"""Keys and values through confluent-kafka's serializer API (``Options.key_deserializer``,
``value_deserializer``, ``key_serializer``, ``value_serializer``).

Any callable ``(data, SerializationContext) -> object`` works, so confluent-kafka's own
``StringDeserializer``, ``IntegerDeserializer`` and the Schema Registry's Avro, JSON Schema and
Protobuf (de)serializers plug in as they are. The handler is wrapped once at registration:

- Before the call, each record's key and value are deserialized and the handler sees them as
  ``ctx.key`` / ``ctx.value`` (the raw bytes stay in ``ctx.raw_key`` / ``ctx.raw_value``). A
  record that cannot be deserialized fails with :class:`SerializationError` (never retried:
  dead-lettered with its raw bytes, per ``on_retries_exhausted``); the other records of a batch
  still run.
- After a ``poll_and_produce`` call, each output's key and value that are not bytes already are
  serialized for its topic; an output that cannot be fails the call with
  :class:`SerializationError`.

The wrapping runs on the handler's own thread (or event loop, or worker process), never on the
controller: no per-record cost when no (de)serializer is set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka.serialization import MessageField, SerializationContext

from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.errors import SerializationError
from parallel_consumer.options import Options
from parallel_consumer.produce import ProducerRecord, returned_outputs

__all__ = ["Codec", "Codecs", "DecodedRecord", "deserializing"]

Codec = Callable[[Any, SerializationContext], Any]


class DecodedRecord(RecordContext):
    """A :class:`RecordContext` whose ``key`` and ``value`` are the deserialized ones."""

    __slots__ = ("_key", "_value")

    def __init__(self, record: RecordContext, key: Any, value: Any) -> None:
        # (the record's own message: in a worker process of runner="process" its ``message``
        # property refuses to hand it out, but topic, offset and the rest read through it)
        super().__init__(
            record._message, record.attempts, record.last_failure, record.last_failure_at
        )
        self._key = key
        self._value = value

    @property
    def key(self) -> Any:
        return self._key

    @property
    def value(self) -> Any:
        return self._value


@dataclass(frozen=True, slots=True)
class Codecs:
    """The four (de)serializers of one consumer; None leaves that part as bytes."""

    key_deserializer: Codec | None = None
    value_deserializer: Codec | None = None
    key_serializer: Codec | None = None
    value_serializer: Codec | None = None

    @classmethod
    def of(cls, options: Options, *, produces: bool) -> Codecs:
        """The codecs ``options`` name; serializers only for a handler whose outputs are
        produced."""
        return cls(
            options.key_deserializer,
            options.value_deserializer,
            options.key_serializer if produces else None,
            options.value_serializer if produces else None,
        )

    @property
    def deserializes(self) -> bool:
        return self.key_deserializer is not None or self.value_deserializer is not None

    @property
    def serializes(self) -> bool:
        return self.key_serializer is not None or self.value_serializer is not None

    def decode(self, record: RecordContext) -> DecodedRecord:
        """``record`` with its key and value deserialized (SerializationError otherwise)."""
        topic = record.topic
        headers = record.headers
        key = record.raw_key
        value = record.raw_value
        if self.key_deserializer is not None:
            key = _run(self.key_deserializer, key, topic, MessageField.KEY, headers, record, "key")
        if self.value_deserializer is not None:
            value = _run(
                self.value_deserializer, value, topic, MessageField.VALUE, headers, record, "value"
            )
        return DecodedRecord(record, key, value)

    def encode(self, output: ProducerRecord) -> ProducerRecord:
        """``output`` with its key and value serialized for its topic where a serializer is
        set: objects, and str as given (a Schema Registry or JSON serializer frames a str too);
        bytes as they are."""
        key = _serialized(
            self.key_serializer, output.key, output._key_text, output, MessageField.KEY, "key"
        )
        value = _serialized(
            self.value_serializer,
            output.value,
            output._value_text,
            output,
            MessageField.VALUE,
            "value",
        )
        if key is output.key and value is output.value:
            return output
        return dataclasses.replace(output, key=key, value=value)

    def encode_all(self, returned: object) -> object:
        outputs = returned_outputs(returned)
        return [self.encode(output) for output in outputs] if outputs else returned


def _serialized(
    codec: Codec | None,
    data: Any,
    text: str | None,
    output: ProducerRecord,
    field: MessageField,
    part: str,
) -> Any:
    if codec is None:
        return data
    source = text if text is not None else data
    if source is None or isinstance(source, bytes):
        return data
    return _run(codec, source, output.topic, field, output.headers, None, part)


def _run(
    codec: Codec,
    data: Any,
    topic: str,
    field: MessageField,
    headers: Any,
    record: RecordContext | None,
    part: str,
) -> Any:
    try:
        return codec(data, SerializationContext(topic, field, headers))
    except Exception as exc:
        verb = "deserialize" if record is not None else "serialize"
        where = (
            f"{record.topic}[{record.partition}]@{record.offset}"
            if record is not None
            else f"an output to {topic}"
        )
        raise SerializationError(
            f"could not {verb} the {part} of {where} with {codec!r}: {exc!r}"
        ) from exc


def _decoded(codecs: Codecs, ctx: PollContext) -> tuple[PollContext | None, list[DecodedRecord]]:
    """The context the handler sees (None: no record could be deserialized), after failing in
    ``ctx`` every record that could not be."""
    decoded: list[DecodedRecord] = []
    for record in ctx:
        try:
            decoded.append(codecs.decode(record))
        except SerializationError as exc:
            if len(ctx) == 1:
                raise
            ctx.fail(record, exc)
    if not decoded:
        return None, decoded
    return ctx.derived(decoded), decoded


def _merge_failures(ctx: PollContext, inner: PollContext, decoded: list[DecodedRecord]) -> None:
    """Records the handler failed in ``inner`` (with ``ctx.fail``) fail in the runner's ``ctx``."""
    if inner.has_failures:
        for index, error in inner.failures.items():
            ctx.fail(decoded[index], error)


class _Deserializing:
    """A plain handler behind the codecs (a class, so that the process runner can pickle it
    when the handler and the codecs pickle)."""

    def __init__(self, handler: Callable[[PollContext], object], codecs: Codecs) -> None:
        self.handler = handler
        self.codecs = codecs

    def __call__(self, ctx: PollContext) -> object:
        codecs = self.codecs
        inner, decoded = _decoded(codecs, ctx) if codecs.deserializes else (ctx, [])
        if inner is None:
            return None
        result = self.handler(inner)
        if inner is not ctx:
            _merge_failures(ctx, inner, decoded)
        return codecs.encode_all(result) if codecs.serializes else result

    def __repr__(self) -> str:
        return repr(self.handler)


class _AsyncDeserializing(_Deserializing):
    async def __call__(self, ctx: PollContext) -> object:
        codecs = self.codecs
        inner, decoded = _decoded(codecs, ctx) if codecs.deserializes else (ctx, [])
        if inner is None:
            return None
        result = await cast(Awaitable[object], self.handler(inner))
        if inner is not ctx:
            _merge_failures(ctx, inner, decoded)
        return codecs.encode_all(result) if codecs.serializes else result


def deserializing(
    handler: Callable[[PollContext], object], codecs: Codecs, *, is_async: bool
) -> Callable[[PollContext], object]:
    """``handler`` behind ``codecs``; ``handler`` itself when no codec is set."""
    if not (codecs.deserializes or codecs.serializes):
        return handler
    return (_AsyncDeserializing if is_async else _Deserializing)(handler, codecs)
