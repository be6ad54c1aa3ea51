"""poll_and_produce on the fakes: what counts as done, what fails, and bad configuration."""

from __future__ import annotations

import pytest

from parallel_consumer import (
    CommitMode,
    ConfigurationError,
    Options,
    ParallelConsumer,
    PollContext,
    ProcessingOrder,
    ProduceError,
    ProduceResult,
    ProducerRecord,
)
from parallel_consumer.errors import InvalidOutput
from parallel_consumer.produce import outputs_of


def records_in(cluster, topic: str, partition: int = 0) -> list:
    return list(cluster._logs[topic][partition])


def test_outputs_are_produced_and_reported_and_inputs_done_after_delivery(
    harness, cluster, wait_until
):
    # Given 20 inputs over 2 keys
    cluster.create_topic("t")
    cluster.create_topic("out")
    for i in range(20):
        cluster.produce("t", f"v{i}".encode(), key=b"ab"[i % 2 : i % 2 + 1])
    reports: list[ProduceResult] = []
    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=4))

    # When each input becomes two outputs with its key
    @pc.poll_and_produce(on_produced=reports.append)
    def handle(ctx: PollContext) -> list[ProducerRecord]:
        return [
            ProducerRecord("out", ctx.value, key=ctx.key, headers={"n": "1"}),
            ProducerRecord("out", ctx.value, key=ctx.key, headers=[("n", b"2")]),
        ]

    # Then every output is written, reported with where it landed, and the inputs are done
    wait_until(lambda: pc.statistics().records_succeeded == 20)
    out = records_in(cluster, "out")
    assert len(out) == 40
    assert len(reports) == 40
    assert {(r.partition, r.offset) for r in reports} == {(0, m.offset()) for m in out}
    assert all(r.context.value == r.record.value for r in reports)
    stats = pc.statistics()
    assert (stats.outputs_sent, stats.outputs_acknowledged, stats.outputs_failed) == (40, 40, 0)
    # and a key's outputs follow its inputs' order
    for key in (b"a", b"b"):
        values = [m.value() for m in out if m.key() == key]
        assert values == sorted(values, key=lambda v: int(v[1:]))
        assert [m.headers() for m in out if m.key() == key][:2] == [[("n", b"1")], [("n", b"2")]]


def test_a_failed_delivery_fails_the_input_which_is_retried(harness, cluster, wait_until):
    # Given one input whose first output delivery fails (the failure is armed before the
    # input exists, so that its first attempt cannot slip through before it)
    cluster.create_topic("t")
    cluster.create_topic("out")
    seen: list[BaseException | None] = []
    pc = harness.make(Options(retry_delay=0))

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> ProducerRecord:
        seen.append(ctx.last_failure)
        return ProducerRecord("out", b"y")

    harness.producers[0].fail_next_deliveries(1)
    cluster.produce("t", b"x", key=b"k")
    # Then it is retried with the reason, and done once its output is delivered
    wait_until(lambda: pc.statistics().records_succeeded == 1)
    assert seen[0] is None
    assert isinstance(seen[1], ProduceError)
    assert "injected delivery failure" in str(seen[1])
    assert len(records_in(cluster, "out")) == 1
    assert pc.statistics().outputs_failed == 1


@pytest.mark.parametrize(
    "value", [b"raw bytes", {"topic": "out"}, [ProducerRecord("out", b"ok"), "nope"]]
)
def test_a_wrong_return_value_fails_the_input_with_a_clear_reason(
    harness, cluster, wait_until, value
):
    cluster.create_topic("t")
    cluster.create_topic("out")
    cluster.produce("t", b"x")
    seen: list[BaseException | None] = []
    pc = harness.make(Options(retry_delay=0))

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> object:
        seen.append(ctx.last_failure)
        return value if ctx.attempts == 0 else None

    wait_until(lambda: pc.statistics().records_succeeded == 1)
    assert isinstance(seen[1], TypeError)
    assert "must return a ProducerRecord" in str(seen[1])
    assert records_in(cluster, "out") == []


