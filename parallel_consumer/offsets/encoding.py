"""The encodings of the Java Parallel Consumer offset map and their magic bytes."""

from __future__ import annotations

import enum

__all__ = ["OffsetEncoding"]


class OffsetEncoding(enum.Enum):
    """Every encoding the Java library knows, keyed by the magic byte that starts the payload.

    Names follow the Java enum (``BitSetV2Compressed`` → ``BIT_SET_V2_COMPRESSED``). The byte-array
    and Kafka Streams kinds exist only so their magic bytes are recognised; nothing can decode them.
    """

    BYTE_ARRAY = 0x4C  # 'L'
    BYTE_ARRAY_COMPRESSED = 0xEE  # 'î'
    BIT_SET = 0x6C  # 'l'
    BIT_SET_COMPRESSED = 0x61  # 'a'
    RUN_LENGTH = 0x6E  # 'n'
    RUN_LENGTH_COMPRESSED = 0x4A  # 'J'
    BIT_SET_V2 = 0x6F  # 'o'
    BIT_SET_V2_COMPRESSED = 0x73  # 's'
    RUN_LENGTH_V2 = 0x65  # 'e'
    RUN_LENGTH_V2_COMPRESSED = 0x70  # 'p'
    KAFKA_STREAMS = 0x01
    KAFKA_STREAMS_V2 = 0x02

    @property
    def magic(self) -> int:
        """The first byte of the payload (0-255)."""
        return self.value

    @property
    def compressed(self) -> bool:
        """True for the zstd-compressed variants."""
        return self in _COMPRESSED_TO_PLAIN

    @property
    def plain(self) -> OffsetEncoding:
        """The uncompressed encoding that this one wraps (itself when not compressed)."""
        return _COMPRESSED_TO_PLAIN.get(self, self)

    @property
    def decodable(self) -> bool:
        """True when :func:`~parallel_consumer.offsets.decode_offset_map` can read it."""
        return self.plain in _PLAIN_DECODABLE

    @property
    def is_bitset(self) -> bool:
        """True for the BitSet layouts (plain or compressed), False for everything else."""
        return self.plain in (OffsetEncoding.BIT_SET, OffsetEncoding.BIT_SET_V2)

    @property
    def version(self) -> int:
        """1 for the int16 layouts, 2 for the int32 layouts (0 for the non-decodable kinds)."""
        return _VERSION.get(self.plain, 0)

    @classmethod
    def from_magic(cls, magic: int) -> OffsetEncoding | None:
        """The encoding for a magic byte, or None when the byte is unknown."""
        return _BY_MAGIC.get(magic)


_COMPRESSED_TO_PLAIN = {
    OffsetEncoding.BYTE_ARRAY_COMPRESSED: OffsetEncoding.BYTE_ARRAY,
    OffsetEncoding.BIT_SET_COMPRESSED: OffsetEncoding.BIT_SET,
    OffsetEncoding.RUN_LENGTH_COMPRESSED: OffsetEncoding.RUN_LENGTH,
    OffsetEncoding.BIT_SET_V2_COMPRESSED: OffsetEncoding.BIT_SET_V2,
    OffsetEncoding.RUN_LENGTH_V2_COMPRESSED: OffsetEncoding.RUN_LENGTH_V2,
}
_PLAIN_DECODABLE = frozenset(
    {
        OffsetEncoding.BIT_SET,
        OffsetEncoding.BIT_SET_V2,
        OffsetEncoding.RUN_LENGTH,
        OffsetEncoding.RUN_LENGTH_V2,
    }
)
_VERSION = {
    OffsetEncoding.BIT_SET: 1,
    OffsetEncoding.RUN_LENGTH: 1,
    OffsetEncoding.BIT_SET_V2: 2,
    OffsetEncoding.RUN_LENGTH_V2: 2,
}
_BY_MAGIC = {encoding.magic: encoding for encoding in OffsetEncoding}
