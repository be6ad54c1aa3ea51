"""Offset-map codec timings: ``python benchmarks/offsets_bench.py [--runs N] [--seed S]``.

Encodes and decodes a random incomplete set (in a ``SortedList``) for each scenario and prints
the median of N runs, with the encoding chosen and its metadata size. A script, not a test: the
numbers depend on the machine, and on a shared machine on the moment, so it also prints two
reference timings taken in the same run (a pure-Python loop and zstd on fixed bytes) that show
how fast the machine was while it ran.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(f"median of {args.runs} runs")
    # 64 KiB shaped like a RunLength v2 payload: big-endian int32 runs of 1 to 9.
    reference_rng = random.Random(0)
    reference = b"".join(reference_rng.randrange(1, 10).to_bytes(4, "big") for _ in range(16384))
    compressor = zstandard.ZstdCompressor(level=3)
    loop_ms = _median_ms(args.runs, partial(sum, range(100_000)))
    zstd_ms = _median_ms(args.runs, partial(compressor.compress, reference))
    print(f"machine reference: sum(range(100_000)) {loop_ms:.3f} ms, zstd 64 KiB {zstd_ms:.3f} ms")
    for name, length, count in SCENARIOS:
        # The base offset is always incomplete (it is the committed offset); the rest are random.
        incomplete = SortedList([BASE, *rng.sample(range(BASE + 1, BASE + length - 1), count - 1)])
        highest = BASE + length - 1
        encode = partial(encode_offset_map, BASE, highest, incomplete)
        encoded = encode()
        assert encoded is not None
        decode = partial(decode_offset_map, BASE, encoded.metadata)
        assert decode().incomplete == tuple(incomplete)
        print(
            f"{name}: encode {_median_ms(args.runs, encode):6.3f} ms  "
            f"decode {_median_ms(args.runs, decode):6.3f} ms  "
            f"-> {encoded.encoding.name}, {encoded.size} chars"
        )


if __name__ == "__main__":
    main()
