"""The plain encodings of one offset range, built lazily by one of two interchangeable kernels.

``PureRange`` uses bitarray and C-level iteration over Python ints; ``NumpyRange`` does the same
work on int64 arrays and is several times faster. numpy is optional (not a dependency of the
package): :func:`range_encoder` uses it when it imports. Both produce identical bytes, which the
property tests check.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import islice
from operator import lt
from typing import TYPE_CHECKING, Protocol

from parallel_consumer.offsets.bitset import encode_bitset, encoded_bitset_size
from parallel_consumer.offsets.run_length import (
    encode_runs,
    encoded_runs_size,
    runs_from_incompletes,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

try:
    import numpy
except ImportError:  # pragma: no cover - exercised only where numpy is absent
    numpy = None  # type: ignore[assignment]

__all__ = ["HAS_NUMPY", "NumpyRange", "PureRange", "RangeEncoder", "range_encoder"]

HAS_NUMPY = numpy is not None
_WIDTH = {1: 2, 2: 4}
_MAX_RUN = {1: 2**15 - 1, 2: 2**31 - 1}


class RangeEncoder(Protocol):
    """Builds the uncompressed encoder data (no magic byte) of one range on demand."""

    def bitset(self, version: int) -> bytes | None: ...

    def run_length_size(self, version: int) -> int | None: ...

    def run_length(self, version: int) -> bytes | None: ...


def range_encoder(
    base: int, stop: int, length: int, offsets: Iterable[int], *, use_numpy: bool
) -> RangeEncoder:
    """An encoder for the range ``[base, base + length)`` whose incompletes are ``offsets`` in
    ``[base, stop)``; ``offsets`` must be sorted ascending without duplicates (ValueError if not).
    """
    ordered: Sequence[int] = offsets if isinstance(offsets, Sequence) else list(offsets)
    low = bisect_left(ordered, base)
    high = bisect_left(ordered, stop, lo=low)
    selected = list(ordered[low:high]) if high > low else []
    if use_numpy:
        return NumpyRange(base, length, selected)
    return PureRange(base, length, selected)


def _unsorted() -> ValueError:
    return ValueError("incomplete_offsets must be sorted ascending without duplicates")


class PureRange:
    """The bitarray/stdlib kernel."""

    def __init__(self, base: int, length: int, selected: list[int]) -> None:
        self._length = length
        self._relative = list(map((-base).__add__, selected)) if base else selected
        if not all(map(lt, self._relative, islice(self._relative, 1, None))):
            raise _unsorted()
        self._runs: list[int] | None = None

    def _run_list(self) -> list[int]:
        if self._runs is None:
            self._runs = runs_from_incompletes(self._length, self._relative)
        return self._runs

    def bitset(self, version: int) -> bytes | None:
        return encode_bitset(self._length, self._relative, version)

    def run_length_size(self, version: int) -> int | None:
        return encoded_runs_size(self._run_list(), version)

    def run_length(self, version: int) -> bytes | None:
        return encode_runs(self._run_list(), version)


class NumpyRange:
    """The numpy kernel: O(len(selected)) for run lengths, O(length / 8) for the bitset."""

    def __init__(self, base: int, length: int, selected: list[int]) -> None:
        assert numpy is not None
        self._length = length
        try:
            offsets = numpy.fromiter(selected, dtype=numpy.int64, count=len(selected))
        except OverflowError as exc:
            raise ValueError("incomplete offsets must fit in a signed 64-bit integer") from exc
        self._relative: npt.NDArray[np.int64] = offsets - numpy.int64(base)
        if not bool(numpy.all(self._relative[1:] > self._relative[:-1])):
            raise _unsorted()
        self._runs: npt.NDArray[np.int64] | None = None

    def _run_array(self) -> npt.NDArray[np.int64]:
        assert numpy is not None
        if self._runs is None:
            rel, length = self._relative, self._length
            if len(rel) == 0:
                self._runs = numpy.array([0, length] if length else [0], dtype=numpy.int64)
                return self._runs
            # Same construction as run_length.runs_from_incompletes, on arrays.
            gaps = numpy.diff(rel)
            breaks = numpy.flatnonzero(gaps > 1)
            starts = numpy.concatenate((rel[:1], rel[breaks + 1]))
            ends = numpy.concatenate((rel[breaks], rel[-1:]))
            runs = numpy.empty(2 * len(starts) - 1, dtype=numpy.int64)
            runs[0::2] = ends - starts + 1
            runs[1::2] = gaps[breaks] - 1
            first, last = int(rel[0]), int(rel[-1])
            head = [0, first] if first else []
            tail = [length - 1 - last] if last < length - 1 else []
            self._runs = numpy.concatenate(
                (numpy.array(head, dtype=numpy.int64), runs, numpy.array(tail, dtype=numpy.int64))
            )
        return self._runs

    def bitset(self, version: int) -> bytes | None:
        assert numpy is not None
        length = self._length
        if encoded_bitset_size(length, version) is None:
            return None
        bits = numpy.full((length + 7) // 8 + 1, 0xFF, dtype=numpy.uint8)
        bits[-1] = 0  # Java's spare zero byte
        if length % 8:
            bits[-2] = (1 << (length % 8)) - 1  # bits past the end stay clear
        rel = self._relative
        if len(rel):
            # Clear one bit per incomplete offset: OR the masks of offsets sharing a byte first.
            byte_index = rel >> 3
            masks = numpy.left_shift(numpy.uint8(1), (rel & 7).astype(numpy.uint8))
            first_in_byte = numpy.flatnonzero(
                numpy.concatenate(([True], byte_index[1:] != byte_index[:-1]))
            )
            cleared = numpy.bitwise_or.reduceat(masks, first_in_byte)
            bits[byte_index[first_in_byte]] &= ~cleared
        return length.to_bytes(_WIDTH[version], "big") + bits.tobytes()

    def run_length_size(self, version: int) -> int | None:
        runs = self._run_array()
        if int(runs.max()) > _MAX_RUN[version]:
            return None
        return _WIDTH[version] * len(runs)

    def run_length(self, version: int) -> bytes | None:
        if self.run_length_size(version) is None:
            return None
        return self._run_array().astype(">i2" if version == 1 else ">i4").tobytes()
