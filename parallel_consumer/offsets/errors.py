"""Errors raised while reading committed offset metadata."""

from __future__ import annotations

from parallel_consumer.errors import ParallelConsumerError

__all__ = ["KafkaStreamsMetadataError", "OffsetDecodeError"]


class OffsetDecodeError(ParallelConsumerError, ValueError):
    """The committed metadata string is not an offset map this library can read.

    Raised for every malformed input: bad base64, an unknown or non-decodable magic byte, truncated
    data, a bad zstd frame, negative or hostile length fields, or a map that would decode to more
    incomplete offsets than :data:`~parallel_consumer.offsets.MAX_DECODED_INCOMPLETES`. The engine
    treats it like Java's ``OffsetDecodingError``: log it, discard the metadata and replay from the
    committed offset.
    """


class KafkaStreamsMetadataError(OffsetDecodeError):
    """The metadata was written by Kafka Streams (magic 0x01 or 0x02), not by a parallel consumer.

    Kept separate so the engine can apply its invalid-metadata policy (fail, or ignore and replay).
    """
