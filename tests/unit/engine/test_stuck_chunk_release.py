"""Adaptive chunked dispatch and the release of stuck chunks: a hung call holds only its own
record, calls that turn slow are not serialised on one worker, and close without drain takes
back the calls of a chunk just taken. Each failed on an earlier version of chunked dispatch."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from parallel_consumer import Options, ParallelConsumer, PollContext, ProcessingOrder
from parallel_consumer.runners import threads as threads_module
from parallel_consumer.testing.fakes import FakeCluster
from parallel_consumer.work.runs import Run


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster()


@pytest.fixture
def make(cluster: FakeCluster) -> Iterator[Callable[..., ParallelConsumer]]:
    made: list[ParallelConsumer] = []

    def build(options: Options, **kwargs: Any) -> ParallelConsumer:
        pc = ParallelConsumer(
            {"bootstrap.servers": "fake:9092", "group.id": "g"},
            options,
            consumer_factory=cluster.consumer,
            producer_factory=cluster.producer,
            admin_factory=cluster.admin,
            **kwargs,
        )
        pc.subscribe(["t"])
        made.append(pc)
        return pc

    yield build
    for pc in made:
        with contextlib.suppress(Exception):
            pc.close(drain=False, timeout=5.0)


def wait_until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s")
        time.sleep(0.001)


def test_a_stuck_chunk_is_released_within_tens_of_milliseconds(make, cluster):
    """Claim (docs/performance.md, 6c0272e): every 10 ms while chunks run, the controller looks
    for chunks whose current call has run > 20 ms and hands their unstarted calls to free
    workers, so a hung call holds only its own record.

    Reproduction: warm up with short calls so chunks are on (chunk_size >= 3), let the engine go
    idle, then deliver one poll of up to 9 records (one chunk) whose first call hangs, on 8 workers.

    Observed: the 8 other records ran only ~0.6-1.0 s after the hang began (the controller's
    next wake-up, from the once-a-second progress watch), 30-50x the 20 ms bound. After
    dispatching the chunk the controller computes its wake-up in ``_next_deadline`` with
    ``runner.chunks_running == 0`` (the worker has not taken the chunk yet: it needs the GIL
    the controller holds), so it does not schedule the 10 ms check and sleeps until an event or
    another timer. Nothing else arrives: the owner reports only when its chunk ends."""
    cluster.create_topic("t", 1)
    with cluster._cond:  # one poll
        for i in range(5000):
            cluster.produce("t", b"%d" % i, key=b"k%d" % i, partition=0)
    release = threading.Event()
    done = [0]
    lock = threading.Lock()
    hang_from: list[float] = []

    def handle(ctx: PollContext) -> None:
        if ctx.value == b"hang":
            hang_from.append(time.monotonic())
            release.wait(30)
            return
        with lock:
            done[0] += 1

    pc = make(Options(ordering=ProcessingOrder.UNORDERED, max_concurrency=8, commit_interval=30.0))
    pc.poll(handle)
    try:
        wait_until(lambda: done[0] == 5000, timeout=60)
        time.sleep(0.3)  # idle: no chunk running
        others = min(pc.statistics().chunk_size, 9) - 1
        if others < 2:
            pytest.skip("chunks did not grow on this (busy) machine")
        with cluster._cond:  # one poll, one chunk, the hung call first
            cluster.produce("t", b"hang", key=b"h", partition=0)
            for i in range(others):
                cluster.produce("t", b"x%d" % i, key=b"x%d" % i, partition=0)
        wait_until(lambda: bool(hang_from), timeout=10)
        wait_until(lambda: done[0] == 5000 + others, timeout=10)
        held = time.monotonic() - hang_from[0]
        assert held < 0.2, f"the records behind the hung call waited {held:.3f}s"
    finally:
        release.set()


def test_calls_that_turn_slow_are_not_serialised_on_one_worker(make, cluster):
    """Claim (_controller._observe_service, docs/performance.md): long calls go one per
    hand-over "so that no call waits behind another on a worker while other workers are idle";
    a stuck chunk's unstarted calls go to free workers.

    Reproduction: warm up with no-op calls (chunk_size grows to 10-64), go idle, then deliver
    one poll of ``chunk_size`` records whose handler now takes 15 ms each (a downstream that
    slowed down), on 8 workers.

    Observed: at most 1 call ran at a time; the batch took chunk_size x 15 ms (0.43 s for a
    chunk of 28, ~1 s for 64) instead of ~4 x 15 ms on 8 workers. The chunk is sized from the
    fast calls before it, and ``release_stuck`` only looks at how long the *current* call has
    run (> 20 ms): a chunk of calls each under 20 ms is never released, whatever its total."""
    cluster.create_topic("t", 1)
    with cluster._cond:
        for i in range(5000):
            cluster.produce("t", b"%d" % i, key=b"k%d" % i, partition=0)
    lock = threading.Lock()
    done = [0]
    running = [0]
    most = [0]

    def handle(ctx: PollContext) -> None:
        if ctx.value.startswith(b"slow"):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.015)
            with lock:
                running[0] -= 1
        with lock:
            done[0] += 1

    pc = make(Options(ordering=ProcessingOrder.UNORDERED, max_concurrency=8))
    pc.poll(handle)
    wait_until(lambda: done[0] == 5000, timeout=60)
    time.sleep(0.3)
    size = pc.statistics().chunk_size
    if size < 4:
        pytest.skip("chunks did not grow on this (busy) machine")
    with cluster._cond:  # one poll
        for i in range(size):
            cluster.produce("t", b"slow%d" % i, key=b"s%d" % i, partition=0)
    wait_until(lambda: done[0] == 5000 + size, timeout=30)
    assert most[0] > 1, f"{size} calls of 15 ms ran one at a time on one of 8 workers"


class _PreemptedGet:
    """The runner's task queue, whose ``get`` can hold the worker that took a chunk: it is
    preempted right after taking its chunk from the queue, before it starts it (an ordinary
    thread switch). (An earlier version held ``_active.add`` in the owner; chunks are now
    registered when they are submitted, so the window is right after the get.)"""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.hold = threading.Event()
        self.held = threading.Event()
        self.go = threading.Event()

    def get(self, *args: Any, **kwargs: Any) -> Any:
        task = self._inner.get(*args, **kwargs)
        if self.hold.is_set() and isinstance(task, threads_module._Chunk | Run):
            self.hold.clear()
            self.held.set()
            self.go.wait(10)
        return task

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_close_without_drain_takes_back_the_calls_of_a_chunk_just_taken(make, cluster):
    """Claim (docs/runners.md, docs/options.md, 6c0272e "Close's cancel_queued also takes the
    unstarted calls of running chunks"): close(drain=False) takes back every call that has not
    started; only calls already inside the handler run on.

    Reproduction: warm up so chunks are on; deliver one poll of 9 records (one chunk); hold the
    worker that took the chunk right after ``tasks.get()`` (a thread switch there is enough);
    call close(drain=False) and let the worker go once the controller
    is CLOSING (``_stop_dispatching`` ran).

    Observed: all 9 calls started after close(drain=False) had taken back what it could: the
    chunk is in neither the task queue nor ``_active`` during that window, so ``cancel_queued``
    misses it and its calls stay in flight and run. (Before chunks the same window held one
    call; now it holds up to 64.)"""
    cluster.create_topic("t", 1)
    with cluster._cond:
        for i in range(5000):
            cluster.produce("t", b"%d" % i, key=b"k%d" % i, partition=0)
    lock = threading.Lock()
    done = [0]
    started_late: list[bytes] = []
    closing = threading.Event()

    def handle(ctx: PollContext) -> None:
        with lock:
            if closing.is_set():
                started_late.append(ctx.value)
            done[0] += 1

    pc = make(Options(ordering=ProcessingOrder.UNORDERED, max_concurrency=8))
    controller = pc._controller
    runner = controller._runner
    active = _PreemptedGet(runner._tasks)
    runner._tasks = active  # (before the workers start: they keep the queue they found)
    pc.poll(handle)
    wait_until(lambda: done[0] == 5000, timeout=60)
    time.sleep(0.3)
    size = min(pc.statistics().chunk_size, 9)
    if size < 2:
        pytest.skip("chunks did not grow on this (busy) machine")
    active.hold.set()
    with cluster._cond:  # one poll, one chunk
        for i in range(size):
            cluster.produce("t", b"x%d" % i, key=b"x%d" % i, partition=0)
    assert active.held.wait(10)
    closer = threading.Thread(target=pc.close, kwargs={"drain": False, "timeout": 5.0})
    closer.start()
    wait_until(lambda: controller.lifecycle.name in ("CLOSING", "CLOSED"), timeout=10)
    closing.set()
    active.go.set()
    closer.join(15)
    assert not closer.is_alive()
    assert started_late == [], f"{len(started_late)} calls started after close(drain=False)"
