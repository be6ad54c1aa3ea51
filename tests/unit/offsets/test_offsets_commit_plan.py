"""Unit tests of plan_commit: the committed offset, the metadata and the back-pressure status."""

from __future__ import annotations

from typing import Any

import pytest
from sortedcontainers import SortedList

from parallel_consumer.offsets import (
    CommitPlan,
    MetadataStatus,
    OffsetEncoding,
    decode_offset_map,
    encode_offset_map,
    plan_commit,
)


def test_nothing_succeeded_and_nothing_incomplete_commits_nothing() -> None:
    assert plan_commit(SortedList(), -1) is None


def test_no_incompletes_commits_the_next_offset_without_metadata() -> None:
    assert plan_commit(SortedList(), 41) == CommitPlan(
        offset=42, metadata="", status=MetadataStatus.FITS, encoding=None, size=0
    )


def test_incompletes_commit_the_lowest_with_the_map() -> None:
    # Given the worked example of the reference notes
    plan = plan_commit(SortedList([100, 103]), 105)

    assert plan == CommitPlan(
        offset=100,
        metadata="bAAGNgA=",
        status=MetadataStatus.FITS,
        encoding=OffsetEncoding.BIT_SET,
        size=8,
    )


@pytest.mark.parametrize("highest_succeeded", [-1, 50, 99, 100])
def test_nothing_succeeded_above_the_base_needs_no_map(highest_succeeded: int) -> None:
    plan = plan_commit(SortedList([100, 103]), highest_succeeded)

    assert plan is not None
    assert (plan.offset, plan.metadata, plan.status) == (100, "", MetadataStatus.FITS)


# The worked example is 8 characters: a limit of 10 with ratio 0.8 puts the NEAR_LIMIT line at 8.
@pytest.mark.parametrize(
    ("max_bytes", "ratio", "status", "metadata"),
    [
        (11, 0.75, MetadataStatus.FITS, "bAAGNgA="),  # 8 < 8.25
        (10, 0.8, MetadataStatus.NEAR_LIMIT, "bAAGNgA="),  # 8 >= 8.0
        (8, 0.75, MetadataStatus.NEAR_LIMIT, "bAAGNgA="),  # exactly at the limit still fits
        (7, 0.75, MetadataStatus.TOO_LARGE, ""),  # over the limit: offset only
    ],
)
def test_status_at_the_thresholds(
    max_bytes: int, ratio: float, status: MetadataStatus, metadata: str
) -> None:
    plan = plan_commit(
        SortedList([100, 103]), 105, max_metadata_bytes=max_bytes, near_limit_ratio=ratio
    )

    assert plan is not None
    assert (plan.offset, plan.status, plan.metadata, plan.size) == (100, status, metadata, 8)
    assert plan.encoding is OffsetEncoding.BIT_SET


def test_no_encoding_possible_commits_the_offset_alone() -> None:
    plan = plan_commit(SortedList([0]), 2**32)

    assert plan == CommitPlan(
        offset=0, metadata="", status=MetadataStatus.NO_ENCODING, encoding=None, size=0
    )


def test_force_is_passed_to_the_encoder() -> None:
    plan = plan_commit(SortedList([100, 103]), 105, force=OffsetEncoding.RUN_LENGTH_V2)

    assert plan is not None
    assert plan.encoding is OffsetEncoding.RUN_LENGTH_V2
    assert decode_offset_map(plan.offset, plan.metadata, exact=True).incomplete == (100, 103)


def test_plan_metadata_matches_encode_offset_map() -> None:
    incompletes = SortedList([5, 9, 10, 30, 31, 40])
    plan = plan_commit(incompletes, 35)
    encoded = encode_offset_map(5, 35, incompletes)

    assert plan is not None
    assert encoded is not None
    assert (plan.metadata, plan.encoding, plan.size) == (
        encoded.metadata,
        encoded.encoding,
        encoded.size,
    )


@pytest.mark.parametrize(
    "incompletes",
    [
        pytest.param({103, 100}, id="set"),
        pytest.param(frozenset({100, 103}), id="frozenset"),
        pytest.param([103, 100], id="unsorted-list"),
        pytest.param((103, 100, 103), id="tuple-with-duplicates"),
        pytest.param(iter([103, 100]), id="iterator"),
        pytest.param([103, 100, 100], id="list-with-duplicates"),
    ],
)
def test_any_iterable_of_incompletes_plans_like_the_sorted_list(incompletes: Any) -> None:
    # When the worked example's incomplete set comes unsorted, as a set, or with duplicates
    plan = plan_commit(incompletes, 105)

    # Then the committed offset is still the lowest incomplete one, with the same map
    assert plan == plan_commit(SortedList([100, 103]), 105)


def test_an_unsorted_list_never_commits_above_its_lowest_offset() -> None:
    plan = plan_commit([103, 100], 101)

    assert plan is not None
    assert plan.offset == 100


@pytest.mark.parametrize("incompletes", [[], set(), iter(())], ids=["list", "set", "iterator"])
def test_no_incompletes_in_any_container_commits_the_next_offset(incompletes: Any) -> None:
    assert plan_commit(incompletes, 41) == plan_commit(SortedList(), 41)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_metadata_bytes": 0}, "max_metadata_bytes"),
        ({"near_limit_ratio": 0.0}, "near_limit_ratio"),
        ({"near_limit_ratio": 1.5}, "near_limit_ratio"),
    ],
)
def test_invalid_limits_are_rejected(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_commit(SortedList([1]), 5, **kwargs)  # type: ignore[arg-type]
