"""Rebalances, back-pressure, pause/resume, close modes and configuration errors."""

from __future__ import annotations

import threading
import time

import pytest

from parallel_consumer import ConfigurationError, Lifecycle, Options, ParallelConsumer, PollContext
from parallel_consumer.offsets import decode_offset_map


def test_revoke_commits_finished_work_and_drops_stale_results(harness, cluster, wait_until):
    # Given partition 0 with record 0 stuck in the handler and 1..4 finished
    cluster.create_topic("t", 2)
    for i in range(5):
        cluster.produce("t", b"%d" % i, partition=0)
    release = threading.Event()
    ran: list[int] = []

    def handle(ctx: PollContext) -> None:
        ran.append(ctx.offset)
        if ctx.offset == 0 and len(ran) == 1:
            release.wait(10)

    pc = harness.make(Options(ordering="unordered", commit_interval=3600))
    pc.poll(handle)
    wait_until(lambda: pc.statistics().records_succeeded == 4)
    consumer = harness.consumers[0]
    # When partition 0 is revoked (and handed back) while record 0 runs
    consumer.rebalance(revoke=[("t", 0)], assign=[("t", 0)])
    wait_until(lambda: cluster.committed("g", "t", 0) is not None)
    # Then the revoke committed 0 with a map that marks 1..4 finished
    offset, metadata = cluster.committed("g", "t", 0)
    assert offset == 0
    assert set(decode_offset_map(offset, metadata).incomplete) == {0}
    # And the re-assigned partition runs only record 0 again
    wait_until(lambda: ran.count(0) == 2)
    release.set()
    # And the late result of the first attempt is dropped as stale
    wait_until(lambda: pc.statistics().results_stale == 1)
    pc.close()
    assert sorted(ran) == [0, 0, 1, 2, 3, 4]
    assert cluster.committed("g", "t", 0) == (5, None)


def test_held_records_never_exceed_max_buffered_records(harness, cluster, wait_until):
    # Given 2,000 records and a handler that blocks
    cluster.create_topic("t", 4)
    for i in range(2000):
        cluster.produce("t", b"%d" % i, key=b"%d" % i, partition=i % 4)
    gate = threading.Event()
    pc = harness.make(
        Options(ordering="key", max_concurrency=4, max_buffered_records=100, fetch_batch_size=50)
    )
    pc.poll(lambda ctx: gate.wait(10))
    # Then the engine fills up to 100 records and pauses every partition
    wait_until(lambda: pc.statistics().held >= 100)
    wait_until(lambda: len(harness.consumers[0].paused()) == 4)
    # And it stays at the bound while the poller keeps polling (a bounded observation window)
    window_end = time.monotonic() + 0.3
    while time.monotonic() < window_end:
        stats = pc.statistics()
        assert stats.held <= 100
        assert stats.records_registered <= 100
    # When the handler is released, then everything is processed
    gate.set()
    wait_until(lambda: pc.statistics().records_succeeded == 2000, timeout=30)
    assert pc.statistics().held == 0


def test_pause_stops_dispatch_and_resume_continues(harness, cluster, wait_until):
    cluster.create_topic("t")
    ran: list[int] = []
    pc = harness.make(Options(ordering="unordered"))
    pc.poll(lambda ctx: ran.append(ctx.offset))
    pc.pause()
    assert pc.lifecycle is Lifecycle.PAUSED
    for i in range(10):
        cluster.produce("t", b"%d" % i)
    wait_until(lambda: harness.consumers[0].paused() == {("t", 0)})
    assert ran == []
    pc.resume()
    wait_until(lambda: len(ran) == 10)
    assert pc.lifecycle is Lifecycle.RUNNING


def test_close_with_drain_runs_buffered_work(harness, cluster, wait_until):
    cluster.create_topic("t")
    for i in range(200):
        cluster.produce("t", b"%d" % i)
    ran: list[int] = []
    gate = threading.Event()

    def handle(ctx: PollContext) -> None:
        gate.wait(10)
        ran.append(ctx.offset)

    pc = harness.make(Options(ordering="partition"))
    pc.poll(handle)
    wait_until(lambda: pc.statistics().waiting > 100)
    gate.set()
    pc.close(drain=True)
    assert len(ran) == 200
    assert cluster.committed("g", "t", 0) == (200, None)
    assert pc.lifecycle is Lifecycle.CLOSED


def test_close_without_drain_finishes_in_flight_only(harness, cluster, wait_until):
    cluster.create_topic("t")
    for i in range(200):
        cluster.produce("t", b"%d" % i)
    ran: list[int] = []
    started = threading.Event()
    gate = threading.Event()

    def handle(ctx: PollContext) -> None:
        started.set()
        gate.wait(10)
        ran.append(ctx.offset)

    pc = harness.make(Options(ordering="partition"))
    pc.poll(handle)
    wait_until(started.is_set)
    wait_until(lambda: pc.statistics().waiting > 100)
    threading.Timer(0.05, gate.set).start()
    pc.close(drain=False)
    # Then only the in-flight record ran, and the commit does not pass it
    assert ran == [0]
    assert cluster.committed("g", "t", 0) == (1, None)


