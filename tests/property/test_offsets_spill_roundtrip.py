"""Maps far beyond the 4 KB metadata limit round-trip through a spill: planned as SPILL, written
as a side record, referenced in a few hundred bytes, read back and decoded to exactly the
unfinished offsets. A record that is not the one referenced is never taken for it."""

from __future__ import annotations

import binascii
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parallel_consumer.offsets import MetadataStatus, OffsetDecodeError, decode_offset_map
from parallel_consumer.offsets.commit_plan import plan_commit
from parallel_consumer.offsets.spill import (
    SpillReference,
    checksum,
    default_spill_topic,
    format_reference,
    parse_reference,
    read_side_value,
    side_key,
    side_value,
)

LIMIT = 4096
TOPIC = "orders.pc-offsets"


@st.composite
def large_maps(draw: st.DrawFn) -> tuple[int, int, list[int]]:
    """(committed offset, highest succeeded, incomplete offsets) whose map cannot fit 4 KB."""
    base = draw(st.integers(0, 2**40))
    span = draw(st.integers(200_000, 1_000_000))
    count = draw(st.integers(3_000, 12_000))
    # Thousands of holes: drawn from a seeded generator (drawing each through hypothesis would
    # make every example megabytes of choices); the seed and the shape still shrink.
    holes = set(random.Random(draw(st.integers(0, 2**32))).sample(range(1, span), count))
    return base, base + span, sorted({base, *(base + h for h in holes)})


def _spill(base: int, high: int, incomplete: list[int], side_offset: int) -> tuple[str, bytes]:
    plan = plan_commit(incomplete, high, max_metadata_bytes=LIMIT, spill=True)
    assert plan is not None
    assert plan.status is MetadataStatus.SPILL
    assert plan.offset == base
    assert plan.size > LIMIT
    value = side_value(plan.offset, plan.metadata)
    ref = SpillReference(TOPIC, 0, side_offset, checksum(value))
    return format_reference(ref), value


@settings(max_examples=15, deadline=None)
@given(large_maps(), st.integers(0, 2**62), st.sampled_from(["", "\x00", "\x00garbage\xff"]))
def test_a_spilled_map_restores_exactly_the_unfinished_offsets(
    case: tuple[int, int, list[int]], side_offset: int, stray: str
) -> None:
    base, high, incomplete = case
    reference, value = _spill(base, high, incomplete, side_offset)
    assert len(reference) <= 300  # far below any limit a broker is set to
    ref = parse_reference(reference + stray)  # as confluent-kafka may read it back
    assert ref == SpillReference(TOPIC, 0, side_offset, checksum(value))
    key = side_key("g", "orders", 3)
    found = read_side_value(ref, key, value, expected_key=key, committed_offset=base)
    decoded = decode_offset_map(base, found, exact=True)
    assert decoded.incomplete == tuple(incomplete)
    assert decoded.highest_seen == high


@settings(max_examples=15, deadline=None)
@given(large_maps(), st.data())
def test_a_record_other_than_the_referenced_one_is_refused(
    case: tuple[int, int, list[int]], data: st.DataObject
) -> None:
    base, high, incomplete = case
    reference, value = _spill(base, high, incomplete, 7)
    ref = parse_reference(reference)
    assert ref is not None
    key = side_key("g", "orders", 3)
    # a newer version of the same key's map (one more record finished)
    newer = side_value(base, plan_map(incomplete[:-1] if len(incomplete) > 1 else [], high, base))
    cases = {
        "another version": (key, newer, base),
        "another partition": (side_key("g", "orders", 4), value, base),
        "another group": (side_key("h", "orders", 3), value, base),
        "a tombstone": (key, None, base),
        "another committed offset": (key, value, base + 1),
    }
    name = data.draw(st.sampled_from(sorted(cases)))
    found_key, found_value, committed = cases[name]
    with pytest.raises(OffsetDecodeError):
        read_side_value(ref, found_key, found_value, expected_key=key, committed_offset=committed)


def plan_map(incomplete: list[int], high: int, base: int) -> str:
    plan = plan_commit(incomplete or [high + 1], high, max_metadata_bytes=LIMIT, spill=True)
    assert plan is not None
    return plan.metadata


@settings(max_examples=50, deadline=None)
@given(st.from_regex(r"[A-Za-z0-9._-]{1,249}", fullmatch=True), st.integers(0, 2**31 - 1))
def test_a_reference_is_never_base64_nor_an_offset_map(topic: str, partition: int) -> None:
    reference = format_reference(SpillReference(topic, partition, 2**63 - 1, 0xFFFFFFFF))
    assert parse_reference(reference) == SpillReference(topic, partition, 2**63 - 1, 0xFFFFFFFF)
    # Java's Base64 decoder (and ours) refuse it: Java drops the map and replays.
    with pytest.raises((binascii.Error, ValueError)):
        binascii.a2b_base64(reference, strict_mode=True)
    for exact in (True, False):
        with pytest.raises(OffsetDecodeError):
            decode_offset_map(0, reference, exact=exact)


@given(st.text(max_size=40))
def test_metadata_that_is_not_a_reference_parses_as_none_or_fails_loudly(text: str) -> None:
    try:
        ref = parse_reference(text)
    except OffsetDecodeError:
        assert text.startswith("!pc-map/1/")
    else:
        assert ref is None or text.startswith("!pc-map/1/")


def test_a_map_that_fits_is_committed_inline_byte_for_byte_whether_or_not_maps_spill() -> None:
    incomplete = [100, 103, 150]
    inline = plan_commit(incomplete, 200, max_metadata_bytes=LIMIT)
    spilling = plan_commit(incomplete, 200, max_metadata_bytes=LIMIT, spill=True)
    assert inline == spilling
    assert inline is not None
    assert inline.status is MetadataStatus.FITS


def test_the_default_side_topic_is_named_after_the_group_and_always_a_valid_topic() -> None:
    assert default_spill_topic("orders-app") == "orders-app.pc-offsets"
    odd = default_spill_topic("team a/orders:" + "x" * 400)
    assert odd.endswith(".pc-offsets")
    assert len(odd) <= 249
    assert parse_reference(format_reference(SpillReference(odd, 0, 1, 2))) is not None
