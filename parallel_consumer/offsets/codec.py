"""Encode and decode the offset map carried in a commit's metadata, byte-compatible with Java.

The payload is ``[magic byte][encoder data]``, the encoder data zstd-compressed for the
``*_COMPRESSED`` kinds, and the whole payload is standard base64 with ``=`` padding. The committed
Kafka offset is the *base*: relative offset ``r`` in the map is Kafka offset ``base + r``.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np

from parallel_consumer.offsets import _zstd
from parallel_consumer.offsets._ranges import RangeEncoder, range_encoder
from parallel_consumer.offsets.bitset import decode_bitset, encoded_bitset_size
from parallel_consumer.offsets.encoding import OffsetEncoding
from parallel_consumer.offsets.errors import KafkaStreamsMetadataError, OffsetDecodeError
from parallel_consumer.offsets.run_length import (
    decode_run_length,
    parse_runs,
    shortest_written_prefix,
)

if TYPE_CHECKING:
    from parallel_consumer.offsets._ranges import Int64s

__all__ = [
    "LARGE_ENCODED_SIZE_THRESHOLD_BYTES",
    "MAX_DECODED_INCOMPLETES",
    "DecodedOffsetMap",
    "EncodedOffsetMap",
    "decode_offset_map",
    "encode_offset_map",
    "read_committed_metadata",
]

#: Java compresses only when no plain encoding is under this size; we compress whenever it can win.
LARGE_ENCODED_SIZE_THRESHOLD_BYTES = 200
#: Decoding refuses maps with more incomplete offsets than this (hostile lengths, zstd bombs).
MAX_DECODED_INCOMPLETES = 1 << 20

_MAX_OFFSET = 2**63 - 1
_WIDTH = {1: 2, 2: 4}
_KAFKA_STREAMS = frozenset({OffsetEncoding.KAFKA_STREAMS, OffsetEncoding.KAFKA_STREAMS_V2})

# Tie-break among equal sizes, best first: plain before compressed (cheaper to read), v1 before v2
# (readable by the oldest Java releases), BitSet before RunLength.
_PREFERENCE = (
    OffsetEncoding.BIT_SET,
    OffsetEncoding.RUN_LENGTH,
    OffsetEncoding.BIT_SET_V2,
    OffsetEncoding.RUN_LENGTH_V2,
    OffsetEncoding.BIT_SET_COMPRESSED,
    OffsetEncoding.RUN_LENGTH_COMPRESSED,
    OffsetEncoding.BIT_SET_V2_COMPRESSED,
    OffsetEncoding.RUN_LENGTH_V2_COMPRESSED,
)
_RANK = {encoding: rank for rank, encoding in enumerate(_PREFERENCE)}
_NEVER = 2**63  # larger than any size or rank
_COMPRESSED = {encoding.plain: encoding for encoding in _PREFERENCE if encoding.compressed}


@dataclass(frozen=True, slots=True)
class EncodedOffsetMap:
    """An encoded offset map, ready to commit as ``OffsetAndMetadata(base, metadata)``.

    ``size`` is ``len(metadata)``: what the broker's ``offset.metadata.max.bytes`` applies to.
    """

    metadata: str
    encoding: OffsetEncoding
    size: int


@dataclass(frozen=True, slots=True)
class DecodedOffsetMap:
    """What a committed offset and its metadata say about a partition.

    ``incomplete`` is a sorted tuple (ascending, no duplicates): it comes out of the decoders in
    order for free and feeds a ``SortedList`` directly. Every offset in ``[base, highest_seen]``
    that is not in it was processed successfully and must be skipped when it is polled again.
    ``encoding`` is None when the metadata was empty.
    """

    base: int
    highest_seen: int
    incomplete: tuple[int, ...]
    encoding: OffsetEncoding | None


def encode_offset_map(
    base_offset: int,
    highest_succeeded: int,
    incomplete_offsets: Iterable[int],
    *,
    force: OffsetEncoding | None = None,
) -> EncodedOffsetMap | None:
    """Encode the range ``[base_offset, H]`` as Java's ``OffsetSimultaneousEncoder`` would.

    ``incomplete_offsets`` is any iterable of ints (a list, a ``SortedList``, a set, a
    generator), in any order; duplicates count once. A strictly increasing list or tuple is the
    fast path: it is checked, never sorted. Only the offsets in ``[base_offset,
    highest_succeeded)`` are encoded, every other offset of the range counts as complete. ``H``
    is ``highest_succeeded`` adjusted like Java: ``-1`` becomes ``base_offset`` and anything
    below ``base_offset - 1`` becomes ``base_offset - 1`` (an empty range). Raises ValueError
    for offsets that are not signed 64-bit integers.

    Without ``force`` every plain encoding that fits its length fields is a candidate, and so is
    the zstd-compressed form of each whenever it could be smaller (a superset of Java's "compress
    when nothing is under 200 bytes"). The smallest payload wins; ties go to the first of
    ``BIT_SET, RUN_LENGTH, BIT_SET_V2, RUN_LENGTH_V2`` and then their compressed forms in that
    order. With ``force`` only that encoding is tried. Returns None when nothing can encode the
    range (v1 and v2 length fields all overflow).
    """
    return _encode(base_offset, highest_succeeded, incomplete_offsets, force)


def encode_sorted_offset_map(
    base_offset: int,
    highest_succeeded: int,
    ordered: Int64s,
    force: OffsetEncoding | None,
) -> EncodedOffsetMap | None:
    """:func:`encode_offset_map` of offsets already made strictly increasing by
    :func:`~parallel_consumer.offsets._ranges.sorted_offsets` (for ``plan_commit``)."""
    return _encode(base_offset, highest_succeeded, ordered, force, presorted=True)


def _encode(
    base_offset: int,
    highest_succeeded: int,
    offsets: Iterable[int],
    force: OffsetEncoding | None,
    *,
    presorted: bool = False,
) -> EncodedOffsetMap | None:
    if force is not None and force not in _RANK:
        raise ValueError(f"cannot encode with {force.name}: it is not a decodable encoding")
    if base_offset < 0:
        raise ValueError(f"base_offset must be >= 0, got {base_offset}")
    if highest_succeeded > _MAX_OFFSET:
        raise ValueError(
            f"highest_succeeded must fit in a signed 64-bit integer, got {highest_succeeded}"
        )
    high = base_offset if highest_succeeded == -1 else highest_succeeded
    high = max(high, base_offset - 1)
    length = high - base_offset + 1
    if presorted:
        assert isinstance(offsets, np.ndarray)
        ranges = RangeEncoder.of_sorted(base_offset, highest_succeeded, length, offsets)
    else:
        ranges = range_encoder(base_offset, highest_succeeded, length, offsets)
    plan = _Candidates(length, ranges)
    if force is not None:
        data = plan.data(force.plain)
        if data is not None and force.compressed:
            data = _zstd.compress(data)
        return None if data is None else _wrap(force, data)
    return plan.smallest()


def decode_offset_map(
    committed_offset: int, metadata: str, *, exact: bool = False
) -> DecodedOffsetMap:
    """Decode a committed offset and its metadata string (any decodable encoding, Java's or ours).

    Empty metadata means no map: ``highest_seen = committed_offset - 1`` and nothing incomplete.
    Raises :class:`KafkaStreamsMetadataError` for Kafka Streams metadata and
    :class:`OffsetDecodeError` for anything else that is not an offset map.

    By default the metadata may carry stray characters after the map, as confluent-kafka returns
    maps written by the Java library (see ``docs/offset-metadata.md``): the map is cut out of the
    string exactly where that can be told, and otherwise read so that no offset counts as
    finished unless the writer marked it finished. Only layouts an encoder writes are accepted.
    ``exact=True`` reads the whole string as the map, with Java's leniency (missing padding,
    short bit sets): for strings known to be exactly what was committed, such as the output of
    :func:`encode_offset_map` or metadata read with the Java client or with the exact length
    librdkafka reports. One trailing NUL is dropped first: confluent-kafka stores one after
    every metadata string it commits (a NUL is never part of a map, so this changes no map).
    """
    if committed_offset < 0:
        raise OffsetDecodeError(f"committed offset must be >= 0, got {committed_offset}")
    if exact and metadata.endswith("\x00"):
        metadata = metadata[:-1]
    if not metadata:
        return DecodedOffsetMap(committed_offset, committed_offset - 1, (), None)
    if exact:
        payload = _b64decode(metadata)
        encoding = _encoding_of(payload)
        data = payload[1:]
        if encoding.compressed:
            data = _zstd.decompress(data)
        return _decoded(committed_offset, encoding, data)
    return _decode_read_back(committed_offset, metadata)


def read_committed_metadata(partition: Any) -> str | None:
    """The ``metadata`` of a confluent-kafka ``TopicPartition`` from ``committed()``, never raising.

    confluent-kafka reads the metadata of a map the Java client committed past its end, up to the
    next NUL byte in memory (see below). When those stray bytes are not valid UTF-8, reading the
    attribute raises ``UnicodeDecodeError``; this returns the text before the first invalid byte
    instead, which holds the whole map (a map is ASCII) for :func:`decode_offset_map` to find.
    """
    try:
        metadata: str | None = partition.metadata
    except UnicodeDecodeError as exc:
        return bytes(exc.object[: exc.start]).decode("utf-8")
    return metadata


# Reading a map back with stray trailing characters
# -------------------------------------------------
# confluent-kafka hands metadata to Python as a C string: librdkafka copies the committed bytes
# into a buffer of exactly their length, without a terminating NUL, and the binding reads it with
# strdup(), so a map the Java client committed comes back followed by whatever bytes lie after
# that buffer, up to the first NUL. Those stray bytes are unknown; the map in front of them is one
# an encoder wrote, and what writers produce is narrow:
#
# * standard base64 with '=' padding: the map's length is a multiple of 4 and '=' appears only
#   in its last quantum. So it ends at or before the first character outside the alphabet
#   (NUL included), and at or before the end of the quantum holding the first '='. Everything
#   after that cut is certainly stray and dropped; the map is one of the prefixes of what is
#   left that end on a quantum boundary: the *candidates*.
# * the payload inside has exactly the layout an encoder writes. BitSet: the length field fixes
#   the data size (width + ceil(length / 8) + 1 bytes), so at most one candidate has it.
#   Compressed: a zstd frame ends where it ends, so at most one candidate ends with the frame.
#   Either way that candidate is the map, whatever follows it: the decoding is exact.
# * RunLength has no count header: a written map cut after an even number of runs is again a
#   map an encoder could write ([0], or an even count, the first run >= 0, the others >= 1).
#   Where several candidates have that shape, the bytes cannot tell which one was written, and
#   the decoding must mark an offset finished only if every candidate does. Candidates of one
#   string are prefixes of each other with the same runs, so each one's finished set contains
#   the shorter ones': the intersection is exactly the shortest candidate, and that is what is
#   decoded. It is exact when the map has no shorter candidate of that shape. Our encoder never
#   chooses a plain RunLength map that has one (see ``_Candidates.smallest``), so everything
#   this library commits reads back exactly; a Java map of that kind reads back conservatively:
#   the records after the shortest candidate are processed again, none is skipped.
#
# No candidate of a written shape means the string is not a map an encoder wrote (or is hostile):
# OffsetDecodeError, and the consumer replays from the committed offset.

_NOT_BASE64 = re.compile("[^A-Za-z0-9+/=]")


def _decode_read_back(base: int, metadata: str) -> DecodedOffsetMap:
    payload, clean = _candidate_payload(metadata)
    encoding = _encoding_of(payload)

    def is_candidate(end: int) -> bool:
        """True when the payload's first ``end`` bytes are a candidate's whole payload."""
        return end == len(payload) or (end % 3 == 0 and end <= clean)

    if encoding.compressed:
        data, used = _zstd.decompress_first_frame(payload[1:])
        if not is_candidate(1 + used):
            raise OffsetDecodeError("unexpected data after the zstd frame")
        return _decoded(base, encoding, data)
    width = _WIDTH[encoding.version]
    if encoding.is_bitset:
        if len(payload) < 1 + width:
            raise OffsetDecodeError(f"BitSet v{encoding.version} data is truncated")
        length = int.from_bytes(payload[1 : 1 + width], "big", signed=True)
        size = encoded_bitset_size(length, encoding.version)
        if size is None or not is_candidate(1 + size):
            raise OffsetDecodeError(
                f"no BitSet v{encoding.version} map of length {length} is at the start of the "
                f"metadata ({len(payload) - 1} data bytes; an encoder writes {size})"
            )
        return _decoded(base, encoding, payload[1 : 1 + size])
    runs = parse_runs(payload[1:], encoding.version)
    ends = chain(range(3, clean + 1, 3), [len(payload)] if len(payload) > clean else [])
    counts = ((end - 1) // width for end in ends if (end - 1) % width == 0)
    count = shortest_written_prefix(runs, counts)
    if count is None:
        raise OffsetDecodeError(
            f"no RunLength v{encoding.version} map an encoder writes is at the start of the "
            "metadata (runs of the wrong count or length)"
        )
    return _decoded(base, encoding, payload[1 : 1 + width * count])


def _candidate_payload(metadata: str) -> tuple[bytes, int]:
    """The bytes of the longest candidate, and how many of them come from unpadded quanta.

    Every candidate's payload is a prefix of these bytes: ``3 * q`` bytes for each clean quantum
    count ``q``, and all of them when the last quantum is padded, or short at the very end of the
    string (Java accepts missing padding, so such a string may still be a whole map).
    """
    stray = _NOT_BASE64.search(metadata)
    text = metadata if stray is None else metadata[: stray.start()]
    pad = text.find("=")
    clean = len(text) // 4 if pad < 0 else pad // 4
    if pad >= 0:
        text = text[: (pad // 4 + 1) * 4]
    head = binascii.a2b_base64(text[: 4 * clean], strict_mode=True)
    last = text[4 * clean :]
    if stray is not None and "=" not in last:
        last = ""  # a map is whole quanta: a short one cut off by a stray character is not in it
    try:
        tail = binascii.a2b_base64(last + "=" * (-len(last) % 4), strict_mode=True)
    except (binascii.Error, ValueError):
        tail = b""
    payload = head + tail
    if not payload:
        raise OffsetDecodeError("offset metadata does not start with base64")
    return payload, len(head)


def _encoding_of(payload: bytes) -> OffsetEncoding:
    encoding = OffsetEncoding.from_magic(payload[0])
    if encoding is None:
        raise OffsetDecodeError(f"unknown offset map magic byte 0x{payload[0]:02X}")
    if encoding in _KAFKA_STREAMS:
        raise KafkaStreamsMetadataError(
            f"committed metadata was written by Kafka Streams ({encoding.name}), not an offset map"
        )
    if not encoding.decodable:
        raise OffsetDecodeError(f"{encoding.name} offset maps cannot be decoded (as in Java)")
    return encoding


def _decoded(base: int, encoding: OffsetEncoding, data: bytes) -> DecodedOffsetMap:
    """Decode the (uncompressed) encoder data of ``encoding`` relative to ``base``."""
    decode = decode_bitset if encoding.is_bitset else decode_run_length
    highest_seen, incomplete = decode(
        data, encoding.version, base, max_incompletes=MAX_DECODED_INCOMPLETES
    )
    if highest_seen > _MAX_OFFSET:
        raise OffsetDecodeError(f"offset map ends beyond the largest Kafka offset: {highest_seen}")
    return DecodedOffsetMap(base, highest_seen, incomplete, encoding)


class _Candidates:
    """The candidate payloads of one range; each plain form is built at most once, when needed."""

    def __init__(self, length: int, ranges: RangeEncoder) -> None:
        self._length = length
        self._ranges = ranges
        self._built: dict[OffsetEncoding, bytes | None] = {}

    def size(self, encoding: OffsetEncoding) -> int | None:
        if encoding.is_bitset:
            return encoded_bitset_size(self._length, encoding.version)
        return self._ranges.run_length_size(encoding.version)

    def data(self, encoding: OffsetEncoding) -> bytes | None:
        if encoding not in self._built:
            if encoding.is_bitset:
                self._built[encoding] = self._ranges.bitset(encoding.version)
            else:
                self._built[encoding] = self._ranges.run_length(encoding.version)
        return self._built[encoding]

    def reads_back_exactly(self, encoding: OffsetEncoding) -> bool:
        """False for a plain RunLength map that has a shorter prefix of a written shape, which a
        reader that must allow for stray trailing characters decodes conservatively."""
        return encoding.is_bitset or self._ranges.run_length_self_delimiting(encoding.version)

    def smallest(self) -> EncodedOffsetMap | None:
        # Sizes of the plain forms are known without building them.
        sized = [(size, _RANK[e], e) for e in _PREFERENCE[:4] if (size := self.size(e)) is not None]
        if not sized:
            return None
        sized.sort()
        # The smallest plain form that reads back exactly (see _decode_read_back) starts as the
        # winner; when none does, some compressed form wins below (every plain form has one).
        best_size, best_rank, best = next(
            (c for c in sized if self.reads_back_exactly(c[2])), (_NEVER, _NEVER, sized[0][2])
        )
        best_data: bytes | None = None
        # Compress from the smallest plain form up, skipping any whose best possible frame
        # could not beat (or tie with a better rank than) the current winner.
        for size, _, plain in sized:
            compressed = _COMPRESSED[plain]
            floor = _zstd.min_frame_size(size)
            if (floor, _RANK[compressed]) > (best_size, best_rank):
                continue
            frame = _zstd.compress(_require(self.data(plain)))
            if (len(frame), _RANK[compressed]) < (best_size, best_rank):
                best_size, best_rank = len(frame), _RANK[compressed]
                best, best_data = compressed, frame
        if best_data is None:
            best_data = _require(self.data(best))
        return _wrap(best, best_data)


def _require(data: bytes | None) -> bytes:
    assert data is not None, "a sized candidate always builds"
    return data


def _wrap(encoding: OffsetEncoding, data: bytes) -> EncodedOffsetMap:
    metadata = binascii.b2a_base64(bytes((encoding.magic,)) + data, newline=False).decode("ascii")
    return EncodedOffsetMap(metadata, encoding, len(metadata))


def _b64decode(metadata: str) -> bytes:
    # Java's decoder accepts missing padding; strict mode rejects everything else it rejects.
    padded = metadata + "=" * (-len(metadata) % 4)
    try:
        payload = binascii.a2b_base64(padded, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise OffsetDecodeError(f"offset metadata is not valid base64: {exc}") from exc
    if not payload:
        raise OffsetDecodeError("offset metadata decodes to an empty payload")
    return payload
