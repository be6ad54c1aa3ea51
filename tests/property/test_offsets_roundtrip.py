"""Property tests: every encoding round-trips, the automatic choice is the smallest map that
reads back exactly, and the plain encodings are byte-for-byte those of a naive per-offset
reference encoder. (Reading back with stray characters: ``test_offsets_read_back.py``.)"""

from __future__ import annotations

import base64
import random
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import groupby

from hypothesis import given, settings
from hypothesis import strategies as st

from parallel_consumer.offsets import (
    DecodedOffsetMap,
    EncodedOffsetMap,
    OffsetEncoding,
    decode_offset_map,
    encode_offset_map,
)

DECODABLE = [e for e in OffsetEncoding if e.decodable]
V1_MAX = 2**15 - 1


@dataclass(frozen=True)
class Case:
    """An encoder input and what decoding it must give back."""

    base: int
    highest: int
    incompletes: list[int]
    length: int  # of the encoded range after Java's H adjustments
    expected: tuple[int, ...]
    max_run: int


BASES = st.one_of(
    st.just(0),
    st.integers(1, 10_000),
    st.integers(2**62 - 1_000, 2**62 + 1_000),
)
# Complete runs are mostly short, sometimes around the v1 limit, sometimes long (forces v2).
COMPLETE_RUNS = st.one_of(
    st.integers(1, 40),
    st.integers(V1_MAX - 3, V1_MAX + 3),
    st.integers(1, 70_000),
)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    base = draw(BASES)
    relative: list[int] = []
    position = 0
    for index in range(draw(st.integers(0, 8))):
        if index % 2 == 0:  # incomplete run; only the first may be empty
            run = draw(st.integers(0 if index == 0 else 1, 30))
            relative.extend(range(position, position + run))
        else:
            run = draw(COMPLETE_RUNS)
        position += run
    position += draw(st.integers(0, 3))  # a complete tail
    highest = draw(
        st.sampled_from(
            [
                *[base + position] * 4,  # the usual case: H above every incomplete
                base + position - 1,  # an incomplete at H itself is not encoded
                -1,  # nothing succeeded yet
                *range(max(-1, base - 5), base + 3),  # H at or below the base
            ]
        )
    )
    extra_above = draw(st.lists(st.integers(1, 5), max_size=2))  # incompletes above H, ignored
    offsets = sorted({base + r for r in relative} | {max(highest, base) + e for e in extra_above})
    adjusted = max(base if highest == -1 else highest, base - 1)
    length = adjusted - base + 1
    expected = tuple(o for o in offsets if base <= o < highest)
    max_run = _max_run(base, length, expected)
    return Case(base, highest, offsets, length, expected, max_run)


def _max_run(base: int, length: int, incompletes: tuple[int, ...]) -> int:
    longest, previous = 0, base - 1
    run = 0
    for offset in incompletes:
        gap = offset - previous - 1
        longest = max(longest, gap)
        run = run + 1 if gap == 0 else 1
        longest = max(longest, run)
        previous = offset
    return max(longest, base + length - 1 - previous)


@settings(max_examples=1000, deadline=None)
@given(cases())
def test_every_forced_encoding_round_trips(case: Case) -> None:
    for encoding in DECODABLE:
        encoded = encode_offset_map(case.base, case.highest, case.incompletes, force=encoding)
        overflows = (case.length > V1_MAX if encoding.is_bitset else case.max_run > V1_MAX) and (
            encoding.version == 1
        )
        if overflows:
            assert encoded is None, encoding
            continue
        assert encoded is not None, encoding
        assert encoded.encoding is encoding
        assert encoded.size == len(encoded.metadata)
        decoded = decode_offset_map(case.base, encoded.metadata, exact=True)
        assert decoded.incomplete == case.expected, encoding
        assert decoded.highest_seen == case.base + case.length - 1, encoding
        assert decoded.encoding is encoding