def test_close_waits_at_most_shutdown_timeout_by_default(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    hang = threading.Event()
    pc = harness.make(Options(shutdown_timeout=0.2))
    pc.poll(lambda ctx: hang.wait(10))
    wait_until(lambda: pc.statistics().in_flight == 1)
    started = time.monotonic()
    pc.close(drain=False)
    assert time.monotonic() - started < 5
    hang.set()


def test_close_gives_up_on_a_hung_handler_after_timeout(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    cluster.produce("t", b"y", key=b"other")
    hang = threading.Event()
    ran: list[bytes] = []

    def handle(ctx: PollContext) -> None:
        if ctx.value == b"x":
            hang.wait(10)
        ran.append(ctx.value or b"")

    pc = harness.make(Options(ordering="unordered"))
    pc.poll(handle)
    wait_until(lambda: ran == [b"y"])
    pc.close(drain=False, timeout=0.2)
    # Offset 0 never finished: nothing may be committed past it
    committed = cluster.committed("g", "t", 0)
    assert committed is not None
    assert committed[0] == 0
    hang.set()  # let the daemon worker end so no thread outlives the test


def test_context_manager_closes(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    ran: list[bytes] = []
    with harness.make() as pc:
        pc.poll(lambda ctx: ran.append(ctx.value))
        wait_until(lambda: ran == [b"x"])
    assert pc.lifecycle is Lifecycle.CLOSED


def _config(**extra):
    return {"bootstrap.servers": "fake:9092", "group.id": "g", **extra}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"bootstrap.servers": "x:1"}, "group.id"),
        ({"group.id": "g"}, "bootstrap.servers"),
        (_config(**{"enable.auto.commit": True}), "enable.auto.commit"),
        (_config(**{"enable.auto.commit": "true"}), "enable.auto.commit"),
        (_config(**{"enable.auto.commit": "TRUE"}), "enable.auto.commit"),
        (_config(on_commit=print), "on_commit"),
    ],
)
def test_bad_consumer_config_is_rejected_naming_the_setting(cluster, config, message):
    with pytest.raises(ConfigurationError, match=message):
        ParallelConsumer(config, consumer_factory=cluster.consumer)


@pytest.mark.parametrize("value", [False, "false", "FALSE", 0, "0"])
def test_auto_commit_off_in_any_spelling_is_accepted(cluster, value):
    pc = ParallelConsumer(
        _config(**{"enable.auto.commit": value}), consumer_factory=cluster.consumer
    )
    pc.close()


def test_librdkafka_rejects_unknown_setting_as_configuration_error():
    with pytest.raises(ConfigurationError, match=r"no\.such\.setting"):
        ParallelConsumer(_config(**{"no.such.setting": 1}))


def test_poll_before_subscribe_and_handler_twice_are_rejected(cluster):
    pc = ParallelConsumer(_config(), consumer_factory=cluster.consumer)
    with pytest.raises(ConfigurationError, match="subscribe"):
        pc.poll(lambda ctx: None)
    pc.subscribe("t")
    cluster.create_topic("t")
    pc.poll(lambda ctx: None)
    try:
        with pytest.raises(ConfigurationError, match="already registered"):
            pc.poll(lambda ctx: None)
        with pytest.raises(ConfigurationError, match="before processing starts"):
            pc.subscribe("other")
    finally:
        pc.close()


def test_close_before_start_closes_the_client(cluster):
    pc = ParallelConsumer(_config(), consumer_factory=cluster.consumer)
    pc.close()
    assert pc.lifecycle is Lifecycle.CLOSED
    pc.close()  # idempotent


def test_controller_state_cannot_be_stepped_from_another_thread(harness, cluster):
    cluster.create_topic("t")
    pc = harness.make()
    pc.poll(lambda ctx: None)
    with pytest.raises(RuntimeError, match="must post events"):
        pc._controller.run_once(block=False)


def test_partition_order_keeps_every_partition_progressing_with_a_small_buffer(
    harness, cluster, wait_until
):
    # Given 4 partitions of 200 records and a buffer of 80: the fake client hands out partition 0
    # first, so without per-partition pausing the buffer would hold only partition 0's records
    # (calls slower than the client, so that the buffer fills: a no-op handler keeps up with
    # the client, and the order is the client's)
    cluster.create_topic("t", 4)
    for i in range(800):
        cluster.produce("t", b"%d" % i, partition=i // 200)
    order: list[int] = []
    pc = harness.make(
        Options(
            ordering="partition", max_concurrency=4, max_buffered_records=80, fetch_batch_size=10
        )
    )

    def handle(ctx):
        time.sleep(0.0002)
        order.append(ctx.partition)

    pc.poll(handle)
    wait_until(lambda: len(order) == 800, timeout=30)
    # Then all four partitions ran side by side: each started long before partition 0 finished
    last_of_partition_0 = max(i for i, p in enumerate(order) if p == 0)
    for partition in (1, 2, 3):
        assert order.index(partition) < last_of_partition_0 / 2
    assert pc.statistics().partition_pauses > 0
