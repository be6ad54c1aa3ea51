"""Commits: what is committed, when a partition counts as committed, and restarts."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError

from parallel_consumer import (
    CommitMode,
    InternalError,
    InvalidMetadataPolicy,
    Options,
    PollContext,
    Retry,
)
from parallel_consumer.kafka import poller as poller_module
from parallel_consumer.offsets import decode_offset_map, encode_offset_map


def test_commit_is_lowest_incomplete_with_offset_map(harness, cluster, clock, wait_until):
    # Given offsets 0..9 where 2 and 5 block (never finish)
    cluster.create_topic("t")
    for i in range(10):
        cluster.produce("t", b"%d" % i, key=b"%d" % i)
    release = threading.Event()

    def handle(ctx: PollContext) -> None:
        if ctx.offset in (2, 5):
            release.wait(10)

    pc = harness.make(Options(ordering="unordered", commit_interval=1), clock=clock)
    pc.poll(handle)
    wait_until(lambda: pc.statistics().records_succeeded == 8)
    # When the commit interval passes
    clock.advance(1.1)
    wait_until(lambda: cluster.committed("g", "t", 0) is not None)
    # Then the committed offset is the lowest incomplete and the map marks 5 as incomplete
    offset, metadata = cluster.committed("g", "t", 0)
    assert offset == 2
    decoded = decode_offset_map(offset, metadata)
    assert set(decoded.incomplete) == {2, 5}
    assert decoded.highest_seen == 9
    release.set()
    wait_until(lambda: pc.statistics().records_succeeded == 10)
    pc.close()
    assert cluster.committed("g", "t", 0) == (10, None)


def test_partition_is_clean_only_after_acknowledgement_and_failed_commits_retry(
    harness, cluster, clock, wait_until
):
    cluster.create_topic("t")
    for i in range(5):
        cluster.produce("t", b"%d" % i, key=b"%d" % i)
    pc = harness.make(Options(commit_interval=1), clock=clock)
    consumer = harness.consumers[0]
    consumer.fail_next_commits(1)
    pc.poll(lambda ctx: None)
    wait_until(lambda: pc.statistics().records_succeeded == 5)
    # When the first commit fails
    clock.advance(1.1)
    wait_until(lambda: pc.statistics().commit_failures == 1)
    # Then the partition is still dirty, and nothing is stored
    assert pc.statistics().partitions[0].dirty
    assert cluster.committed("g", "t", 0) is None
    # When the next interval passes, then the commit is sent again and acknowledged
    clock.advance(1.1)
    wait_until(lambda: pc.statistics().commits_acknowledged == 1)
    snapshot = pc.statistics().partitions[0]
    assert not snapshot.dirty
    assert snapshot.committed_offset == 5
    assert cluster.committed("g", "t", 0) == (5, None)


def test_sync_commit_mode_commits(harness, cluster, clock, wait_until):
    cluster.create_topic("t")
    for i in range(5):
        cluster.produce("t", b"%d" % i)
    pc = harness.make(
        Options(commit_mode=CommitMode.PERIODIC_CONSUMER_SYNC, commit_interval=1), clock=clock
    )
    pc.poll(lambda ctx: None)
    wait_until(lambda: pc.statistics().records_succeeded == 5)
    clock.advance(1.1)
    wait_until(lambda: cluster.committed("g", "t", 0) == (5, None))
    wait_until(lambda: not pc.statistics().partitions[0].dirty)


def test_restart_skips_records_the_offset_map_marks_finished(harness, cluster, wait_until):
    # Given a committed offset 3 whose map says 3, 6 and 8 are unfinished (up to 9 seen)
    cluster.create_topic("t")
    for i in range(12):
        cluster.produce("t", b"%d" % i)
    encoded = encode_offset_map(3, 9, [3, 6, 8])
    assert encoded is not None
    cluster.set_committed("g", "t", 0, 3, encoded.metadata)
    processed: list[int] = []
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        with lock:
            processed.append(ctx.offset)

    # When a consumer of the group starts
    pc = harness.make(Options(ordering="unordered"))
    pc.poll(handle)
    # Then exactly the unfinished records and those above the map run
    wait_until(lambda: len(processed) >= 5)
    pc.close()
    assert sorted(processed) == [3, 6, 8, 10, 11]
    assert pc.statistics().records_skipped == 4
    assert cluster.committed("g", "t", 0) == (12, None)


def test_malformed_metadata_replays_from_committed_offset(harness, cluster, wait_until, caplog):
    cluster.create_topic("t")
    for i in range(6):
        cluster.produce("t", b"%d" % i)
    cluster.set_committed("g", "t", 0, 2, "!!not base64!!")
    processed: list[int] = []
    pc = harness.make(Options(ordering="partition"))
    pc.poll(lambda ctx: processed.append(ctx.offset))
    wait_until(lambda: len(processed) == 4)
    assert processed == [2, 3, 4, 5]
    assert "t[0]" in caplog.text
    assert "cannot decode" in caplog.text


def test_malformed_metadata_with_fail_policy_stops_with_internal_error(
    harness, cluster, wait_until
):
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    cluster.set_committed("g", "t", 0, 0, "AQID")  # magic 0x01: Kafka Streams metadata
    pc = harness.make(Options(invalid_metadata_policy=InvalidMetadataPolicy.FAIL))
    pc.poll(lambda ctx: None)
    wait_until(lambda: pc.failure is not None)
    assert isinstance(pc.failure, InternalError)
    assert "t[0]" in str(pc.failure)
    try:
        pc.wait(5)
    except InternalError:
        pass
    else:
        raise AssertionError("wait() must re-raise the failure")


def test_compaction_gaps_in_restored_map_are_forgotten(harness, cluster, wait_until):
    # Given a map with 2 and 4 unfinished, and record 4 compacted away since
    cluster.create_topic("t")
    for i in range(8):
        cluster.produce("t", b"%d" % i)
    encoded = encode_offset_map(2, 5, [2, 4])
    assert encoded is not None
    cluster.set_committed("g", "t", 0, 2, encoded.metadata)
    cluster.delete_records("t", 0, [4])
    processed: list[int] = []
    pc = harness.make(Options(ordering="partition"))
    pc.poll(lambda ctx: processed.append(ctx.offset))
    wait_until(lambda: len(processed) == 3)
    pc.close()
    assert processed == [2, 6, 7]
    assert cluster.committed("g", "t", 0) == (8, None)


def test_a_commit_whose_answer_never_comes_is_sent_again(
    harness, cluster, clock, wait_until, monkeypatch
):
    # (the poller gives up on the answer after COMMIT_ANSWER_TIMEOUT of real time; the
    # controller's own time-out runs on the fake clock)
    monkeypatch.setattr(poller_module, "COMMIT_ANSWER_TIMEOUT", 0.5)
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    pc = harness.make(Options(commit_interval=1), clock=clock)
    consumer = harness.consumers[0]
    consumer.lose_next_commit_answers(1)
    pc.poll(lambda ctx: None)
    wait_until(lambda: pc.statistics().records_succeeded == 1)
    clock.advance(1.1)
    wait_until(lambda: len(consumer.commit_log) == 1)
    # While the answer may still come, the same commit is not repeated
    clock.advance(5)
    assert len(consumer.commit_log) == 1
    assert pc.statistics().partitions[0].dirty
    # After the pending-commit timeout it is sent again, and that answer cleans the partition
    clock.advance(30)
    wait_until(lambda: pc.statistics().commits_acknowledged == 1)
    assert not pc.statistics().partitions[0].dirty


def test_a_partition_whose_offset_map_nears_the_limit_runs_only_its_holes(
    harness, cluster, clock, wait_until, caplog
):
    # Given offsets 0..39 where every fourth record fails (10 holes below offset 39)
    cluster.create_topic("t")
    for i in range(40):
        cluster.produce("t", b"%d" % i)
    healthy = threading.Event()

    def handle(ctx: PollContext) -> None:
        if ctx.offset % 4 == 1 and not healthy.is_set():
            raise RuntimeError("downstream is down")

    pc = harness.make(
        Options(
            ordering="unordered",
            commit_interval=1,
            retry_delay=100,
            max_metadata_bytes=16,
            spill_offset_maps=False,
        ),
        clock=clock,
    )
    pc.poll(handle)
    wait_until(lambda: pc.statistics().records_succeeded == 30)
    # When a commit finds the map of those holes near the 16-byte limit
    clock.advance(1.1)
    wait_until(lambda: pc.statistics().blocked_partitions == 1, what="blocked")
    assert "t[0]: offset map is" in caplog.text
    assert pc.statistics().partitions[0].metadata_status in ("near_limit", "too_large")
    # Then new records above the highest finished offset wait instead of running
    for i in range(40, 60):
        cluster.produce("t", b"%d" % i)
    wait_until(lambda: pc.statistics().waiting == 20, what="20 waiting")
    assert pc.statistics().records_succeeded == 30
    # When the holes finish, then the partition unblocks and the rest runs
    healthy.set()
    clock.advance(100)
    wait_until(lambda: pc.statistics().records_succeeded == 60, what="60 done")
    assert pc.statistics().blocked_partitions == 0
    pc.close()
    assert cluster.committed("g", "t", 0) == (60, None)


# -- one commit request at a time (a retried older request must not overwrite a newer one) ----


def _ten_records_done_behind_a_held_commit(harness, cluster, wait_until):
    """Offsets 0-9 of t[0] all processed, while the client holds (neither stores nor answers)
    the periodic commit sent when offset 5 was still running."""
    cluster.create_topic("t", 1)
    for i in range(10):
        cluster.produce("t", b"%d" % i, partition=0)
    release = threading.Event()

    def handle(ctx: PollContext) -> None:
        if ctx.offset == 5:
            release.wait(10)

    pc = harness.make(Options(ordering="partition", commit_interval=0.05))
    consumer = harness.consumers[0]
    consumer.hold_commits()
    pc.poll(handle)
    wait_until(lambda: consumer.held_commits() == 1, what="a commit on its way")
    release.set()
    wait_until(lambda: pc.statistics().records_succeeded == 10)
    return pc, consumer


def test_a_newer_commit_waits_for_the_answer_to_the_older_one(harness, cluster, wait_until):
    # Given a commit on its way that the client has not answered (its coordinator is moving)
    pc, consumer = _ten_records_done_behind_a_held_commit(harness, cluster, wait_until)
    # and a newer commit due meanwhile
    wait_until(
        lambda: consumer.held_commits() >= 2 or pc.statistics().poller.commits_queued >= 1,
        what="a newer commit sent or queued",
    )
    # When the client stores the requests on its way newest first (the older one retried)
    consumer.release_commits(reverse=True)
    # Then the engine's acknowledged offset is the group's offset
    wait_until(
        lambda: (p := pc.statistics().partitions[0]).committed_offset == 10 and not p.dirty,
        what="offset 10 acknowledged",
    )
    assert cluster.committed("g", "t", 0) == (10, None)
    pc.close()
    assert cluster.committed("g", "t", 0) == (10, None)
    assert pc.statistics().poller.commits_queued == 0


def test_the_final_commit_at_close_goes_out_after_the_commit_on_its_way(
    harness, cluster, wait_until
):
    # Given a periodic commit of offset 5 on its way, unanswered
    pc, consumer = _ten_records_done_behind_a_held_commit(harness, cluster, wait_until)
    # When the consumer closes (its final commit, of 10, is synchronous)
    closer = threading.Thread(target=pc.close)
    closer.start()
    wait_until(
        lambda: pc.statistics().poller.commits_queued >= 1 or len(consumer.commit_log) >= 2,
        what="the final commit sent or queued",
    )
    # and the commit on its way is answered only then
    consumer.release_commits()
    closer.join(10)
    assert not closer.is_alive()
    # Then the final commit was stored last: the group's offset is 10, not 5
    assert cluster.committed("g", "t", 0) == (10, None)
    assert pc.failure is None


def test_a_commit_the_client_never_answers_does_not_hold_back_the_next(
    harness, cluster, wait_until, monkeypatch
):
    monkeypatch.setattr(poller_module, "COMMIT_ANSWER_TIMEOUT", 0.2)
    cluster.create_topic("t", 1)
    cluster.produce("t", b"a", partition=0)
    pc = harness.make(Options(commit_interval=0.05))
    consumer = harness.consumers[0]
    consumer.lose_next_commit_answers(1)
    seen: list[int] = []
    pc.poll(lambda ctx: seen.append(ctx.offset))
    wait_until(lambda: seen == [0])
    # the lost one counts as failed after the answer timeout and its offsets go out again
    wait_until(lambda: pc.statistics().commits_acknowledged >= 1, what="an acknowledged commit")
    assert len(consumer.commit_log) >= 2
    pc.close()
    assert cluster.committed("g", "t", 0) == (1, None)


def test_an_engine_that_finished_everything_commits_without_waiting_for_the_interval(
    harness, cluster, clock, wait_until
):
    # Given commit_interval=5 and two partitions: one whose records all finish, one whose
    # record hangs
    cluster.create_topic("t", 2)
    for i in range(5):
        cluster.produce("t", b"%d" % i, partition=0)
    cluster.produce("t", b"hang", partition=1)
    release = threading.Event()

    def handle(ctx: PollContext) -> None:
        if ctx.partition == 1:
            release.wait(10)

    pc = harness.make(Options(commit_interval=5), clock=clock)
    pc.poll(handle)
    wait_until(lambda: pc.statistics().records_succeeded == 5)
    # When a tenth of the interval passes while a call still runs: nothing is committed
    clock.advance(0.6)
    pc.statistics()  # (one turn of the controller's loop at the new time)
    assert cluster.committed("g", "t", 0) is None
    # When the call ends and everything polled is finished: the commit goes at once
    release.set()
    wait_until(lambda: pc.statistics().records_succeeded == 6)
    wait_until(lambda: cluster.committed("g", "t", 0) == (5, None))
    wait_until(lambda: cluster.committed("g", "t", 1) == (1, None))
    # And a later record does not commit again before another tenth of the interval passed
    cluster.produce("t", b"5", partition=0)
    wait_until(lambda: pc.statistics().records_succeeded == 7)
    pc.statistics()
    assert cluster.committed("g", "t", 0) == (5, None)
    clock.advance(0.6)
    wait_until(lambda: cluster.committed("g", "t", 0) == (6, None))


def test_consume_waits_briefly_while_records_are_held_so_commits_go_out_soon(
    harness, cluster, wait_until, monkeypatch
):
    """A command cannot wake a consume() in progress: while records are held and came or left
    within BUSY_FOR (a commit is coming), or a commit is on its way, consume() waits
    BUSY_POLL_TIMEOUT, not POLL_TIMEOUT (a burst's last commit waited up to 50 ms to be sent).
    A record held longer than that (a hung handler), or nothing held, and it waits the long
    timeout again."""
    monkeypatch.setattr(poller_module, "BUSY_FOR", 0.5)
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"k")
    release = threading.Event()
    pc = harness.make(Options(commit_interval=1))
    pc.poll(lambda ctx: release.wait(10))
    try:
        wait_until(lambda: pc.statistics().in_flight == 1)
        consumer = harness.consumers[0]
        timeouts: list[float] = []
        consume = consumer.consume

        def spy(num_messages: int = 1, timeout: float = -1) -> list:
            timeouts.append(timeout)
            return consume(num_messages, timeout)

        consumer.consume = spy
        wait_until(lambda: len(timeouts) >= 3)
        held = set(timeouts[:3])
        # Then, the record still held and nothing else coming, the long timeout again
        wait_until(lambda: timeouts[-1] == poller_module.POLL_TIMEOUT)
    finally:
        release.set()
    assert held == {poller_module.BUSY_POLL_TIMEOUT}
    # Once the record finished and its commit was answered, the consumer is idle
    wait_until(lambda: pc.statistics().partitions[0].committed_offset == 1)
    seen = len(timeouts)
    wait_until(lambda: len(timeouts) >= seen + 3)
    assert timeouts[-1] == poller_module.POLL_TIMEOUT
    pc.close()


def test_a_permanent_commit_error_stops_the_consumer_with_a_clear_error(harness, cluster):
    # Given a broker that rejects the offset map as too large
    cluster.create_topic("t", 1)
    for i in range(5):
        cluster.produce("t", b"%d" % i, partition=0)
    pc = harness.make(Options(commit_interval=0.05))
    pc.poll(lambda ctx: None)
    harness.consumers[0].fail_next_commits(100, code=KafkaError.OFFSET_METADATA_TOO_LARGE)
    # When the engine commits, Then it stops (rather than retrying forever) and says what to do
    with pytest.raises(InternalError, match="max_metadata_bytes"):
        pc.wait(timeout=20)
    assert isinstance(pc.failure, InternalError)


@pytest.mark.parametrize("ordering", ["unordered", "key"])
def test_a_blocked_partition_runs_holes_that_appear_above_its_first_limit(
    harness, cluster, wait_until, ordering
):
    # Given a tiny metadata limit, holes below the coming limit, and records in flight when the
    # partition gets blocked, some of which then fail (holes above the limit it was blocked at)
    cluster.create_topic("t", 1)
    for i in range(200):
        cluster.produce("t", b"%d" % i, key=b"%d" % i, partition=0)
    attempts: dict[int, int] = {}
    done: set[int] = set()
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        offset = ctx.offset
        with lock:
            attempts[offset] = attempts.get(offset, 0) + 1
            first = attempts[offset] == 1
        if offset in (3, 20, 40, 60) and first:
            raise Retry(delay=2.0)
        if offset >= 80:
            time.sleep(0.5)  # the work: in flight when the partition is blocked
            if offset in (85, 100, 120, 140) and first:
                raise Retry(delay=0.01)
        with lock:
            done.add(offset)

    pc = harness.make(
        Options(
            ordering=ordering,
            max_concurrency=64,
            max_metadata_bytes=16,
            spill_offset_maps=False,
            commit_interval=0.05,
        )
    )
    pc.poll(handle)
    # Then every record is handled (it used to stop at 156, the holes above 79 parked forever)
    wait_until(lambda: len(done) == 200, timeout=30, what="every record handled")
    pc.close()
