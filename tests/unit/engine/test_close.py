"""Close on the fakes: no handler call starts after close() returned (without drain, or behind
a slow call-start hook), a revoke is answered while close waits for the poller, a failed final
commit is sent again and a lost commit answer does not hold close up, and a stricter second
close takes effect."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from doubles import stepped_controller

from parallel_consumer import NoHooks, Options, PollContext
from parallel_consumer._events import PartitionsRevoked
from parallel_consumer.kafka import poller as poller_module
from parallel_consumer.testing.clock import FakeClock


def test_close_without_drain_starts_no_handler_call_after_it_returned(harness, cluster):
    # Given more batches than workers, every worker blocked in its call
    cluster.create_topic("t", 1)
    for i in range(50):
        cluster.produce("t", b"%d" % i, key=b"%d" % i, partition=0)
    release = threading.Event()
    started: list[float] = []
    running = threading.Semaphore(0)

    def handle(ctx: PollContext) -> None:
        started.append(time.monotonic())
        running.release()
        release.wait(10)

    pc = harness.make(Options(ordering="unordered", max_concurrency=4))
    pc.poll(handle)
    for _ in range(4):
        assert running.acquire(timeout=10)
    # When close(drain=False) gives up on the running calls
    pc.close(drain=False, timeout=0.1)
    closed_at = time.monotonic()
    # And the blocked calls then return, freeing every worker
    release.set()
    deadline = time.monotonic() + 10
    while (
        any(
            t.name.endswith(tuple(f"-worker-{i}" for i in range(4))) and t.is_alive()
            for t in threading.enumerate()
        )
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    # Then no call started after close() returned (the queued batches were taken back)
    assert [t for t in started if t > closed_at] == []
    assert len(started) == 4


def test_close_keeps_answering_a_revoke_while_it_waits_for_the_poller():
    # Given a controller that has committed and is waiting for the poller to stop
    controller = stepped_controller(FakeClock())
    controller.request("close", drain=False, timeout=0)
    started = time.monotonic()
    for _ in range(5):
        assert not controller.run_once(block=False)
    # When the poller, inside a revoke callback, asks for the final commit
    reply: Future[None] = Future()
    controller.post(PartitionsRevoked((("t", 0),), reply))
    controller.run_once(block=False)
    # Then it is answered at once, not after the controller gave up waiting for the poller
    assert reply.done()
    assert time.monotonic() - started < 1


def test_a_final_commit_that_fails_is_sent_again_before_close_returns(harness, cluster, wait_until):
    cluster.create_topic("t", 1)
    for i in range(100):
        cluster.produce("t", b"%d" % i, partition=0)
    done: list[int] = []
    pc = harness.make(Options(commit_interval=60))
    pc.poll(lambda ctx: done.append(ctx.offset))
    wait_until(lambda: len(done) == 100)
    # Given the broker fails the next commit with a retriable error
    harness.consumers[0].fail_next_commits(1)
    # When the consumer closes
    pc.close()
    # Then the final commit was retried and landed
    assert cluster.committed("g", "t", 0) == (100, None)


def test_a_slow_call_start_hook_cannot_start_a_call_after_close_returned(harness, cluster):
    class SlowStart(NoHooks):
        def on_call_start(self, batch: int, context: PollContext) -> None:
            time.sleep(0.3)  # the hook's work, between the runner's gate and the call

    cluster.create_topic("t", 1)
    for i in range(200):
        cluster.produce("t", b"%d" % i, partition=0)
    started: list[float] = []
    pc = harness.make(Options(ordering="unordered", max_concurrency=4), hooks=SlowStart())
    pc.poll(lambda ctx: started.append(time.monotonic()))
    deadline = time.monotonic() + 10
    while len(started) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    pc.close(drain=False, timeout=0.1)
    closed_at = time.monotonic()
    deadline = time.monotonic() + 5
    while any("-worker-" in t.name and t.is_alive() for t in threading.enumerate()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert [t for t in started if t > closed_at] == []


def test_a_stricter_second_close_takes_effect(harness, cluster):
    # Given a draining close waiting on a blocked handler (30 s default timeout)
    cluster.create_topic("t", 1)
    for i in range(20):
        cluster.produce("t", b"%d" % i, partition=0)
    gate = threading.Event()
    pc = harness.make(Options(ordering="partition"))
    pc.poll(lambda ctx: gate.wait(20))
    first = threading.Thread(target=pc.close, kwargs={"drain": True})
    first.start()
    try:
        # When a second close asks for no drain and 0.5 s
        started = time.monotonic()
        pc.close(drain=False, timeout=0.5)
        # Then it returns within its own bound, and so does the first
        assert time.monotonic() - started < 12
        first.join(5)
        assert not first.is_alive()
    finally:
        gate.set()
        first.join(10)


def test_a_lost_commit_answer_does_not_hold_up_close(harness, cluster, wait_until, monkeypatch):
    # (commits wait behind an unanswered one until the poller gives up on its answer)
    monkeypatch.setattr(poller_module, "COMMIT_ANSWER_TIMEOUT", 0.5)
    # Given periodic commits whose answers the client never delivers: one at 5 while record 5
    # runs, then one at 10
    cluster.create_topic("t", 1)
    for i in range(10):
        cluster.produce("t", b"%d" % i, partition=0)
    release = threading.Event()
    done: list[int] = []

    def handle(ctx: PollContext) -> None:
        if ctx.offset == 5:
            release.wait(10)
        done.append(ctx.offset)

    pc = harness.make(Options(ordering="partition", commit_interval=0.05))
    harness.consumers[0].lose_next_commit_answers(1000)
    pc.poll(handle)
    wait_until(lambda: pc.statistics().commits_sent >= 1)
    release.set()
    wait_until(lambda: len(done) == 10)
    wait_until(lambda: pc.statistics().commits_sent >= 2)
    # When it closes (the final commit is synchronous, so its answer comes)
    started = time.monotonic()
    pc.close()
    # Then close does not wait for the lost answers (it took the whole 10 s final-commit budget)
    assert time.monotonic() - started < 5
    assert cluster.committed("g", "t", 0) == (10, None)
