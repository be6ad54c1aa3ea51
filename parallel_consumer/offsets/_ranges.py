"""The plain encodings of one offset range, built lazily from its incomplete offsets.

Per-offset work in Python is what makes a codec slow, so :class:`RangeEncoder` does none: the
offsets cross into C once (``struct.pack`` into an ``int64`` buffer, the cheapest way to read a
list of Python ints) and everything after is numpy on whole arrays:

* Order: the input may be any iterable, in any order, with duplicates. One comparison of
  neighbours shows whether the packed offsets are already strictly increasing (what the engine
  passes); only when they are not does ``np.unique`` sort them and drop duplicates.
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
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from sortedcontainers import SortedList

from parallel_consumer.offsets.bitset import encoded_bitset_size
from parallel_consumer.offsets.run_length import shortest_written_prefix

__all__ = ["RangeEncoder", "range_encoder", "sorted_offsets"]

_WIDTH = {1: 2, 2: 4}
_MAX_RUN = {1: 2**15 - 1, 2: 2**31 - 1}
_DTYPE = {1: ">i2", 2: ">i4"}
_INT64_MAX = 2**63 - 1

if TYPE_CHECKING:
    import numpy.typing as npt

    Int64s = npt.NDArray[np.int64]
# Sequences that struct.pack can read as they are (anything else is copied into a list first).
_SEQUENCES = (list, tuple)


def sorted_offsets(offsets: Iterable[int]) -> Int64s:
    """``offsets`` as a strictly increasing ``int64`` array: sorted, without duplicates.

    Any iterable of ints is accepted. An already strictly increasing list or tuple (the engine's
    case) costs one pack and one comparison of neighbours; anything else is also sorted. Raises
    ValueError for values that are not integers in the signed 64-bit range.
    """
    ordered: Sequence[int]
    if isinstance(offsets, _SEQUENCES):
        ordered = offsets
    elif isinstance(offsets, set | frozenset):
        ordered = sorted(offsets)  # no duplicates, and packed sorted: no np.unique below
    else:
        ordered = list(offsets)
    packed = _pack(ordered)
    return packed if _increasing(packed) else np.unique(packed)


def range_encoder(base: int, stop: int, length: int, offsets: Iterable[int]) -> RangeEncoder:
    """An encoder for the range ``[base, base + length)`` whose incompletes are the members of
    ``offsets`` in ``[base, stop)``. ``offsets`` is any iterable of ints, in any order, with or
    without duplicates (ValueError for anything that is not a signed 64-bit integer).
    """
    if not 0 <= base <= _INT64_MAX:
        raise ValueError(f"offsets must fit in a signed 64-bit integer, base is {base}")
    if type(offsets) is SortedList:  # sorted by contract: its own bisect picks the range cheaply
        low, high = offsets.bisect_left(base), offsets.bisect_left(stop)
        selected = _pack(offsets[low:high] if high > low else ())
        if not _increasing(selected):
            selected = np.unique(selected)  # a SortedList may hold duplicates
        return RangeEncoder(base, length, selected)
    return RangeEncoder.of_sorted(base, stop, length, sorted_offsets(offsets))


def _increasing(offsets: Int64s) -> bool:
    # Compared, not subtracted: np.diff would wrap around for offsets far apart.
    return offsets.size < 2 or bool((offsets[1:] > offsets[:-1]).all())


def _pack(offsets: Sequence[int]) -> Int64s:
    try:
        packed = struct.pack(f"={len(offsets)}q", *offsets)
    except struct.error:
        raise ValueError("incomplete offsets must be integers in the signed 64-bit range") from None
    return np.frombuffer(packed, dtype=np.int64)


class RangeEncoder:
    """Builds the uncompressed encoder data (no magic byte) of one range on demand.

    ``selected`` are the incomplete offsets inside the range, strictly increasing.
    """

    def __init__(self, base: int, length: int, selected: Int64s) -> None:
        self._length = length
        self._relative: Int64s = selected - np.int64(base)
        # Gaps between neighbours, all >= 1: the offsets are strictly increasing.
        self._gaps: Int64s = np.diff(self._relative)
        self._runs: Int64s | None = None
        self._longest_run = 0

    @classmethod
    def of_sorted(cls, base: int, stop: int, length: int, ordered: Int64s) -> RangeEncoder:
        """The encoder of ``ordered`` (from :func:`sorted_offsets`) within ``[base, stop)``."""
        if stop <= base or not ordered.size:
            return cls(base, length, ordered[:0])
        low = int(np.searchsorted(ordered, base))
        high = ordered.size if stop > _INT64_MAX else int(np.searchsorted(ordered, stop))
        return cls(base, length, ordered[low:high])

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

    def run_length_self_delimiting(self, version: int) -> bool:
        """True when no proper prefix of the RunLength map, cut on a base64 quantum boundary, is
        itself a run sequence an encoder writes (see ``run_length.shortest_written_prefix``).

        The payload is ``1 + width * j`` bytes for ``j`` runs; a prefix ends on a quantum
        boundary when that is a multiple of 3: ``j = 1, 4, 7, ...`` for v1 and ``2, 5, 8, ...``
        for v2, below the map's own run count.
        """
        runs = self._run_array()
        first = 1 if version == 1 else 2
        return shortest_written_prefix(runs, range(first, runs.size, 3)) is None

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
