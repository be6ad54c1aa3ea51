"""The plain encodings of one offset range, built lazily from its sorted incomplete offsets.

Per-offset work in Python is what makes a codec slow, so :class:`RangeEncoder` does none: the
offsets cross into C once (``struct.pack`` into an ``int64`` buffer, the cheapest way to read a
list of Python ints) and everything after is numpy on whole arrays:

* RunLength: the groups of consecutive incompletes start where the gap to the previous offset is
  more than one; the incomplete runs are the group sizes, the complete runs the gaps minus one,
  interleaved, with the leading complete run (behind a zero-length incomplete run) and the
  trailing complete run added at the ends. v2 is that array as big-endian ``int32``, v1 as
  ``int16``, each only when its largest run fits.
* BitSet: each incomplete offset's bit is added into a zeroed byte array (``np.add.at``; the
  offsets are distinct, so adding is OR-ing) and the array is inverted, so set means complete.
  Memory is the bitset itself plus a few arrays the size of the offsets.

Output is byte-for-byte the straightforward per-offset construction (a property test compares
the two); the layouts are described in ``bitset`` and ``run_length``.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import islice
from operator import lt
from typing import TYPE_CHECKING

import numpy as np
from sortedcontainers import SortedList

from parallel_consumer.offsets.bitset import encoded_bitset_size

__all__ = ["RangeEncoder", "range_encoder"]

_WIDTH = {1: 2, 2: 4}
_MAX_RUN = {1: 2**15 - 1, 2: 2**31 - 1}
_DTYPE = {1: ">i2", 2: ">i4"}
_INT64_MAX = 2**63 - 1

if TYPE_CHECKING:
    import numpy.typing as npt

    Int64s = npt.NDArray[np.int64]
# Sequences whose slices are cheap copies (a deque, for one, cannot be sliced at all).
_SLICEABLE = (list, tuple, SortedList)


def range_encoder(base: int, stop: int, length: int, offsets: Iterable[int]) -> RangeEncoder:
    """An encoder for the range ``[base, base + length)`` whose incompletes are ``offsets`` in
    ``[base, stop)``; ``offsets`` must be sorted ascending without duplicates (ValueError if not).
    """
    ordered: Sequence[int] = offsets if isinstance(offsets, _SLICEABLE) else list(offsets)
    if isinstance(ordered, SortedList):  # its own bisect is far faster than one via __getitem__
        low, high = ordered.bisect_left(base), ordered.bisect_left(stop)
    else:
        low = bisect_left(ordered, base)
        high = bisect_left(ordered, stop, lo=low)
    if high - low == len(ordered):
        return RangeEncoder(base, length, ordered)  # all of them: no copy
    selected: Sequence[int] = ordered[low:high] if high > low else ()
    return RangeEncoder(base, length, selected)


class RangeEncoder:
    """Builds the uncompressed encoder data (no magic byte) of one range on demand.

    ``selected`` are the incomplete offsets inside the range, strictly increasing (checked).
    """

    def __init__(self, base: int, length: int, selected: Sequence[int]) -> None:
        if not 0 <= base <= _INT64_MAX:
            raise ValueError(f"offsets must fit in a signed 64-bit integer, base is {base}")
        self._length = length
        try:
            packed = struct.pack(f"={len(selected)}q", *selected)
        except struct.error:
            if not all(map(lt, selected, islice(selected, 1, None))):
                raise _unsorted() from None
            raise ValueError("incomplete offsets must fit in a signed 64-bit integer") from None
        offsets = np.frombuffer(packed, dtype=np.int64)
        # Sorted input puts every selected offset in [base, base + length); one below the base
        # means unsorted input (and would wrap around in the subtraction), so reject it first.
        if offsets.size and int(offsets.min()) < base:
            raise _unsorted()
        self._relative: Int64s = offsets - np.int64(base)
        # Gaps between neighbours: all >= 1 exactly when the offsets are strictly increasing.
        self._gaps: Int64s = np.diff(self._relative)
        if self._gaps.size and int(self._gaps.min()) < 1:
            raise _unsorted()
        self._runs: Int64s | None = None
        self._longest_run = 0

    def bitset(self, version: int) -> bytes | None:
        length = self._length
        if encoded_bitset_size(length, version) is None:
            return None
        # One bit per incomplete offset, set in a byte array (adding equals OR-ing: offsets are
        # distinct), then inverted: set = complete. Bits past the range and the spare byte that
        # Java's buffer always has are clear.
        data = np.zeros((length + 7) // 8 + 1, dtype=np.uint8)
        relative = self._relative
        np.add.at(data, relative >> 3, np.left_shift(np.uint8(1), (relative & 7).astype(np.uint8)))
        np.invert(data, out=data)
        data[-1] = 0
        if length % 8:
            data[-2] &= (1 << (length % 8)) - 1
        return length.to_bytes(_WIDTH[version], "big") + data.tobytes()

    def run_length_size(self, version: int) -> int | None:
        runs = self._run_array()
        if self._longest_run > _MAX_RUN[version]:
            return None
        return _WIDTH[version] * runs.size

    def run_length(self, version: int) -> bytes | None:
        if self.run_length_size(version) is None:
            return None
        return self._run_array().astype(_DTYPE[version]).tobytes()

    def _run_array(self) -> Int64s:
        if self._runs is None:
            if self._relative.size:
                self._runs = self._build_runs()
                self._longest_run = int(self._runs.max())
            else:  # one complete run over the whole range, which may be too long for int64
                self._longest_run = self._length
                runs = [0, self._length] if 0 < self._length <= _MAX_RUN[2] else [0]
                self._runs = np.array(runs, dtype=np.int64)
        return self._runs

    def _build_runs(self) -> Int64s:
        relative, gaps, length = self._relative, self._gaps, self._length
        first, last = int(relative[0]), int(relative[-1])
        breaks = np.flatnonzero(gaps > 1)  # gaps[i] > 1: a new group starts at relative[i + 1]
        head = 2 if first else 0  # a zero-length incomplete run, then the leading complete run
        tail = 1 if last < length - 1 else 0
        groups = breaks.size + 1
        runs = np.empty(head + 2 * groups - 1 + tail, dtype=np.int64)
        if head:
            runs[0], runs[1] = 0, first
        if tail:
            runs[-1] = length - 1 - last
        middle = runs[head : runs.size - tail]
        # Group g spans group_starts[g] .. group_ends[g]; its size is their difference plus one.
        group_starts = np.empty(groups, dtype=np.int64)
        group_starts[0] = relative[0]
        group_starts[1:] = relative[breaks + 1]
        group_ends = np.empty(groups, dtype=np.int64)
        group_ends[-1] = last
        group_ends[:-1] = relative[breaks]
        middle[0::2] = group_ends - group_starts + 1
        middle[1::2] = gaps[breaks] - 1
        return runs


def _unsorted() -> ValueError:
    return ValueError("incomplete_offsets must be sorted ascending without duplicates")
