"""RunLength v1/v2: alternating run lengths over the encoded range, the first run incomplete.

Layout: a flat sequence of big-endian signed ``int16`` (v1) or ``int32`` (v2) run lengths with no
count header. The first run counts incomplete offsets and may be 0; runs then alternate
complete/incomplete. The last run is the tail, whichever state it is in. Encoding lives in
``_ranges``, which builds these bytes for a whole range at once.
"""

from __future__ import annotations

import sys
from array import array
from itertools import accumulate, chain

from parallel_consumer.offsets.errors import OffsetDecodeError

__all__ = ["decode_run_length"]

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
