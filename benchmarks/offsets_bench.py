"""Offset-map codec timings: ``python benchmarks/offsets_bench.py [--runs N] [--seed S]``.

For each scenario, encodes a random incomplete set and decodes the result, and prints the median
of N back-to-back calls with the encoding chosen and its metadata size. The set is encoded from
the sorted list the engine passes (``IncompleteOffsets.below``) and, for comparison, from a
``SortedList``.

A script, not a test: the numbers depend on the machine and, on a shared machine, on the moment.
So it also times two fixed reference jobs (a pure-Python loop and zstd over 64 KiB) before and
after the scenarios; compare runs made at different times through them.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from functools import partial

import zstandard
from sortedcontainers import SortedList

from parallel_consumer.offsets import decode_offset_map, encode_offset_map

# (name, range length, incomplete count); the budgets: 2 ms and 5 ms to encode.
SCENARIOS = (
    ("100k range / 10k incomplete", 100_000, 10_000),
    ("1M range / 1k incomplete", 1_000_000, 1_000),
)
BASE = 1_000_000_000


def _median_ms(runs: int, call: Callable[[], object]) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1e6


def _reference(runs: int) -> str:
    # 64 KiB shaped like a RunLength v2 payload: big-endian int32 runs of 1 to 9.
    rng = random.Random(0)
    payload = b"".join(rng.randrange(1, 10).to_bytes(4, "big") for _ in range(16384))
    compressor = zstandard.ZstdCompressor(level=3)
    loop = _median_ms(runs, partial(sum, range(100_000)))
    zstd = _median_ms(runs, partial(compressor.compress, payload))
    return f"machine reference: sum(range(100_000)) {loop:.3f} ms, zstd of 64 KiB {zstd:.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(f"medians of {args.runs} calls")
    print(_reference(args.runs))
    for name, length, count in SCENARIOS:
        # The base offset is always incomplete (it is the committed offset); the rest are random.
        offsets = sorted([BASE, *rng.sample(range(BASE + 1, BASE + length - 1), count - 1)])
        highest = BASE + length - 1
        encoded = encode_offset_map(BASE, highest, offsets)
        assert encoded is not None
        assert decode_offset_map(BASE, encoded.metadata).incomplete == tuple(offsets)
        encode = _median_ms(args.runs, partial(encode_offset_map, BASE, highest, offsets))
        sorted_list = SortedList(offsets)
        encode_sl = _median_ms(args.runs, partial(encode_offset_map, BASE, highest, sorted_list))
        decode = _median_ms(args.runs, partial(decode_offset_map, BASE, encoded.metadata))
        print(
            f"{name}: encode {encode:.3f} ms (from a SortedList {encode_sl:.3f} ms), "
            f"decode {decode:.3f} ms -> {encoded.encoding.name}, {encoded.size} chars"
        )
    print(_reference(args.runs))


if __name__ == "__main__":
    main()
