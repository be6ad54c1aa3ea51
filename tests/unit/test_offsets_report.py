"""``pc offsets``' report of one partition, from what the broker stores (no broker here)."""

from __future__ import annotations

import io
import random

import pytest

from parallel_consumer.cli.offsets import _print_table, describe, incomplete_ranges
from parallel_consumer.offsets import encode_offset_map


@pytest.mark.parametrize(
    ("offsets", "limit", "ranges"),
    [
        ((), None, []),
        ((3,), None, [[3, 3]]),
        ((3, 4, 5, 9, 11, 12), None, [[3, 5], [9, 9], [11, 12]]),
        ((3, 4, 5, 9, 11, 12), 2, [[3, 5], [9, 9]]),
    ],
)
def test_incomplete_offsets_are_shown_as_runs(offsets, limit, ranges):
    assert incomplete_ranges(offsets, limit) == ranges


def test_a_map_is_decoded_with_its_encoding_size_and_lag():
    encoded = encode_offset_map(100, 110, [100, 103, 104])
    assert encoded is not None
    report = describe("t", 2, (100, encoded.metadata), 150, exact=True, ranges=None)
    assert report.committed_offset == 100
    assert report.lag == 50
    assert report.incomplete_count == 3
    assert report.incomplete_ranges == [[100, 100], [103, 104]]
    assert report.encoding == "".join(p.capitalize() for p in encoded.encoding.name.split("_"))
    assert report.metadata_bytes == encoded.size
    assert report.decode_error is None


def test_a_partition_without_a_commit_has_no_offset_and_no_lag():
    report = describe("t", 0, None, 42, exact=True, ranges=5)
    assert (report.committed_offset, report.lag, report.encoding) == (None, None, None)
    assert report.end_offset == 42


def test_metadata_that_is_not_a_map_is_reported_not_raised():
    report = describe("t", 0, (7, "not a map!"), 9, exact=False, ranges=5)
    assert report.committed_offset == 7
    assert report.lag == 2
    assert report.decode_error
    assert report.incomplete_count == 0


def test_no_metadata_means_nothing_unfinished_above_the_offset():
    report = describe("t", 0, (7, ""), 7, exact=True, ranges=5)
    assert (report.incomplete_count, report.highest_seen, report.encoding) == (0, 6, None)


def test_a_spilled_map_is_reported_like_an_inline_one_with_where_it_lives():
    holes = sorted({100, *random.Random(5).sample(range(101, 100_000), 5_000)})
    encoded = encode_offset_map(100, 100_000, holes)
    assert encoded is not None
    assert encoded.size > 4096
    reference = "!pc-map/1/g.pc-offsets/0/81/0badcafe!"
    report = describe(
        "t",
        2,
        (100, encoded.metadata),
        100_500,
        exact=False,
        ranges=2,
        spilled=(reference, "g.pc-offsets[0]@81"),
    )
    assert report.incomplete_count == len(holes)
    assert report.highest_seen == 100_000
    assert report.metadata_bytes == len(reference)
    assert report.map_bytes == encoded.size
    assert report.spilled_to == "g.pc-offsets[0]@81"
    out = io.StringIO()
    _print_table([report], out)
    assert f"t[2] map spilled: {encoded.size} bytes in g.pc-offsets[0]@81" in out.getvalue()


def test_a_spilled_map_that_cannot_be_read_is_reported_not_raised():
    spilled = ("!pc-map/1/g.pc-offsets/0/81/0badcafe!", "g.pc-offsets[0]@81")
    report = describe("t", 2, (100, ""), 150, exact=True, ranges=2, spilled=spilled)
    assert report.incomplete_count == 0
    assert report.decode_error is not None
    assert "g.pc-offsets[0]@81" in report.decode_error
