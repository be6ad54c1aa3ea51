"""The benchmark's clock, ideal and checks (pure functions over an observation)."""

from __future__ import annotations

import pytest

from parallel_consumer.bench.measure import ideal_time, measure, order_kept, summarise
from parallel_consumer.bench.model import DataSet, Observation, Row, Work


def row(ordering: str = "KEY", concurrency: int = 4) -> Row:
    return Row(
        workload="T",
        label=ordering,
        data=DataSet(records=4, partitions=2, keys=2),
        ordering=ordering,  # type: ignore[arg-type]
        concurrency=concurrency,
        work=Work("sleep", 1),
    )


def test_unordered_ideal_is_the_work_spread_over_the_concurrency():
    # Given 8 records of 1 s each and 4 at once
    log = [(0, b"k", o, 1.0) for o in range(8)]

    # Then no engine can finish faster than 2 s
    assert ideal_time(log, "UNORDERED", 4) == 2.0


def test_key_ideal_is_bounded_by_the_busiest_key():
    # Given one key with 3 s of work and three keys with 1 s each, 16 at once
    log = [(0, b"hot", 0, 1.0), (0, b"hot", 1, 1.0), (0, b"hot", 2, 1.0)]
    log += [(0, b"k%d" % i, 3 + i, 1.0) for i in range(3)]

    # Then the hot key's 3 s in a row are the ideal
    assert ideal_time(log, "KEY", 16) == 3.0
    # And with 2 at once, the 6 s of work over 2 lanes
    assert ideal_time(log, "KEY", 2) == 3.0
    assert ideal_time(log, "KEY", 1) == 6.0


def test_partition_ideal_counts_partitions_not_keys():
    log = [(0, b"a", 0, 1.0), (0, b"b", 1, 1.0), (1, b"a", 0, 1.0)]
    assert ideal_time(log, "PARTITION", 16) == 2.0
    assert ideal_time(log, "KEY", 16) == 1.0


def test_order_is_broken_when_a_lane_finishes_a_later_offset_first():
    ok = [(0, b"a", 0, 0.0), (0, b"b", 2, 0.0), (0, b"a", 1, 0.0), (0, b"b", 3, 0.0)]
    broken = [(0, b"a", 1, 0.0), (0, b"a", 0, 0.0)]
    assert order_kept(ok, "KEY")
    assert not order_kept(broken, "KEY")
    assert not order_kept(ok, "PARTITION")  # offsets 2 then 1 on partition 0
    assert order_kept(broken, "UNORDERED")


def test_a_replayed_record_is_a_duplicate_not_an_order_violation():
    log = [(0, b"a", 0, 0.0), (0, b"a", 1, 0.0), (0, b"a", 0, 0.0)]
    assert order_kept(log, "KEY")


def test_measure_counts_duplicates_and_missing_records_and_splits_start_up():
    # Given an observation that saw offset 0 twice and never offset 2 of partition 1
    observation = Observation(
        started=100.0,
        first_call=100.5,
        finished=102.5,
        log=[(0, b"a", 0, 0.5), (0, b"a", 0, 0.5), (0, b"a", 1, 0.5), (1, b"b", 0, 0.5)],
    )

    # When it is measured against partitions 0 and 1 holding 2 and 3 records
    m = measure(row("KEY", 4), observation, {0: 2, 1: 3})

    # Then
    assert m.records == 5
    assert m.wall == 2.0
    assert m.startup == 0.5
    assert m.duplicates == 1
    assert m.missing == 2
    assert m.order_ok
    assert m.ideal == pytest.approx(1.5)  # key a: 3 x 0.5 s in a row
    assert m.ratio == pytest.approx(2.0 / 1.5)
    assert m.c_us == pytest.approx(0.5 / 5 * 1e6)


def test_summary_takes_medians_and_sums_what_went_wrong():
    def run(wall: float, duplicates: int) -> Observation:
        return Observation(0.0, 1.0, 1.0 + wall, [(0, b"a", 0, 0.1)] * (1 + duplicates))

    runs = [measure(row(), run(w, d), {0: 1}) for w, d in ((3.0, 0), (1.0, 2), (2.0, 0))]
    summary = summarise("KEY", "pc", runs)
    assert summary.wall == 2.0
    assert summary.duplicates == 2
    assert summary.records_per_s == 0.5
    assert summary.ok


def test_cpu_rows_are_measured_against_the_work_spread_over_the_cores(monkeypatch):
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    cpu_row = Row(
        workload="T",
        label="cpu",
        data=DataSet(records=1000, partitions=1, keys=10),
        ordering="KEY",
        concurrency=16,
        work=Work("cpu", 1.0),
    )
    # Whatever the threads measured (the GIL stretches each record), 1 s of work on 2 cores
    observation = Observation(0.0, 0.0, 2.0, [(0, b"k", o, 0.016) for o in range(1000)])
    assert measure(cpu_row, observation, {0: 1000}).ideal == pytest.approx(0.5)


def test_what_a_contestant_reports_beside_its_log_reaches_the_result_file():
    from parallel_consumer.bench.measure import measure
    from parallel_consumer.bench.model import DataSet, Observation, Row, Work

    row = Row(
        workload="W2",
        label="KEY",
        data=DataSet(records=2, partitions=1, keys=1, value_size=1),
        ordering="KEY",
        concurrency=1,
        work=Work("noop"),
    )
    observation = Observation(
        started=0.0,
        first_call=1.0,
        finished=2.0,
        log=[(0, b"k", 0, 0.0), (0, b"k", 1, 0.0)],
        extra={"runs": 3, "runs_detached": 0},
    )
    measured = measure(row, observation, {0: 2})
    assert measured.as_dict()["extra"] == {"runs": 3, "runs_detached": 0}