def test_a_missing_output_topic_fails_the_input(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    seen: list[BaseException | None] = []
    pc = harness.make(Options(retry_delay=0))

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> ProducerRecord:
        seen.append(ctx.last_failure)
        if ctx.attempts == 2:
            cluster.create_topic("out")
        return ProducerRecord("out", b"y")

    wait_until(lambda: pc.statistics().records_succeeded == 1)
    assert [type(f) for f in seen] == [type(None), ProduceError, ProduceError]
    assert "does not exist" in str(seen[1])


def test_transactional_mode_commits_offsets_in_the_transaction(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.create_topic("out")
    for i in range(10):
        cluster.produce("t", b"x", key=str(i).encode())
    pc = harness.make(
        Options(commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER, commit_interval=0.01),
        producer_config={"transactional.id": "tx"},
    )

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> ProducerRecord:
        return ProducerRecord("out", ctx.value, key=ctx.key)

    wait_until(lambda: cluster.committed("g", "t", 0) == (10, None))
    producer = harness.producers[0]
    assert producer.commits >= 1
    assert producer.aborts == 0
    # (the consumer never committed by itself)
    assert harness.consumers[0].commit_log == []


def test_the_decorator_forms_return_the_handler(harness, cluster):
    cluster.create_topic("t")
    pc = harness.make()

    def handle(ctx: PollContext) -> None:
        return None

    assert pc.poll_and_produce(handle) is handle
    other = harness.make(group="h")
    assert other.poll_and_produce(on_produced=print)(handle) is handle


# -- configuration ------------------------------------------------------------------------------

BASE = {"bootstrap.servers": "fake:9092", "group.id": "g"}


def test_the_transactional_mode_needs_a_transactional_id() -> None:
    options = Options(commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER)
    with pytest.raises(ConfigurationError, match=r"transactional\.id"):
        ParallelConsumer(BASE, options)
    with pytest.raises(ConfigurationError, match=r"transactional\.id"):
        ParallelConsumer(BASE, options, producer_config={"linger.ms": 5})


def test_a_transactional_id_outside_the_transactional_mode_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="PERIODIC_TRANSACTIONAL_PRODUCER"):
        ParallelConsumer(BASE, Options(), producer_config={"transactional.id": "x"})


@pytest.mark.parametrize("setting", ["delivery.report.only.error", "on_delivery"])
def test_settings_that_hide_delivery_reports_are_refused(setting: str) -> None:
    with pytest.raises(ConfigurationError, match="delivery report"):
        ParallelConsumer(BASE, Options(), producer_config={setting: True})


def test_poll_is_refused_in_the_transactional_mode(harness, cluster) -> None:
    cluster.create_topic("t")
    pc = harness.make(
        Options(commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER),
        producer_config={"transactional.id": "tx"},
    )
    with pytest.raises(ConfigurationError, match="poll_and_produce"):
        pc.poll(lambda ctx: None)


def test_the_transactional_id_is_derived_per_instance(harness, cluster) -> None:
    from parallel_consumer.client_config import checked_producer_config

    options = Options(commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER)
    static = checked_producer_config(
        {"transactional.id": "orders"}, {**BASE, "group.instance.id": "pod-3"}, options
    )
    assert static["transactional.id"] == "orders-pod-3"
    assert static["enable.idempotence"] is True
    assert static["bootstrap.servers"] == "fake:9092"
    one = checked_producer_config({"transactional.id": "orders"}, BASE, options)
    two = checked_producer_config({"transactional.id": "orders"}, BASE, options)
    assert one["transactional.id"] != two["transactional.id"]
    assert one["transactional.id"].startswith("orders-")


def test_the_commit_interval_defaults_per_mode() -> None:
    assert Options().commit_interval == 5.0
    transactional = Options(commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER)
    assert transactional.commit_interval == 0.1
    assert Options(commit_interval=2).commit_interval == 2.0


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("",), {"value": b"x"}, "topic"),
        (("t", b"x"), {"headers": [("a", 1)]}, "headers"),
        (("t", b"x"), {"headers": "ab"}, "headers"),
        (("t", b"x"), {"partition": -1}, "partition"),
        (("t", b"x"), {"partition": True}, "partition"),
    ],
)
def test_producer_record_rejects_bad_fields(args, kwargs, message) -> None:
    with pytest.raises(TypeError, match=message):
        ProducerRecord(*args, **kwargs)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("t", 3), {}, "value"),
        (("t", b"x"), {"key": 1.5}, "key"),
    ],
)
def test_an_output_key_or_value_that_is_not_bytes_is_rejected_without_a_serializer(
    args, kwargs, message
) -> None:
    # (an object is a valid payload for Options.value_serializer / key_serializer, so the check
    # is made when the handler returns it)
    with pytest.raises(InvalidOutput, match=f"the {message} of an output to t is a"):
        outputs_of(ProducerRecord(*args, **kwargs))


def test_outputs_of_accepts_one_many_or_none() -> None:
    one = ProducerRecord("t", "v", key="k")
    assert one.value == b"v"
    assert one.key == b"k"
    assert outputs_of(None) == []
    assert outputs_of(one) == [one]
    assert outputs_of((one, one)) == [one, one]
    with pytest.raises(TypeError):
        outputs_of(iter([one]))


# -- other runners ---------------------------------------------------------------------------


def produce_copy(ctx: PollContext) -> ProducerRecord:
    """Module level: the process runner's workers import it by name."""
    return ProducerRecord("out", ctx.value, key=ctx.key)


def test_async_handlers_produce(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.create_topic("out")
    for i in range(50):
        cluster.produce("t", f"v{i}".encode(), key=b"k%d" % (i % 5))
    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=20))

    @pc.poll_and_produce
    async def handle(ctx: PollContext) -> ProducerRecord:
        return ProducerRecord("out", ctx.value, key=ctx.key)

    wait_until(lambda: pc.statistics().records_succeeded == 50)
    out = records_in(cluster, "out")
    assert sorted(m.value() for m in out) == sorted(f"v{i}".encode() for i in range(50))
    for key in {m.key() for m in out}:
        values = [int(m.value()[1:]) for m in out if m.key() == key]
        assert values == sorted(values)


def test_process_handlers_produce(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.create_topic("out")
    for i in range(20):
        cluster.produce("t", f"v{i}".encode(), key=b"k%d" % (i % 3))
    pc = harness.make(Options(runner="process", processes=1, ordering=ProcessingOrder.KEY))
    pc.poll_and_produce(produce_copy)
    wait_until(lambda: pc.statistics().records_succeeded == 20, timeout=60)
    assert sorted(m.value() for m in records_in(cluster, "out")) == sorted(
        f"v{i}".encode() for i in range(20)
    )
