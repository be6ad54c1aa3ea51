"""Broker failures on a real three-broker cluster (RF 3, min ISR 2): a partition leader killed,
the transaction coordinator killed, a rolling restart, the whole cluster down.

Inputs arrive for the whole scenario (``Feeder``), so each fault hits a running pipeline. See
docs/operations.md, "Broker failures and rolling restarts".
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_support import AtRisk, Feeder, all_brokers_running
from confluent_kafka import Producer
from engine_support import committed_in_engine, end_offsets, wait_until
from produce_support import finish_and_read, output_of, read_outputs

from parallel_consumer import (
    CommitMode,
    HealthReport,
    Lifecycle,
    Options,
    ParallelConsumer,
    PollContext,
    ProcessingOrder,
    ProducerRecord,
)
from parallel_consumer.testing import LocalKafka, create_topic

pytestmark = pytest.mark.timeout(300)

PARTITIONS = (0, 1, 2)
#: Seconds a killed broker stays down.
DOWN_FOR = 10.0
#: Seconds the whole cluster stays down.
CLUSTER_DOWN_FOR = 30.0


@pytest.fixture
def cluster(kafka_cluster: LocalKafka) -> Iterator[LocalKafka]:
    all_brokers_running(kafka_cluster)
    yield kafka_cluster
    all_brokers_running(kafka_cluster)


@pytest.fixture
def started() -> Iterator[list[ParallelConsumer]]:
    instances: list[ParallelConsumer] = []
    yield instances
    for pc in instances:
        if pc.lifecycle is not Lifecycle.CLOSED:
            pc.close(drain=False, timeout=5.0)


def topics(cluster: LocalKafka, name: str) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    source = create_topic(cluster.bootstrap_servers, f"pc-{name}-in-{tag}", partitions=3)
    sink = create_topic(cluster.bootstrap_servers, f"pc-{name}-out-{tag}", partitions=3)
    return source, sink


def consumer_config(cluster: LocalKafka, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": cluster.bootstrap_servers,
        "group.id": f"pc-group-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "fetch.wait.max.ms": 50,
        **extra,
    }


def outputs_to(sink: str) -> Any:
    def handle(ctx: PollContext) -> ProducerRecord:
        time.sleep(0.001)
        return output_of(ctx, sink)

    return handle


def acknowledged(pc: ParallelConsumer) -> int:
    return pc.statistics().outputs_acknowledged


def succeeded(pc: ParallelConsumer) -> int:
    return pc.statistics().records_succeeded


def running(pc: ParallelConsumer) -> bool:
    assert pc.failure is None, pc.failure
    return pc.lifecycle is Lifecycle.RUNNING


def down_for(pc: ParallelConsumer, seconds: float) -> None:
    """Let ``seconds`` pass while checking that ``pc`` keeps running."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert running(pc), pc.lifecycle
        time.sleep(0.1)


