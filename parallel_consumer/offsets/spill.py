"""Offset maps too large for the commit metadata: the side record that holds one, and the small
reference committed in its place. Pure functions over plain data; the writing and reading is
``kafka/spill_store.py``'s. See ``docs/offset-metadata.md#maps-over-the-limit``.

The reference is text that is never base64 (it starts with ``!``): the Java library's decoder
rejects it (``IllegalArgumentException`` → ``OffsetDecodingError``, "dropping offset map") and
replays from the committed offset, and no encoding either library writes can be taken for it.
It names the side record exactly (topic, partition, offset) and carries the CRC-32 of the
record's value, so a reader never takes an older or newer map of the same key for it::

    !pc-map/1/<side topic>/<side partition>/<side offset>/<crc32, 8 hex digits>!

The side record is keyed by (group, topic, partition) so that compaction keeps one per
partition; its value is ``PCMAP1``, the committed offset the map is relative to (8 bytes, big
endian) and the map exactly as it would be committed inline (Java-compatible base64).
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass

from parallel_consumer.offsets.errors import OffsetDecodeError

__all__ = [
    "REFERENCE_PREFIX",
    "SpillReference",
    "checksum",
    "default_spill_topic",
    "format_reference",
    "parse_reference",
    "read_side_value",
    "side_key",
    "side_value",
]

#: How every reference starts: ``!`` is outside the base64 alphabet.
REFERENCE_PREFIX = "!pc-map/1/"
_VALUE_MAGIC = b"PCMAP1"
_BASE = struct.Struct(">q")
# Topic names are [a-zA-Z0-9._-]{1,249}: never '/' or '!', so the fields split unambiguously.
_REFERENCE = re.compile(
    re.escape(REFERENCE_PREFIX)
    + r"(?P<topic>[A-Za-z0-9._-]{1,249})/(?P<partition>\d{1,10})/(?P<offset>\d{1,19})"
    r"/(?P<crc>[0-9a-f]{8})!"
)


@dataclass(frozen=True, slots=True)
class SpillReference:
    """Where a spilled map lives: one record of the side topic, and its value's CRC-32."""

    topic: str
    partition: int
    offset: int
    checksum: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


def default_spill_topic(group: str) -> str:
    """``<group>.pc-offsets``, with the characters a topic name may not hold replaced by ``_``
    (a group id may be any string; a topic name only ``[a-zA-Z0-9._-]``, at most 249)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", group)[: 249 - len(".pc-offsets")]
    return f"{name}.pc-offsets"


def format_reference(ref: SpillReference) -> str:
    """The commit metadata that points at ``ref``."""
    crc = ref.checksum & 0xFFFFFFFF
    return f"{REFERENCE_PREFIX}{ref.topic}/{ref.partition}/{ref.offset}/{crc:08x}!"


def parse_reference(metadata: str) -> SpillReference | None:
    """The reference in ``metadata``, or None when it is not one (an inline map, or nothing).

    Anything after the closing ``!`` is ignored (confluent-kafka may read stray bytes after the
    committed ones, or a NUL it stored). Raises :class:`OffsetDecodeError` for metadata that
    starts like a reference but is not a whole one.
    """
    if not metadata.startswith(REFERENCE_PREFIX):
        return None
    match = _REFERENCE.match(metadata)
    if match is None:
        raise OffsetDecodeError(f"malformed offset map reference: {metadata[:300]!r}")
    return SpillReference(
        match["topic"], int(match["partition"]), int(match["offset"]), int(match["crc"], 16)
    )


def side_key(group: str, topic: str, partition: int) -> bytes:
    """The side record's key: one per (group, topic, partition), kept by compaction."""
    return f"{group}\x00{topic}\x00{partition}".encode()


def side_value(base: int, metadata: str) -> bytes:
    """The side record's value: the map ``metadata`` (inline form) relative to offset ``base``."""
    return _VALUE_MAGIC + _BASE.pack(base) + metadata.encode("ascii")


def checksum(value: bytes) -> int:
    """The CRC-32 a reference carries of its record's value."""
    return zlib.crc32(value) & 0xFFFFFFFF


def read_side_value(
    ref: SpillReference,
    key: bytes | None,
    value: bytes | None,
    *,
    expected_key: bytes,
    committed_offset: int,
) -> str:
    """The map (inline form, relative to ``committed_offset``) in the side record found where
    ``ref`` points. Raises :class:`OffsetDecodeError` saying why when it is not the record the
    reference was written for: another key, a tombstone, another value (checksum), or a map
    relative to another committed offset."""
    if key != expected_key:
        raise OffsetDecodeError(f"{ref} holds another partition's record (key {key!r})")
    if value is None:
        raise OffsetDecodeError(f"{ref} is a tombstone: the map was deleted")
    if checksum(value) != ref.checksum:
        raise OffsetDecodeError(f"{ref} holds another version of the map (checksum mismatch)")
    head = len(_VALUE_MAGIC) + _BASE.size
    if len(value) < head or not value.startswith(_VALUE_MAGIC):
        raise OffsetDecodeError(f"{ref} is not an offset map record")
    (base,) = _BASE.unpack_from(value, len(_VALUE_MAGIC))
    if base != committed_offset:
        raise OffsetDecodeError(
            f"{ref} holds the map of committed offset {base}, not of {committed_offset}"
        )
    try:
        return value[head:].decode("ascii")
    except UnicodeDecodeError as exc:
        raise OffsetDecodeError(f"{ref} holds a map that is not ASCII") from exc
