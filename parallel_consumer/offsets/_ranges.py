"""The plain encodings of one offset range, built lazily from its sorted incomplete offsets.

Per-offset work in Python is what makes a codec slow, so :class:`RangeEncoder` does almost none
past one list comprehension (the relative offsets, which the bitset indexes with): the offsets
are packed once with ``struct`` into one big integer holding a 32-bit field per offset (64-bit
when the range is longer than any bitset), and the rest is whole-integer arithmetic and bytes
operations that CPython runs in C:

* neighbour differences are ``(F & LOW) - (F >> bits)``; every field is below
  ``2**(bits - 1)``, so a difference below the expected minimum sets its field's top bit (no
  field can borrow from its neighbour without setting its own top bit first);
* run-length data needs the first and last offset of each group of consecutive incompletes:
  fields that are not group boundaries are overwritten with ``0xFF`` bytes and removed with
  ``bytes.replace``. Kept fields start with a byte below ``0x80``, so every ``0xFF`` stretch is
  the deleted fields plus at most ``width - 1`` trailing bytes of a kept field, and removing
  whole ``width``-byte patterns from it leaves exactly the kept bytes;
* the run lengths of group ``j`` are ``last_j - first_j + 1`` (incomplete) and
  ``first_{j+1} - last_j - 1`` (complete): two subtractions, two ``to_bytes`` and a strided
  ``memoryview`` copy give RunLength v2, and v1 is the low half of each of its int32 values.

Output is byte-for-byte the straightforward per-offset construction (a property test compares
the two); the layouts are described in ``bitset`` and ``run_length``.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import islice
from operator import lt

from parallel_consumer.offsets.bitset import encode_bitset

__all__ = ["RangeEncoder", "range_encoder"]

_MAX_RUN = {1: 2**15 - 1, 2: 2**31 - 1}
_DELETED_BYTE = b"\xff"


def range_encoder(base: int, stop: int, length: int, offsets: Iterable[int]) -> RangeEncoder:
    """An encoder for the range ``[base, base + length)`` whose incompletes are ``offsets`` in
    ``[base, stop)``; ``offsets`` must be sorted ascending without duplicates (ValueError if not).
    """
    ordered: Sequence[int] = offsets if isinstance(offsets, Sequence) else list(offsets)
    low = bisect_left(ordered, base)
    high = bisect_left(ordered, stop, lo=low)
    selected = list(ordered[low:high]) if high > low else []
    return RangeEncoder(base, length, selected)


class RangeEncoder:
    """Builds the uncompressed encoder data (no magic byte) of one range on demand.

    ``selected`` are the incomplete offsets inside the range, strictly increasing (checked).
    """

    def __init__(self, base: int, length: int, selected: list[int]) -> None:
        self._length = length
        count = len(selected)
        self._relative = relative = [offset - base for offset in selected] if base else selected
        self._runs: dict[int, bytes | None] | None = None
        # Relative offsets packed one per field (field 0 most significant), a 1 in every field,
        # and every neighbour difference minus one (one field fewer); all 0 for no offsets.
        self._fields = self._ones = self._steps = 0
        # 32-bit fields hold any offset of a range short enough for a bitset.
        self._bits = bits = 32 if length <= 2**31 else 64
        if not count:
            return
        try:
            packed = struct.pack(f">{count}{'I' if bits == 32 else 'Q'}", *relative)
        except struct.error:
            raise _bad_offsets(relative) from None
        fields = int.from_bytes(packed, "big")
        ones = int.from_bytes((1).to_bytes(bits // 8, "big") * count, "big")
        if fields & (ones << (bits - 1)):  # every field must stay below 2**(bits - 1)
            raise _bad_offsets(relative)
        step_ones = ones >> bits
        steps = (fields & ((1 << (bits * (count - 1))) - 1)) - (fields >> bits) - step_ones
        if steps < 0 or steps & (step_ones << (bits - 1)):
            raise _unsorted()
        self._fields, self._ones, self._steps = fields, ones, steps

    def bitset(self, version: int) -> bytes | None:
        return encode_bitset(self._length, self._relative, version)

    def run_length_size(self, version: int) -> int | None:
        data = self.run_length(version)
        return None if data is None else len(data)

    def run_length(self, version: int) -> bytes | None:
        if self._runs is None:
            self._runs = self._build_runs()
        return self._runs[version]

    def _build_runs(self) -> dict[int, bytes | None]:
        length, relative = self._length, self._relative
        if not relative:
            if length > _MAX_RUN[2]:
                return {2: None, 1: None}
            int32s = _pack([0, length] if length else [0])
            return {1: _narrow(int32s) if length <= _MAX_RUN[1] else None, 2: int32s}
        first, last = relative[0], relative[-1]
        edges = ([0, first] if first else [], [length - 1 - last] if last < length - 1 else [])
        longest_edge = max(max(edges[0], default=0), max(edges[1], default=0))
        bits, fields, ones, count = self._bits, self._fields, self._ones, len(relative)
        width = bits // 8
        # A step field of 0 (difference 1) joins two offsets into one group of incompletes.
        step_ones = ones >> bits
        step_tops = step_ones << (bits - 1)
        joins = ((self._steps + step_tops - step_ones) & step_tops) ^ step_tops
        if joins:
            marks = joins >> (bits - 1)
            deleted = (marks << bits) - marks  # all ones in every joined field
            firsts = _compact((fields | deleted).to_bytes(width * count, "big"), width)
            lasts = _compact((fields | (deleted << bits)).to_bytes(width * count, "big"), width)
            groups = len(firsts) // width
            firsts_int = int.from_bytes(firsts, "big")
            lasts_int = int.from_bytes(lasts, "big")
            ones >>= bits * (count - groups)
        else:
            groups, firsts_int, lasts_int = count, fields, fields
        incomplete = lasts_int - firsts_int + ones
        complete = (
            (firsts_int & ((1 << (bits * (groups - 1))) - 1)) - (lasts_int >> bits) - (ones >> bits)
        )
        longest = incomplete | complete  # below 2**m exactly when both fields are

        def fits(version: int) -> bool:
            limit = _MAX_RUN[version]
            over = ((ones << (bits - limit.bit_length())) - ones) << limit.bit_length()
            return not longest & over and longest_edge <= limit

        fits_v1 = fits(1)
        if not fits_v1 and not fits(2):
            return {1: None, 2: None}
        middle = _interleave(
            incomplete.to_bytes(width * groups, "big"),
            complete.to_bytes(width * (groups - 1), "big"),
            width,
        )
        int32s = _pack(edges[0]) + middle + _pack(edges[1])
        return {1: _narrow(int32s) if fits_v1 else None, 2: int32s}


def _compact(data: bytes, width: int) -> bytes:
    """Drop the all-0xFF fields (see the module docstring for why this is exact)."""
    return data.replace(_DELETED_BYTE * width, b"")


def _interleave(incomplete: bytes, complete: bytes, width: int) -> bytes:
    """Big-endian int32 runs ``incomplete_0, complete_0, incomplete_1, ...`` from the low 32 bits
    of big-endian ``width``-byte fields (every value below 2**31)."""
    out = bytearray(len(incomplete) * 8 // width - 4)
    words = memoryview(out).cast("I")
    low = width // 4 - 1  # the index of each field's low 32 bits, counted in 32-bit words
    words[0::2] = memoryview(incomplete).cast("I")[low :: low + 1]
    words[1::2] = memoryview(complete).cast("I")[low :: low + 1]
    return bytes(out)


def _narrow(int32s: bytes) -> bytes:
    """Big-endian int32 values that fit in int16, as big-endian int16 (their low halves)."""
    return memoryview(int32s).cast("H")[1::2].tobytes()


def _pack(runs: list[int]) -> bytes:
    return struct.pack(f">{len(runs)}i", *runs)


def _unsorted() -> ValueError:
    return ValueError("incomplete_offsets must be sorted ascending without duplicates")


def _bad_offsets(relative: list[int]) -> ValueError:
    if not all(map(lt, relative, islice(relative, 1, None))):
        return _unsorted()
    return ValueError("incomplete offsets must fit in a signed 64-bit integer")