def threads_now() -> str:
    """Every thread's stack: where a pipeline that stopped moving waits."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(
        f"--- {names.get(ident, ident)}\n{''.join(traceback.format_stack(frame)[-6:])}"
        for ident, frame in sys._current_frames().items()
    )


def progress_by(pc: ParallelConsumer, count: int, measure: Any, what: str) -> None:
    target = measure(pc) + count
    wait_until(
        lambda: running(pc) and measure(pc) >= target,
        timeout=90,
        what=what,
        show=lambda: f"{pc.statistics()}\n{threads_now()}",
    )


def recording_consumer(
    cluster: LocalKafka, source: str, started: list[ParallelConsumer]
) -> tuple[ParallelConsumer, set[tuple[int, int]]]:
    """An at-least-once consumer in KEY order of ``source``, and the inputs it processed."""
    processed: set[tuple[int, int]] = set()
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        with lock:
            processed.add((ctx.partition, ctx.offset))

    pc = ParallelConsumer(
        consumer_config(cluster), Options(ordering=ProcessingOrder.KEY, max_concurrency=16)
    )
    started.append(pc)
    pc.subscribe(source)
    pc.poll(handle)
    return pc, processed


def all_committed(cluster: LocalKafka, pc: ParallelConsumer, source: str) -> dict[int, int]:
    """Wait until ``pc`` committed every input of ``source``; the end offsets."""
    ends = end_offsets(cluster.bootstrap_servers, source, PARTITIONS)
    wait_until(
        lambda: committed_in_engine(pc.statistics(), ends),
        timeout=90,
        what="every input committed",
        show=pc.statistics,
    )
    return ends


def test_a_killed_partition_leader_loses_nothing_and_keeps_key_order_with_outputs(
    cluster: LocalKafka, started: list[ParallelConsumer]
) -> None:
    # Given inputs arriving in 3 partitions and an at-least-once pipeline in KEY order whose
    # outputs go out idempotently with acks=all
    source, sink = topics(cluster, "leader-kill")
    feeder = Feeder(cluster.bootstrap_servers, source, rate=300)
    processed: set[tuple[int, int]] = set()
    lock = threading.Lock()
    produce = outputs_to(sink)

    def handle(ctx: PollContext) -> ProducerRecord:
        with lock:
            processed.add((ctx.partition, ctx.offset))
        return produce(ctx)  # type: ignore[no-any-return]

    pc = ParallelConsumer(
        consumer_config(cluster),
        Options(ordering=ProcessingOrder.KEY, max_concurrency=16),
        producer_config={"acks": "all"},
    )
    started.append(pc)
    pc.subscribe(source)
    pc.poll_and_produce(handle)
    progress_by(pc, 500, acknowledged, "outputs before the kill")
    at_risk = AtRisk(pc)

    # When the leader of partition 0 is SIGKILLed mid-run and started again 10 s later
    victim = cluster.leader_of(source, 0)
    cluster.kill_broker(victim)
    down_for(pc, DOWN_FOR)
    took = cluster.start_broker(victim)
    progress_by(pc, 500, acknowledged, "outputs after the restart")
    total = feeder.stop()

    # Then every input is processed and committed, every output present, in key order;
    # duplicates are at most what was sent and not committed at some moment
    ends = end_offsets(cluster.bootstrap_servers, source, PARTITIONS)
    assert sum(ends.values()) == total
    wait_until(
        lambda: committed_in_engine(pc.statistics(), ends),
        timeout=90,
        what="every input committed",
        show=pc.statistics,
    )
    at_risk.stop()
    assert pc.failure is None
    pc.close()
    outputs = read_outputs(cluster.bootstrap_servers, sink, PARTITIONS, read_committed=False)
    print(
        f"\n{total} inputs, broker {victim} killed, back after {took:.1f}s; duplicates "
        f"{outputs.duplicates} (bound {at_risk.bound})"
    )
    assert processed == feeder.delivered
    assert set(outputs.inputs) == feeder.delivered
    assert outputs.order_violations() == []
    assert outputs.duplicates <= at_risk.bound


@pytest.mark.parametrize(
    "session_timeout",
    [
        pytest.param(45_000, id="session-45s"),
        # A consumer session shorter than the broker's (9 s) is lost with the group's
        # coordinator too: a rebalance on top (where send_offsets_to_transaction was first seen
        # to block for minutes). Another minute or so: a stress test.
        pytest.param(6_000, id="session-6s", marks=pytest.mark.stress),
    ],
)
def test_exactly_once_rides_out_the_transaction_coordinator_and_a_leader_being_killed(
    cluster: LocalKafka, started: list[ParallelConsumer], session_timeout: int
) -> None:
    # Given inputs arriving and a transactional pipeline with the library's default settings
    # (its producers are watched, to learn its transactional.id and so its coordinator)
    source, sink = topics(cluster, "eos-kill")
    feeder = Feeder(cluster.bootstrap_servers, source, rate=300)
    producers: list[str] = []

    def producer_factory(config: dict[str, Any]) -> Producer:
        producers.append(config["transactional.id"])
        return Producer(config)

    pc = ParallelConsumer(
        consumer_config(cluster, **{"session.timeout.ms": session_timeout}),
        Options(
            ordering=ProcessingOrder.KEY,
            max_concurrency=16,
            commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER,
        ),
        producer_config={"transactional.id": "pc-tx"},
        producer_factory=producer_factory,
    )
    started.append(pc)
    pc.subscribe(source)
    pc.poll_and_produce(outputs_to(sink))
    progress_by(pc, 500, acknowledged, "outputs before the first kill")

    # When the broker coordinating its transactions is SIGKILLed mid-run, back 10 s later,
    coordinator = cluster.transaction_coordinator_of(producers[0])
    cluster.kill_broker(coordinator)
    down_for(pc, DOWN_FOR)
    cluster.start_broker(coordinator)
    progress_by(pc, 500, acknowledged, "outputs after the coordinator's restart")
    # and then the leader of a consumed partition on another broker, back 10 s later
    leaders = {cluster.leader_of(source, p) for p in PARTITIONS} - {coordinator}
    victim = min(leaders) if leaders else (coordinator + 1) % cluster.brokers
    cluster.kill_broker(victim)
    down_for(pc, DOWN_FOR)
    cluster.start_broker(victim)
    progress_by(pc, 500, acknowledged, "outputs after the second restart")
    total = feeder.stop()

    # Then it never stopped, and a read_committed reader sees each input's output exactly
    # once, in key order
    assert running(pc)
    _, stats = finish_and_read(
        cluster.bootstrap_servers, pc, source, sink, list(PARTITIONS), timeout=120
    )
    assert pc.failure is None
    print(
        f"\n{total} inputs; killed coordinator {coordinator}, then {victim}; "
        f"{stats.commit_failures} commit failures, {stats.results_stale} stale results, "
        f"{len(producers) - 1} producer renewals"
    )


def test_a_rolling_restart_neither_stalls_nor_loses_and_health_recovers(
    cluster: LocalKafka, started: list[ParallelConsumer]
) -> None:
    # Given inputs arriving and an at-least-once consumer
    source, _ = topics(cluster, "rolling")
    feeder = Feeder(cluster.bootstrap_servers, source, rate=300)
    pc, processed = recording_consumer(cluster, source, started)
    progress_by(pc, 300, succeeded, "records before the restarts")

    # When every broker is stopped cleanly and started again, one at a time
    reports: list[HealthReport] = []
    longest_stall = 0.0
    last_count, last_move = succeeded(pc), time.monotonic()

    def watch() -> None:
        nonlocal longest_stall, last_count, last_move
        now, count = time.monotonic(), succeeded(pc)
        if count != last_count:
            last_count, last_move = count, now
        longest_stall = max(longest_stall, now - last_move)
        reports.append(pc.health())

    for broker in range(cluster.brokers):
        stopping = threading.Thread(target=cluster.stop_broker, args=(broker,))
        stopping.start()
        while stopping.is_alive():
            watch()
            time.sleep(0.05)
        stopping.join()
        restart = threading.Thread(target=cluster.start_broker, args=(broker,))
        restart.start()
        while restart.is_alive():
            watch()
            time.sleep(0.05)
        restart.join()
        assert cluster.broker_running(broker)
        target = succeeded(pc) + 200
        while succeeded(pc) < target:
            watch()
            assert running(pc)
            time.sleep(0.05)
    total = feeder.stop()

    # Then nothing is lost, processing never stopped for longer than the client's reconnect
    # bound, health() never reported a failure, and it is healthy at the end
    ends = all_committed(cluster, pc, source)
    wait_until(lambda: pc.health().healthy, timeout=30, what="healthy", show=pc.health)
    assert pc.failure is None
    unhealthy = [r.reasons for r in reports if not r.healthy]
    slowest_commit = max((p.since_commit_moved for r in reports for p in r.partitions), default=0.0)
    pc.close()
    print(
        f"\n{total} inputs; longest stall {longest_stall:.1f}s, commit unmoved up to "
        f"{slowest_commit:.1f}s; {len(unhealthy)} of {len(reports)} reports unhealthy"
    )
    assert processed == feeder.delivered
    assert all(r.failure is None for r in reports)
    # (librdkafka's reconnect.backoff.max.ms is 10 s; a clean stop moves leaders first)
    assert longest_stall < 10.0 + 6.0
    assert sum(ends.values()) == total


def test_the_whole_cluster_down_for_30_s_neither_stops_the_consumer_nor_loses_a_record(
    cluster: LocalKafka, started: list[ParallelConsumer]
) -> None:
    # Given inputs arriving and an at-least-once consumer
    source, _ = topics(cluster, "cluster-down")
    feeder = Feeder(cluster.bootstrap_servers, source, rate=300)
    pc, processed = recording_consumer(cluster, source, started)
    progress_by(pc, 300, succeeded, "records before the outage")

    # When every broker is SIGKILLed and the cluster stays down for 30 s
    for broker in range(cluster.brokers):
        cluster.kill_broker(broker)
    down_at = time.monotonic()
    unhealthy: HealthReport | None = None
    while time.monotonic() - down_at < CLUSTER_DOWN_FOR:
        assert running(pc)
        report = pc.health()
        if not report.healthy and unhealthy is None:
            unhealthy = report
            print(f"\nunhealthy {time.monotonic() - down_at:.1f}s into the outage")
        time.sleep(0.1)
    cluster.start_broker(*range(cluster.brokers))
    back_at = time.monotonic()

    # Then health() was unhealthy while it was down and says why; the consumer still runs,
    # turns healthy again, and processes and commits every input
    assert unhealthy is not None
    assert any("every Kafka broker down" in reason for reason in unhealthy.reasons)
    progress_by(pc, 300, succeeded, "records after the cluster is back")
    wait_until(lambda: pc.health().healthy, timeout=60, what="healthy again", show=pc.health)
    healthy_after = time.monotonic() - back_at
    total = feeder.stop()
    ends = all_committed(cluster, pc, source)
    assert pc.failure is None
    pc.close()
    print(f"{total} inputs; healthy {healthy_after:.1f}s after the cluster was back")
    assert processed == feeder.delivered
    assert sum(ends.values()) == total