@settings(max_examples=1000, deadline=None)
@given(cases())
def test_automatic_choice_round_trips_and_is_never_larger_than_a_candidate(case: Case) -> None:
    chosen = encode_offset_map(case.base, case.highest, case.incompletes)
    candidates = [
        encoded
        for encoding in DECODABLE
        if (encoded := encode_offset_map(case.base, case.highest, case.incompletes, force=encoding))
    ]
    # Only plain RunLength maps with a shorter prefix of a written shape read back differently
    exact = [c for c in candidates if decode_offset_map(case.base, c.metadata) == _exactly(case, c)]

    assert chosen is not None
    assert chosen in exact  # one of the candidates, built the same way, and it reads back exactly
    assert all(chosen.size <= other.size for other in exact)
    decoded = decode_offset_map(case.base, chosen.metadata)
    assert decoded.incomplete == case.expected
    assert decoded.highest_seen == case.base + case.length - 1


def _exactly(case: Case, encoded: EncodedOffsetMap) -> DecodedOffsetMap:
    return decode_offset_map(case.base, encoded.metadata, exact=True)


def reference_data(encoding: OffsetEncoding, length: int, relative: set[int]) -> bytes | None:
    """The plain encoder data (no magic byte) built the obvious way, one offset at a time."""
    width, limit = (2, 2**15 - 1) if encoding.version == 1 else (4, 2**31 - 1)
    code = ">h" if encoding.version == 1 else ">i"
    if encoding.is_bitset:
        if length > limit:
            return None
        bits = bytearray((length + 7) // 8 + 1)  # Java's buffer has one spare zero byte
        for r in range(length):
            if r not in relative:
                bits[r // 8] |= 1 << (r % 8)
        return length.to_bytes(width, "big") + bytes(bits)
    states = [r in relative for r in range(length)]
    runs = [len(list(group)) for _, group in groupby(states)]
    if not states or not states[0]:
        runs.insert(0, 0)  # the first run always counts incompletes
    if max(runs) > limit:
        return None
    return b"".join(struct.pack(code, run) for run in runs)


@settings(max_examples=1000, deadline=None)
@given(cases())
def test_plain_encodings_match_a_naive_reference_encoder(case: Case) -> None:
    relative = {offset - case.base for offset in case.expected}
    for encoding in (e for e in DECODABLE if not e.compressed):
        encoded = encode_offset_map(case.base, case.highest, case.incompletes, force=encoding)
        expected = reference_data(encoding, case.length, relative)
        actual = None if encoded is None else base64.b64decode(encoded.metadata)[1:]
        assert actual == expected, encoding


CONTAINERS = st.sampled_from(["set", "frozenset", "generator", "shuffled", "duplicated"])


@settings(max_examples=300, deadline=None)
@given(cases(), CONTAINERS, st.randoms(use_true_random=False))
def test_any_order_or_container_encodes_like_the_sorted_list(
    case: Case, container: str, rng: random.Random
) -> None:
    # Given the same incomplete offsets in another container, order, or with duplicates
    offsets: Iterable[int]
    if container == "set":
        offsets = set(case.incompletes)
    elif container == "frozenset":
        offsets = frozenset(case.incompletes)
    elif container == "generator":
        offsets = (o for o in reversed(case.incompletes))
    else:
        shuffled = list(case.incompletes)
        if container == "duplicated":
            shuffled += rng.choices(case.incompletes, k=len(shuffled)) if shuffled else []
        rng.shuffle(shuffled)
        offsets = shuffled
    materialised = list(offsets)  # a generator can be read only once

    # Then every encoding, and the automatic choice, is the one of the sorted list
    for force in [None, *DECODABLE]:
        expected = encode_offset_map(case.base, case.highest, case.incompletes, force=force)
        source: Iterable[int] = iter(materialised) if container == "generator" else offsets
        assert encode_offset_map(case.base, case.highest, source, force=force) == expected
