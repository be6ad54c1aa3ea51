"""The workload and contestant registries: every row well formed, skips explained."""

from __future__ import annotations

import pytest

from parallel_consumer.bench import features
from parallel_consumer.bench.contestants import CONTESTANTS, DEFAULT_PEERS, US
from parallel_consumer.bench.workloads import QUICK, WORKLOADS, quick_rows


@pytest.mark.parametrize("scale", ["full", "quick", "tiny"])
def test_every_workload_has_uniquely_named_rows_at_every_scale(scale):
    for workload in WORKLOADS.values():
        rows = workload.rows(scale)
        assert rows, workload.id
        assert len({r.label for r in rows}) == len(rows), workload.id
        for r in rows:
            assert r.workload == workload.id
            assert r.concurrency >= 1
            assert r.data.records >= 1
            if scale == "tiny":
                assert r.data.records <= 1000, r.name


def test_w1_rows_carry_the_java_librarys_published_figures():
    rows = WORKLOADS["W1"].rows("full")
    assert [r.label for r in rows][:2] == ["PARTITION", "KEY-1"]
    assert {r.label: r.java_published for r in rows}["UNORDERED"] == 2.83
    assert all(r.data.records == 10_000 and r.concurrency == 16 for r in rows)


def test_quick_is_w1_and_w2_reduced():
    assert QUICK == ("W1", "W2")
    assert all(r.data.records <= 20_000 for r in quick_rows())


def test_peers_are_every_contestant_but_us_and_our_own_variants():
    # pc-otel is this library with metrics on, pc-loop with its async handlers on the
    # contestant's loop: asked for by name (--peers pc-otel,pc-loop)
    assert set(DEFAULT_PEERS) == set(CONTESTANTS) - {US, "pc-otel", "pc-loop"}


def test_engine_features_answer_with_a_reason_or_none():
    for probe in (
        features.async_handlers_missing,
        features.process_runner_missing,
        features.poll_and_produce_missing,
        features.uvloop_missing,
    ):
        answer = probe()
        assert answer is None or (isinstance(answer, str) and "\n" not in answer)


def test_a_row_needing_a_missing_feature_is_skipped_by_pc_with_that_reason():
    pc = CONTESTANTS[US]
    for workload in ("W1b", "W4", "W5", "W6"):
        for r in WORKLOADS[workload].rows("tiny"):
            reason = pc.unsupported(r)
            if r.async_handler and r.runner.get("loop_factory") == "uvloop":
                assert reason == (features.async_handlers_missing() or features.uvloop_missing())
            elif r.async_handler:
                assert reason == features.async_handlers_missing()
            elif r.produce is not None:
                assert reason == features.poll_and_produce_missing()
            elif r.runner:
                assert reason == features.process_runner_missing()
            else:
                assert reason is None


def test_uvloop_rows_run_on_uvloop_and_the_others_on_asyncio():
    pc = CONTESTANTS[US]
    rows = [*WORKLOADS["W1b"].rows("full"), *WORKLOADS["W6"].rows("full")]
    uv = [r for r in rows if r.label.endswith(" uvloop")]
    assert {r.label for r in uv} == {
        "KEY-10000 C=1000 async uvloop",
        "UNORDERED C=1000 async uvloop",
        "UNORDERED C=5000 uvloop",
        "KEY-10000 C=5000 uvloop",
    }
    if features.uvloop_missing() is None:
        import uvloop

        assert {pc.options(r).loop_factory for r in uv} == {uvloop.new_event_loop}
    assert {pc.options(r).loop_factory for r in rows if r not in uv} == {None}


def test_share_runs_unordered_rows_only_and_raw_no_op_rows_only():
    w1 = {r.label: r for r in WORKLOADS["W1"].rows("tiny")}
    assert CONTESTANTS["share"].unsupported(w1["KEY-10"])
    assert CONTESTANTS["share"].unsupported(w1["UNORDERED"]) is None
    assert CONTESTANTS["raw"].unsupported(w1["UNORDERED"])
    assert CONTESTANTS["raw"].unsupported(WORKLOADS["W2"].rows("tiny")[0]) is None


def test_only_pc_produces_and_raw_reads_beside_it_on_produce_rows():
    row = WORKLOADS["W4"].rows("tiny")[0]
    for name in ("serial", "pyrallel", "share", "java-pc"):
        assert CONTESTANTS[name].unsupported(row), name
    assert CONTESTANTS["raw"].unsupported(row) is None


def test_pc_loop_runs_async_rows_only_on_the_rows_loop_not_one_of_the_consumers():
    # Given the pc-loop contestant and W6's rows (asyncio's loop and uvloop's)
    contestant = CONTESTANTS["pc-loop"]
    for row in WORKLOADS["W6"].rows("full"):
        # Then it runs them, and its consumer makes no loop of its own (the contestant's is used)
        if row.runner.get("loop_factory") != "uvloop" or features.uvloop_missing() is None:
            assert contestant.unsupported(row) is None
        assert contestant.options(row).loop_factory is None  # type: ignore[attr-defined]
    # And it leaves the thread rows to pc
    assert contestant.unsupported(WORKLOADS["W2"].rows("full")[0]) is not None
