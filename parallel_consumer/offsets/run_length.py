"""RunLength v1/v2: alternating run lengths over the encoded range, the first run incomplete.

Layout: a flat sequence of big-endian signed ``int16`` (v1) or ``int32`` (v2) run lengths with no
count header. The first run counts incomplete offsets and may be 0; runs then alternate
complete/incomplete. The last run is the tail, whichever state it is in. Encoding lives in
``_ranges``, which builds these bytes for a whole range at once.

What the encoders (Java's and ours) write is narrower than what decodes: either ``[0]`` (an
empty range) or an even number of runs whose first is >= 0 and every other >= 1 (the range ends
with the highest succeeded offset, so the last run is complete; runs after the first are never
empty). Having no count header, a RunLength map is not self-delimiting: a map cut after an even
number of runs is itself such a map. :func:`shortest_written_prefix` is what the tolerant decoder
and the encoder's choice use to reason about that.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from itertools import accumulate, chain

import numpy as np
import numpy.typing as npt

from parallel_consumer.offsets.errors import OffsetDecodeError

__all__ = ["decode_run_length", "parse_runs", "shortest_written_prefix"]

# array typecodes of exactly 16 and 32 bits on this platform
_TYPECODE = {
    1: next(code for code in "hil" if array(code).itemsize == 2),
    2: next(code for code in "hil" if array(code).itemsize == 4),
}
_WIDTH = {1: 2, 2: 4}
_SWAP = sys.byteorder == "little"


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


def parse_runs(data: bytes, version: int) -> npt.NDArray[np.int64]:
    """Every whole run in ``data`` (a trailing partial value is left out), as int64."""
    width = _WIDTH[version]
    usable = len(data) - len(data) % width
    dtype = ">i2" if version == 1 else ">i4"
    return np.frombuffer(data, dtype=dtype, count=usable // width).astype(np.int64)


def shortest_written_prefix(runs: npt.NDArray[np.int64], counts: Iterable[int]) -> int | None:
    """The smallest ``j`` of ``counts`` (ascending) whose first ``j`` runs an encoder could have
    written: ``[0]``, or an even count >= 2 with the first run >= 0 and the others >= 1.

    Stops at the first ``j`` past the first run that breaks the pattern, so it costs O(1) calls
    beyond one vectorised scan of ``runs``.
    """
    if not runs.size or runs[0] < 0:
        return None
    broken = np.flatnonzero(runs[1:] < 1)
    # runs[:j] keeps the pattern for j up to the index of the first broken run (runs[1:] offset)
    longest = int(broken[0]) + 1 if broken.size else runs.size
    for count in counts:
        if count > runs.size or (count > longest and count > 1):
            return None
        if (count == 1 and runs[0] == 0) or (count >= 2 and count % 2 == 0):
            return count
    return None
