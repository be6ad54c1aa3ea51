"""RunLength v1/v2: alternating run lengths over the encoded range, the first run incomplete.

Layout: a flat sequence of big-endian signed ``int16`` (v1) or ``int32`` (v2) run lengths with no
count header. The first run counts incomplete offsets and may be 0; runs then alternate
complete/incomplete. The last run is the tail, whichever state it is in.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from itertools import accumulate, chain, compress
from operator import sub

from parallel_consumer.offsets.errors import OffsetDecodeError

__all__ = [
    "decode_run_length",
    "encode_runs",
    "encoded_runs_size",
    "runs_from_incompletes",
]

# array typecodes of exactly 16 and 32 bits on this platform
_TYPECODE = {
    1: next(code for code in "hil" if array(code).itemsize == 2),
    2: next(code for code in "hil" if array(code).itemsize == 4),
}
_WIDTH = {1: 2, 2: 4}
_MAX_RUN = {1: 2**15 - 1, 2: 2**31 - 1}
_SWAP = sys.byteorder == "little"


def runs_from_incompletes(length: int, relative_incompletes: Sequence[int]) -> list[int]:
    """The run lengths Java's ``RunLengthEncoder`` emits for a range of ``length`` offsets.

    ``relative_incompletes`` must be strictly increasing and within ``[0, length)``. Works in
    O(len(relative_incompletes)) with C-level iteration; the range itself is never materialised.
    """
    count = len(relative_incompletes)
    if count == 0:
        return [0, length] if length else [0]
    first, last = relative_incompletes[0], relative_incompletes[-1]
    # A gap (difference > 1) between neighbours closes an incomplete run and opens a complete one.
    gaps = list(map(sub, relative_incompletes[1:], relative_incompletes[:-1]))
    breaks = list(compress(range(count - 1), map((1).__lt__, gaps)))
    starts = [first, *map(relative_incompletes.__getitem__, map((1).__add__, breaks))]
    ends = [*map(relative_incompletes.__getitem__, breaks), last]
    runs = [0] * (2 * len(starts) - 1)
    runs[0::2] = map((1).__add__, map(sub, ends, starts))
    runs[1::2] = map((-1).__add__, map(gaps.__getitem__, breaks))
    head = [0, first] if first else []
    tail = [length - 1 - last] if last < length - 1 else []
    return head + runs + tail


def encoded_runs_size(runs: Sequence[int], version: int) -> int | None:
    """Bytes :func:`encode_runs` would return; None when a run overflows the version's width."""
    if runs and max(runs) > _MAX_RUN[version]:
        return None
    return _WIDTH[version] * len(runs)


def encode_runs(runs: Sequence[int], version: int) -> bytes | None:
    """Serialise run lengths (no magic byte), or None when a run overflows (v1: 32767)."""
    if encoded_runs_size(runs, version) is None:
        return None
    packed = array(_TYPECODE[version], runs)
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def decode_run_length(
    data: bytes, version: int, base: int, *, max_incompletes: int
) -> tuple[int, tuple[int, ...]]:
    """Decode encoder data (no magic byte) into ``(highest_seen, sorted incomplete offsets)``.

    ``highest_seen`` follows Java's ``OffsetRunLength`` exactly, including its quirk of starting at
    0 rather than -1 when ``base`` is 0. Unlike Java, a trailing partial value or a negative run is
    rejected instead of being ignored or walking backwards.
    """
    width = _WIDTH[version]
    if len(data) % width:
        raise OffsetDecodeError(
            f"RunLength v{version} data is truncated: {len(data)} bytes, not a multiple of {width}"
        )
    runs = array(_TYPECODE[version])
    runs.frombytes(data)
    if _SWAP:
        runs.byteswap()
    if runs and min(runs) < 0:
        raise OffsetDecodeError(f"RunLength v{version} data contains a negative run length")
    incomplete_count = sum(runs[0::2])
    if incomplete_count > max_incompletes:
        raise OffsetDecodeError(
            f"RunLength v{version} data would decode to {incomplete_count} incomplete offsets, "
            f"more than the limit of {max_incompletes}"
        )
    if len(runs) == 0 or (len(runs) == 1 and runs[0] == 0):
        highest_seen = base - 1 if base > 0 else 0
    else:
        highest_seen = base + sum(runs) - 1
    starts = list(accumulate(runs, initial=base))
    ranges = map(range, starts[0 : len(runs) : 2], starts[1::2])
    return highest_seen, tuple(chain.from_iterable(ranges))
