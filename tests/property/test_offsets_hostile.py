"""Property tests: decoding arbitrary input, exactly or as read back, raises only
OffsetDecodeError, quickly and in bounded memory, and commit planning never marks an incomplete
offset as done."""

from __future__ import annotations

import base64
import tracemalloc

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from parallel_consumer.offsets import (
    MAX_DECODED_INCOMPLETES,
    DecodedOffsetMap,
    MetadataStatus,
    OffsetDecodeError,
    OffsetEncoding,
    decode_offset_map,
    plan_commit,
)

MAGICS = [e.magic for e in OffsetEncoding]
COMMITTED = st.one_of(st.just(0), st.integers(0, 2**63 - 1))


def decode_or_reject(committed: int, metadata: str) -> DecodedOffsetMap | None:
    """Decode both ways (exactly, and as read back with possible stray characters)."""
    results = []
    for exact in (True, False):
        try:
            decoded = decode_offset_map(committed, metadata, exact=exact)
        except OffsetDecodeError:
            results.append(None)
            continue
        assert len(decoded.incomplete) <= MAX_DECODED_INCOMPLETES
        assert list(decoded.incomplete) == sorted(set(decoded.incomplete))
        assert all(committed <= o <= decoded.highest_seen for o in decoded.incomplete)
        results.append(decoded)
    return results[0]


@settings(max_examples=1000, deadline=None)
@given(COMMITTED, st.sampled_from(MAGICS) | st.integers(0, 255), st.binary(max_size=64))
def test_random_payloads_raise_only_offset_decode_error(
    committed: int, magic: int, body: bytes
) -> None:
    decode_or_reject(committed, base64.b64encode(bytes((magic,)) + body).decode())


@settings(max_examples=1000, deadline=None)
@given(COMMITTED, st.text(max_size=64))
def test_random_strings_raise_only_offset_decode_error(committed: int, metadata: str) -> None:
    decode_or_reject(committed, metadata)


COMPRESSED_MAGICS = [e.magic for e in OffsetEncoding if e.compressed]


@settings(max_examples=1000, deadline=None)
@given(COMMITTED, st.sampled_from(COMPRESSED_MAGICS), st.binary(max_size=64), st.booleans())
def test_valid_zstd_frames_of_random_data_raise_only_offset_decode_error(
    committed: int, magic: int, body: bytes, streaming: bool
) -> None:
    if streaming:
        compressor = zstandard.ZstdCompressor().compressobj()
        frame = compressor.compress(body) + compressor.flush()
    else:
        frame = zstandard.ZstdCompressor().compress(body)
    decode_or_reject(committed, base64.b64encode(bytes((magic,)) + frame).decode())


@settings(max_examples=1000, deadline=None)
@given(
    st.sampled_from([0x6C, 0x6F, 0x6E, 0x65]),
    st.integers(-(2**31), 2**31 - 1),
    st.binary(max_size=8),
)
def test_hostile_length_fields_are_bounded(magic: int, field: int, tail: bytes) -> None:
    width = 2 if magic in (0x6C, 0x6E) else 4
    field = max(-(2 ** (8 * width - 1)), min(field, 2 ** (8 * width - 1) - 1))
    body = field.to_bytes(width, "big", signed=True) + tail
    decode_or_reject(5, base64.b64encode(bytes((magic,)) + body).decode())


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "read-back"])
@pytest.mark.parametrize("magic", [0x6F, 0x73])
def test_int32_max_bitset_length_over_five_bytes_uses_little_memory(
    magic: int, exact: bool
) -> None:
    body = (2**31 - 1).to_bytes(4, "big") + b"\xff"
    if magic == 0x73:
        body = zstandard.ZstdCompressor().compress(body)
    metadata = base64.b64encode(bytes((magic,)) + body).decode()

    tracemalloc.start()
    try:
        # exact: over the incomplete limit; read back: no encoder writes 5 bytes for that length
        with pytest.raises(OffsetDecodeError, match="limit" if exact else "BitSet v2"):
            decode_offset_map(0, metadata, exact=exact)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


@settings(max_examples=1000, deadline=None)
@given(
    st.integers(0, 2**40),
    st.lists(st.integers(0, 3_000), max_size=60, unique=True),
    st.integers(-1, 3_100),
    st.integers(8, 300),
)
def test_plan_never_marks_an_incomplete_offset_done(
    start: int, relative: list[int], highest_relative: int, max_bytes: int
) -> None:
    # A consistent partition state: the highest succeeded offset is not also incomplete.
    incompletes = SortedList(start + r for r in relative if r != highest_relative)
    highest = -1 if highest_relative == -1 else start + highest_relative

    plan = plan_commit(incompletes, highest, max_metadata_bytes=max_bytes)

    if plan is None:
        assert not incompletes
        assert highest == -1
        return
    assert plan.offset == (incompletes[0] if incompletes else highest + 1)
    assert plan.status in MetadataStatus
    if plan.status in (MetadataStatus.TOO_LARGE, MetadataStatus.NO_ENCODING):
        assert plan.metadata == ""
    if plan.metadata:
        assert plan.size == len(plan.metadata) <= max_bytes
    # After a restart, every offset in [offset, highest_seen] not listed is skipped as done:
    # none of them may be incomplete.
    restored = decode_offset_map(plan.offset, plan.metadata)
    skipped_but_incomplete = [
        o
        for o in incompletes
        if plan.offset <= o <= restored.highest_seen and o not in set(restored.incomplete)
    ]
    assert skipped_but_incomplete == []
    assert restored.highest_seen <= max(highest, plan.offset - 1)
