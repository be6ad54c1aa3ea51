"""The poller's commit requests, one at a time: a request given up on can still be stored after
the next one, a revoke sends a kept partition's queued commit ahead of its older request, a
superseded offset of a lost partition is answered as acknowledged, and close's final commit is
not dropped behind a lost answer. Each failed on an earlier version; where a fix changed what
is observable at one step, the test says so."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

from confluent_kafka import TopicPartition as KafkaTopicPartition

from parallel_consumer._events import Commit, PartitionsRevoked
from parallel_consumer.engine import closing as closing_module
from parallel_consumer.kafka import poller as poller_module
from parallel_consumer.kafka.poller import Poller
from parallel_consumer.testing.fakes import FakeCluster
from parallel_consumer.work.commit_tracker import CommitAnswer, OffsetCommit

# -- the poller, driven by hand on the test thread ---------------------------------------------


class _Controller:
    """Plays the controller for a poller: answers a revoke with a synchronous final commit of
    ``final`` (tp -> (epoch, offset))."""

    def __init__(self) -> None:
        self.poller: Poller | None = None
        self.events: list[Any] = []
        self.final: dict[tuple[str, int], tuple[int, int]] = {}

    def post(self, event: Any) -> None:
        self.events.append(event)
        if isinstance(event, PartitionsRevoked):
            assert self.poller is not None
            offsets = tuple(
                OffsetCommit(tp, *self.final[tp], "") for tp in event.tps if tp in self.final
            )
            if offsets:
                self.poller.send(Commit(offsets, sync=True, reply=Future()))
            event.reply.set_result(None)


def _poller(cluster: FakeCluster) -> tuple[Poller, Any, _Controller]:
    controller = _Controller()
    consumers: list[Any] = []

    def factory(config: dict[str, Any]) -> Any:
        consumers.append(cluster.consumer(config))
        return consumers[0]

    poller = Poller(
        factory,
        {"group.id": "g", "bootstrap.servers": "fake"},
        post=controller.post,
        limit=100,
        fetch_batch=10,
    )
    controller.poller = poller
    return poller, consumers[0], controller


def _commit(*offsets: tuple[tuple[str, int], int, int], sync: bool = False) -> Commit:
    """A Commit command of (tp, epoch, offset) triples."""
    return Commit(
        tuple(OffsetCommit(tp, epoch, offset, "") for tp, epoch, offset in offsets),
        sync=sync,
        reply=Future(),
    )


def _ktp(tp: tuple[str, int]) -> Any:
    return KafkaTopicPartition(tp[0], tp[1])


def _serve(consumer: Any) -> None:
    """Let the fake client deliver its pending commit callbacks (as consume() does)."""
    consumer.consume(1, timeout=0)


def _acknowledged(command: Commit) -> list[int]:
    return [a.commit.offset for a in command.reply.result(0) if a.error is None]


# -- commit requests ----------------------------------------------------------------------------


def test_a_request_given_up_on_can_still_be_stored_after_the_next_one(monkeypatch):
    """Claim (docs/commits.md "One commit request at a time"): the group's committed offset
    never moves back behind an offset the engine counts as acknowledged.

    Reproduction: commit t[0]@10 asynchronously while the coordinator is moving (the fake
    holds it: neither stored nor answered); commit t[0]@20, which is queued. The poller gives
    up on the first after COMMIT_ANSWER_TIMEOUT (here 0.05 s instead of 15 s) and sends the
    queued one, although the client still has the first on its way. The client then stores
    them newest first (the older one retried), exactly the failure the change is for.

    Observed: t[0]@20 is answered as acknowledged, yet the group holds 10.
    """
    monkeypatch.setattr(poller_module, "COMMIT_ANSWER_TIMEOUT", 0.05)
    cluster = FakeCluster()
    cluster.create_topic("t", 1)
    poller, consumer, _ = _poller(cluster)
    tp = ("t", 0)
    poller._on_assign(consumer, [_ktp(tp)])
    consumer.hold_commits()
    older = _commit((tp, 1, 10))
    newer = _commit((tp, 1, 20))
    poller.send(older)
    poller._run_commands()
    poller.send(newer)
    poller._run_commands()
    assert poller.statistics().commits_queued == 0 or poller._queued == [newer]
    time.sleep(0.1)
    poller._send_queued()  # the first counts as lost; the queued one goes out
    assert consumer.held_commits() == 2, "both requests are on their way in the client"
    consumer.release_commits(reverse=True)
    _serve(consumer)
    assert _acknowledged(newer) == [20]
    # (fix: the late answer of the request given up on makes the poller's next turn commit
    # the newest offset again)
    poller._send_queued()
    _serve(consumer)
    # the engine counts 20 as acknowledged: the group must not hold less
    assert cluster.committed("g", "t", 0) == (20, None)


def test_a_revoke_sends_a_kept_partitions_queued_commit_ahead_of_its_older_request():
    """Claim: the group's committed offset never moves back behind an offset the engine counts
    as acknowledged. The documented exception covers only the revoked partition's own final
    commit.

    Reproduction (incremental rebalance: only t[0] is revoked, t[1] is kept): a periodic
    commit of t[1]@10 is on its way (held by the coordinator), a newer one of t[1]@20 is
    queued behind it. t[0] is revoked: its final commit is synchronous and goes out at once,
    and _send merges every queued command into it, so t[1]@20 is sent and acknowledged
    synchronously while t[1]@10 is still on its way. The client then stores t[1]@10 (even in
    the order it was sent).

    Observed: the engine holds t[1]@20 as acknowledged, the group holds t[1]@10.
    """
    cluster = FakeCluster()
    cluster.create_topic("t", 2)
    poller, consumer, controller = _poller(cluster)
    revoked, kept = ("t", 0), ("t", 1)
    poller._on_assign(consumer, [_ktp(revoked), _ktp(kept)])
    consumer.hold_commits()
    older = _commit((kept, 1, 10))
    newer = _commit((kept, 1, 20))
    poller.send(older)
    poller._run_commands()
    poller.send(newer)
    poller._run_commands()
    controller.final[revoked] = (1, 5)
    poller._on_revoke(consumer, [_ktp(revoked)])
    # (fix: the revoke's final commit goes alone; t[1]@20 stays queued behind t[1]@10)
    assert cluster.committed("g", "t", 0) == (5, None)
    assert not newer.reply.done()
    consumer.release_commits()  # the request on its way is stored only now
    _serve(consumer)
    poller._send_queued()
    _serve(consumer)
    assert _acknowledged(newer) == [20]
    assert cluster.committed("g", "t", 1) == (20, None)


def test_a_superseded_offset_of_a_lost_partition_is_answered_as_acknowledged():
    """Claim: every Commit command gets exactly one answer per offset (the right one), and
    nothing of an old epoch reaches the client; the statistics (commits_acknowledged, the
    on_commit hook, pc.partition.commit.failures) follow those answers.

    Reproduction: t[0] assigned in epoch 1; a commit of t[0]@10 on its way (held), then
    t[0]@15 (epoch 1) queued behind it. t[0] is lost and assigned again (epoch 2), and a
    commit of t[0]@3 (epoch 2) is queued. The request on its way is answered; the queued
    commands go out as one request with the newest offset per partition, t[0]@3 of epoch 2.

    Observed: the epoch-1 command is answered "acknowledged" for t[0]@15, which never reached
    the client (queued alone it is answered "the partition is no longer assigned"); the
    controller counts it in commits_acknowledged and hands it to on_commit as a success.
    """
    cluster = FakeCluster()
    cluster.create_topic("t", 1)
    poller, consumer, _ = _poller(cluster)
    tp = ("t", 0)
    poller._on_assign(consumer, [_ktp(tp)])
    consumer.hold_commits()
    on_its_way = _commit((tp, 1, 10))
    old_epoch = _commit((tp, 1, 15))
    poller.send(on_its_way)
    poller._run_commands()
    poller.send(old_epoch)
    poller._run_commands()
    poller._on_lost(consumer, [_ktp(tp)])
    poller._on_assign(consumer, [_ktp(tp)])
    new_epoch = _commit((tp, 2, 3))
    poller.send(new_epoch)
    poller._run_commands()
    consumer.release_commits()
    _serve(consumer)
    poller._send_queued()
    _serve(consumer)
    assert [c for _, c, _ in consumer.commit_log] == [10, 3]  # 15 never reached the client
    assert _acknowledged(new_epoch) == [3]
    (answer,) = old_epoch.reply.result(0)
    assert answer == CommitAnswer(old_epoch.offsets[0], "the partition is no longer assigned")


def test_the_final_commit_of_close_is_dropped_behind_a_lost_answer(
    monkeypatch,
):
    """Claims: the final commit of a close is stored last (docs: "waits behind the request on
    its way ... so it is always the last one stored"); close never hangs on a lost answer.

    Reproduction: the client loses the answers of asynchronous commits (they are stored, no
    callback: lose_next_commit_answers). A periodic commit of t[0]@5 goes out while record 5
    runs; every record then finishes and close() is called. Its synchronous final commit of 10
    is queued behind the unanswered request, which the poller gives up on only after
    COMMIT_ANSWER_TIMEOUT = 15 s; the close waits FINAL_COMMIT_TIMEOUT = 10 s for the final
    commit, gives up, and stops the poller, which answers the queued final commit as failed
    without sending it. (FINAL_COMMIT_TIMEOUT is cut to 1 s here to keep the test short; the
    order of the two time-outs is the shipped one.) This is
    tests/unit/engine/test_close.py::test_a_lost_commit_answer_does_not_hold_up_close
    without its monkeypatch of COMMIT_ANSWER_TIMEOUT to 0.5 s.

    Observed: the final commit never reaches the client; the group keeps 5 (records 5-9 run
    again), and close took the whole final-commit budget.
    """
    from parallel_consumer import Options, ParallelConsumer, PollContext

    # (fix: the poller gives up on an unanswered request before the close gives up on its
    # final commit; the real time-outs, scaled down)
    assert poller_module.COMMIT_ANSWER_TIMEOUT < closing_module.FINAL_COMMIT_TIMEOUT
    monkeypatch.setattr(poller_module, "COMMIT_ANSWER_TIMEOUT", 0.5)
    monkeypatch.setattr(closing_module, "FINAL_COMMIT_TIMEOUT", 1.0)
    cluster = FakeCluster()
    cluster.create_topic("t", 1)
    for i in range(10):
        cluster.produce("t", b"%d" % i, partition=0)
    consumers: list[Any] = []

    def factory(config: dict[str, Any]) -> Any:
        consumers.append(cluster.consumer(config))
        return consumers[-1]

    pc = ParallelConsumer(
        {"bootstrap.servers": "fake:9092", "group.id": "g"},
        Options(ordering="partition", commit_interval=0.05),
        consumer_factory=factory,
        producer_factory=cluster.producer,
        admin_factory=cluster.admin,
    )
    pc.subscribe(["t"])
    release = threading.Event()
    done: list[int] = []

    def handle(ctx: PollContext) -> None:
        if ctx.offset == 5:
            release.wait(10)
        done.append(ctx.offset)

    consumers[0].lose_next_commit_answers(1000)
    pc.poll(handle)
    deadline = time.monotonic() + 10
    while pc.statistics().commits_sent < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    while len(done) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(done) == 10
    pc.close()
    assert cluster.committed("g", "t", 0) == (10, None)
    assert 10 in [offset for _, offset, _ in consumers[0].commit_log]
