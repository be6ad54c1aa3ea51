"""L1's open-loop schedule and its Zipf keys (pure: no broker, no clock)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parallel_consumer.bench.latency.load import (
    LoadSpec,
    RateSchedule,
    partition_of,
    plan_keys,
    zipf_keys,
)


def test_the_schedule_sends_record_i_at_i_over_the_rate_from_its_start():
    # Given 100 records/s for 2 s from t=1000
    schedule = RateSchedule(100.0, 2.0, 1000.0)

    # Then it holds 200 records, the first due at the start and each 10 ms after the last
    assert schedule.count == 200
    assert schedule.send_time(0) == 1000.0
    assert schedule.send_time(150) == pytest.approx(1001.5)


def test_nothing_is_due_before_the_start_and_never_more_than_the_whole_run():
    schedule = RateSchedule(100.0, 2.0, 1000.0)

    assert schedule.due(999.999) == 0
    assert schedule.due(1000.0) == 1
    assert schedule.due(1000.0105) == 2
    assert schedule.due(5000.0) == 200


def test_a_producer_that_woke_late_finds_every_overdue_record_due_at_once():
    # Given a producer that sent 10 records and then slept 0.5 s too long (open loop)
    schedule = RateSchedule(100.0, 2.0, 0.0)

    # Then the records due meanwhile are all due now, with no wait before them
    assert schedule.due(0.6) == 61
    assert schedule.wait(10, 0.6) == 0.0
    # And once caught up, it waits for the next record's time
    assert schedule.wait(61, 0.6) == pytest.approx(0.01)
    assert schedule.wait(200, 0.6) == 0.0


@given(
    rate=st.floats(min_value=0.5, max_value=5000),
    duration=st.floats(min_value=0, max_value=30),
    now=st.floats(min_value=-10, max_value=60),
)
def test_due_never_decreases_and_counts_exactly_the_records_whose_time_came(rate, duration, now):
    schedule = RateSchedule(rate, duration, 0.0)
    due = schedule.due(now)

    assert 0 <= due <= schedule.count
    assert schedule.due(now + 0.01) >= due
    if due:
        assert schedule.send_time(due - 1) <= now + 1e-9
    if due < schedule.count:
        assert schedule.send_time(due) > now - 1e-9


@pytest.mark.parametrize("rate", [0.0, -1.0, float("inf"), float("nan")])
def test_a_rate_that_is_not_a_positive_number_is_refused(rate):
    with pytest.raises(ValueError, match="rate"):
        RateSchedule(rate, 1.0, 0.0)


def test_zipf_keys_make_the_first_key_the_hottest_in_the_zipf_proportions():
    # Given 200,000 keys drawn over 100 keys with exponent 1
    counts = Counter(zipf_keys(100, 1.0, 200_000, seed=1))

    # Then key k is drawn about 1/(k+1) as often as key 0 (within sampling noise)
    harmonic = sum(1 / (k + 1) for k in range(100))
    assert counts[0] / 200_000 == pytest.approx(1 / harmonic, rel=0.03)
    assert counts[0] / counts[1] == pytest.approx(2.0, rel=0.05)
    assert counts[0] / counts[9] == pytest.approx(10.0, rel=0.1)
    # And every draw is a key of the range, many keys repeat (not all distinct)
    assert set(counts) <= set(range(100))
    assert len(counts) == 100


def test_zipf_exponent_zero_is_uniform():
    counts = Counter(zipf_keys(10, 0.0, 100_000, seed=2))

    assert min(counts.values()) / max(counts.values()) > 0.9


def test_the_same_seed_gives_the_same_keys_and_another_seed_other_keys():
    assert zipf_keys(1000, 1.0, 500, seed=3) == zipf_keys(1000, 1.0, 500, seed=3)
    assert zipf_keys(1000, 1.0, 500, seed=3) != zipf_keys(1000, 1.0, 500, seed=4)


def test_bad_key_counts_are_refused():
    with pytest.raises(ValueError, match="keys"):
        zipf_keys(0, 1.0, 10, seed=1)
    with pytest.raises(ValueError, match="count"):
        zipf_keys(10, 1.0, -1, seed=1)


def test_every_record_of_a_key_goes_to_one_partition_in_the_plan():
    # Given the plan of a run on 4 partitions
    spec = LoadSpec(partitions=4, keys=50)
    plan = plan_keys(spec, 5000)

    # Then each key has exactly one partition, the one partition_of names
    partitions: dict[int, set[int]] = {}
    for key, partition in plan:
        partitions.setdefault(key, set()).add(partition)
    assert all(p == {partition_of(k, 4)} for k, p in partitions.items())
    assert {p for _, p in plan} == {0, 1, 2, 3}
