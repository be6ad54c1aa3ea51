"""L1's figures: percentiles, CDF points, commit coverage and the keep-up verdict (pure)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parallel_consumer.bench.latency.session import RunResult, goals, summarise
from parallel_consumer.bench.latency.stats import (
    Verdict,
    cdf_points,
    commit_times,
    latencies,
    percentile,
    percentiles,
    verdict,
)


def test_nearest_rank_percentiles_of_a_hundred_values():
    values = [float(v) for v in range(1, 101)]

    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 99.9) == 100.0
    assert percentile(values, 100) == 100.0
    assert percentile(values, 0) == 1.0


def test_p99_9_of_ten_thousand_values_is_a_real_sample_below_the_maximum():
    values = [float(v) for v in range(10_000)]

    assert percentiles(values) == {"p50": 4999.0, "p99": 9899.0, "p99.9": 9989.0}


def test_percentiles_of_nothing_are_nan_and_out_of_range_is_refused():
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="within 0-100"):
        percentile([1.0], 101)


@given(st.lists(st.floats(min_value=0, max_value=1e4), min_size=1, max_size=300))
def test_a_percentile_has_at_least_its_share_of_values_at_or_below_it(values):
    ordered = sorted(values)
    for q in (50, 99, 99.9):
        p = percentile(ordered, q)
        assert p in ordered
        assert sum(v <= p for v in ordered) >= q / 100 * len(ordered)


def test_cdf_points_rise_to_one_and_reach_into_the_tail():
    values = [float(v) for v in range(100_000)]

    points = cdf_points(values, points=100)

    xs = [x for x, _ in points]
    fractions = [f for _, f in points]
    assert xs == sorted(xs)
    assert fractions == sorted(fractions)
    assert points[-1] == (99_999.0, 1.0)
    # The tail is drawn from real samples: p99.9 and p99.99 are among the points
    assert 0.999 in fractions
    assert 0.9999 in fractions
    assert len(points) < 200
    assert cdf_points([]) == []


@given(st.lists(st.floats(min_value=0, max_value=1e4), min_size=1, max_size=500))
def test_each_cdf_point_is_the_true_fraction_at_or_below_its_value(values):
    for x, fraction in cdf_points(values):
        assert x in values
        assert sum(v <= x for v in values) / len(values) >= fraction


def test_a_commit_covers_every_offset_below_it_from_its_acknowledgement_on():
    # Given commits of partition 0 at offset 3 (t=10) then 6 (t=20), partition 1 at 2 (t=15)
    commits = [(20.0, 0, 6), (10.0, 0, 3), (15.0, 1, 2)]
    records = [(0, 0), (0, 2), (0, 3), (0, 5), (0, 6), (1, 1), (1, 2), (2, 0)]

    acked = commit_times(commits, records)

    # Then offsets 0-2 were acknowledged at 10, 3-5 at 20, and what no commit covered is absent
    assert acked == {(0, 0): 10.0, (0, 2): 10.0, (0, 3): 20.0, (0, 5): 20.0, (1, 1): 15.0}


def test_an_older_commit_answered_late_does_not_lower_the_covered_offsets():
    # Given a commit of 5 acknowledged at t=1 and a stale one of 2 answered at t=2
    acked = commit_times([(1.0, 0, 5), (2.0, 0, 2), (3.0, 0, 9)], [(0, 4), (0, 7)])

    assert acked == {(0, 4): 1.0, (0, 7): 3.0}


def test_latencies_count_only_the_records_that_got_there():
    produced = {(0, 1): 100.0, (0, 2): 100.5, (0, 3): 101.0}
    done = {(0, 1): 100.01, (0, 2): 100.52, (9, 9): 5.0}

    assert latencies(produced, done) == pytest.approx([0.01, 0.02])


def steady(rate: float, seconds: float, delay: float) -> tuple[dict, dict]:
    """Records at ``rate`` for ``seconds``, each handled ``delay`` after it was produced."""
    produced = {(0, i): i / rate for i in range(int(rate * seconds))}
    return produced, {k: t + delay for k, t in produced.items()}


def test_a_contestant_handling_each_record_soon_after_it_was_produced_keeps_up():
    produced, done = steady(1000, 10, 0.02)

    result = verdict(produced, done)

    assert result.keeps_up
    assert result.unfinished == 0
    # Its backlog at the end is what is in flight: 20 ms of records
    assert 15 <= result.backlog_at_end <= 25
    assert result.latency_growth == pytest.approx(0.0)


def test_a_slow_but_steady_contestant_still_keeps_up():
    # Given every record handled 2 s after it was produced (a long but constant delay)
    produced, done = steady(100, 10, 2.0)

    assert verdict(produced, done).keeps_up


def test_a_contestant_handling_slower_than_the_rate_cannot_keep_up_and_its_backlog_is_shown():
    # Given 1,000 records/s for 10 s, handled at 800/s from the start (all of them, late)
    produced = {(0, i): i / 1000 for i in range(10_000)}
    done = {(0, i): i / 800 for i in range(10_000)}

    result = verdict(produced, done)

    assert not result.keeps_up
    assert "latency grew" in result.reason
    assert result.latency_growth == pytest.approx(1.25, abs=0.05)
    assert result.backlog_at_end == pytest.approx(10_000 - 8000, abs=5)


def test_records_left_unhandled_when_the_run_ended_mean_it_did_not_keep_up():
    produced, done = steady(100, 10, 0.01)
    for i in range(990, 1000):
        done.pop((0, i))

    result = verdict(produced, done)

    assert not result.keeps_up
    assert result.unfinished == 10
    assert "unhandled" in result.reason


def test_records_outside_the_produced_ones_such_as_primers_do_not_count():
    produced, done = steady(100, 5, 0.01)
    done[(0, -1)] = 0.0

    assert verdict(produced, done) == verdict(*steady(100, 5, 0.01))


def run(delay: float, keeps_up: bool = True) -> RunResult:
    v = Verdict(keeps_up, 3, 0.0, 0, "sustained" if keeps_up else "latency grew")
    lat = [delay + i / 10_000 for i in range(1000)]
    return RunResult(v, lat, [x + 0.1 for x in lat], 1000, 0.001)


def test_a_summary_takes_each_percentile_as_the_median_over_runs():
    # Given three runs whose latencies are 0-99.9 ms above 10, 30 and 20 ms
    summary = summarise("pc", [run(0.010), run(0.030), run(0.020)], [])

    # Then each percentile is the middle run's: its p50 is 20 + 49.9 ms, its p99 20 + 98.9 ms
    assert summary["keeps_up"]
    assert summary["done_ms"]["p50"] == pytest.approx(69.9)
    assert summary["done_ms"]["p99"] == pytest.approx(118.9)
    assert summary["commit_ms"]["p50"] == pytest.approx(summary["done_ms"]["p50"] + 100)
    assert summary["done_cdf_ms"][-1][1] == 1.0


def test_a_summary_with_one_run_not_keeping_up_does_not_keep_up():
    summary = summarise("serial", [run(0.01), run(0.5, keeps_up=False)], ["x: boom"])

    assert not summary["keeps_up"]
    assert summary["runs_kept_up"] == 1
    assert summary["errors"] == ["x: boom"]


def test_the_goals_compare_our_p99_with_every_peer_and_with_the_half_load_limit():
    def entry(load: float, ours: float, peer: float, peer_keeps_up: bool = True) -> dict:
        return {
            "load": load,
            "results": {
                "pc": summarise("pc", [run(ours)], []),
                "serial": summarise("serial", [run(peer, peer_keeps_up)], []),
            },
        }

    report = goals(
        [entry(0.25, 0.010, 0.020), entry(0.5, 0.040, 0.030), entry(0.8, 0.5, 0.1, False)],
        work_ms=5,
    )

    assert report["p99_below_every_peer"] == {
        "0.25": {"serial": True},
        "0.5": {"serial": False},
        # A peer that cannot keep up is above us whatever its figures
        "0.8": {"serial": True},
    }
    assert report["p99_at_half_load"]["limit_ms"] == 35
    assert report["p99_at_half_load"]["met"] is False


def test_the_client_floor_is_no_peer_in_the_goals_and_a_run_without_commits_has_no_figure():
    # Given raw (no work, no commits) faster than us at half load
    raw = summarise("raw", [RunResult(run(0.001).verdict, [0.001] * 10, [], 10, 0.0)], [])
    entry = {"load": 0.5, "results": {"pc": summarise("pc", [run(0.01)], []), "raw": raw}}

    report = goals([entry], work_ms=5)

    # Then it is not compared with us, and its commit latencies are None (JSON has no NaN)
    assert report["p99_below_every_peer"] == {"0.5": {}}
    assert raw["commit_ms"] == {"p50": None, "p99": None, "p99.9": None}
    assert raw["commit_cdf_ms"] == []
