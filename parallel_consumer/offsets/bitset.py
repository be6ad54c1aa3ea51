"""BitSet v1/v2: one bit per offset of the encoded range, set = complete, clear = incomplete.

Layout (big-endian): ``int16`` (v1) or ``int32`` (v2) range length, then the range as bits in
little-endian bit order (bit ``r`` is bit ``r % 8`` of byte ``r // 8``), zero-padded to
``ceil(length / 8) + 1`` bytes, exactly like Java's pre-sized, zero-filled ``ByteBuffer``.
Encoding lives in ``_ranges``, which builds these bytes for a whole range at once.
"""

from __future__ import annotations

from itertools import chain

from bitarray import bitarray

from parallel_consumer.offsets.errors import OffsetDecodeError

__all__ = ["decode_bitset", "encoded_bitset_size", "max_bitset_length"]

_WIDTH = {1: 2, 2: 4}
_MAX_LENGTH = {1: 2**15 - 1, 2: 2**31 - 1}


def max_bitset_length(version: int) -> int:
    """The longest range the layout can hold (Java drops the encoder above it)."""
    return _MAX_LENGTH[version]


def encoded_bitset_size(length: int, version: int) -> int | None:
    """Bytes of the encoder data of a ``length``-offset range; None when it cannot encode."""
    if length < 0 or length > _MAX_LENGTH[version]:
        return None
    return _WIDTH[version] + (length + 7) // 8 + 1


def decode_bitset(
    data: bytes, version: int, base: int, *, max_incompletes: int
) -> tuple[int, tuple[int, ...]]:
    """Decode encoder data (no magic byte) into ``(highest_seen, sorted incomplete offsets)``.

    Bits missing from a short buffer read as clear (incomplete), as in ``java.util.BitSet``; a
    length that would therefore yield more than ``max_incompletes`` incompletes is rejected, so a
    hostile length field cannot make the decoder allocate without bound.
    """
    width = _WIDTH[version]
    if len(data) < width:
        raise OffsetDecodeError(f"BitSet v{version} data is truncated: {len(data)} bytes")
    length = int.from_bytes(data[:width], "big", signed=True)
    if length < 0:
        raise OffsetDecodeError(f"BitSet v{version} has a negative length field: {length}")
    bits = bitarray(endian="little")
    bits.frombytes(data[width:])
    present = min(length, len(bits))
    del bits[present:]
    missing = length - present
    incomplete_count = present - bits.count(1) + missing
    if incomplete_count > max_incompletes:
        raise OffsetDecodeError(
            f"BitSet v{version} of length {length} would decode to {incomplete_count} incomplete "
            f"offsets, more than the limit of {max_incompletes}"
        )
    relative = chain(bits.search(0), range(present, length))
    return base + length - 1, tuple(map(base.__add__, relative))
