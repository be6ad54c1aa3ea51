"""Failure handling on the fakes: max_retries, signals, policies, dead letters, hooks, batches.

Progress is watched through handler calls and what the fake cluster holds; ``statistics()`` is
read once the outcome is known (reading it in a tight loop wakes the controller).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from parallel_consumer import (
    CommitMode,
    ConfigurationError,
    DeadLetter,
    NoHooks,
    OnExhausted,
    Options,
    PollContext,
    ProcessingOrder,
    ProducerRecord,
    RecordContext,
    RetriesExhausted,
    Skip,
)
from parallel_consumer import dead_letter as dl


def _dead_letters(cluster, topic: str = "t.dlq") -> list[Any]:
    return cluster.records(topic)


def _committed(cluster, topic: str = "t", partition: int = 0) -> int | None:
    found = cluster.committed("g", topic, partition)
    return None if found is None else found[0]


class Recorder(NoHooks):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[Any, ...]] = []

    def _add(self, *event: Any) -> None:
        with self.lock:
            self.events.append(event)

    def on_success(self, record: RecordContext) -> None:
        self._add("success", record.offset)

    def on_failure(self, record: RecordContext, error: BaseException) -> None:
        self._add("failure", record.offset, record.attempts, type(error).__name__)

    def on_retry(self, record: RecordContext, error: BaseException, delay: float) -> None:
        self._add("retry", record.offset, delay)

    def on_dead_letter(
        self, record: RecordContext, error: BaseException | None, reason: str
    ) -> None:
        self._add("dead_letter", record.offset, reason)

    def on_skip(self, record: RecordContext, error: BaseException | None, reason: str) -> None:
        self._add("skip", record.offset, reason)

    def of(self, name: str) -> list[tuple[Any, ...]]:
        with self.lock:
            return [e[1:] for e in self.events if e[0] == name]


def test_a_poison_record_is_dead_lettered_after_max_retries_and_its_key_goes_on(
    harness, cluster, wait_until
):
    # Given key a's second record always fails, with max_retries=2 (the DLQ topic is created)
    cluster.create_topic("t")
    for value in (b"a0", b"a1-poison", b"a2", b"b0"):
        cluster.produce("t", value, key=value[:1], headers=[("app", b"x")])
    calls: list[bytes] = []
    hooks = Recorder()
    pc = harness.make(Options(max_retries=2, retry_delay=0), hooks=hooks)

    @pc.poll
    def handle(ctx: PollContext) -> None:
        calls.append(ctx.value)
        if b"poison" in ctx.value:
            raise ValueError("cannot parse " + ctx.value.decode())

    # When it has run 3 times, then it is dead-lettered and the rest of key a runs after it
    wait_until(lambda: len(_dead_letters(cluster)) == 1 and b"a2" in calls)
    assert calls.count(b"a1-poison") == 3
    assert calls.index(b"a2") > max(i for i, v in enumerate(calls) if v == b"a1-poison")
    [letter] = _dead_letters(cluster)
    assert (letter.key(), letter.value()) == (b"a", b"a1-poison")
    assert letter.headers()[0] == ("app", b"x")
    info = dl.read_dead_letter(letter.headers())
    assert info is not None
    assert (info.topic, info.partition, info.offset, info.attempts) == ("t", 0, 1, 3)
    assert (info.error_type, info.error_message) == (
        "builtins.ValueError",
        "cannot parse a1-poison",
    )
    assert (info.reason, info.group) == (dl.Reason.RETRIES_EXHAUSTED, "g")
    assert info.first_failure_at is not None
    assert info.last_failure_at is not None
    # And the committed offset moves past it; hooks and statistics say what happened
    wait_until(lambda: len(hooks.of("success")) == 3)
    pc.close()
    assert _committed(cluster) == 4
    stats = pc.statistics()
    assert (stats.records_dead_lettered, stats.retries_exhausted, stats.records_failed) == (1, 1, 3)
    assert hooks.of("dead_letter") == [(1, dl.Reason.RETRIES_EXHAUSTED)]
    assert [e[:2] for e in hooks.of("failure")] == [(1, 1), (1, 2), (1, 3)]
    assert len(hooks.of("retry")) == 2


def test_max_retries_zero_gives_up_at_the_first_failure(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"k")
    calls: list[int] = []
    pc = harness.make(Options(max_retries=0, on_retries_exhausted="skip"))
    pc.poll(lambda ctx: calls.append(ctx.attempts) or 1 / 0)
    wait_until(lambda: calls == [0])
    pc.close()
    assert _committed(cluster) == 1
    assert pc.statistics().records_skipped_on_failure == 1


def test_skip_marks_the_record_done_without_retry_or_dead_letter(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.produce("t", b"dup", key=b"k")
    cluster.produce("t", b"next", key=b"k")
    calls: list[bytes] = []
    hooks = Recorder()
    pc = harness.make(Options(retry_delay=1000), hooks=hooks)

    @pc.poll
    def handle(ctx: PollContext) -> None:
        calls.append(ctx.value)
        if ctx.value == b"dup":
            raise Skip("duplicate")

    wait_until(lambda: calls == [b"dup", b"next"])
    pc.close()
    assert _committed(cluster) == 2
    stats = pc.statistics()
    assert (stats.records_skipped_on_failure, stats.records_failed, stats.records_succeeded) == (
        1,
        0,
        1,
    )
    assert hooks.of("skip") == [(0, "duplicate")]
    assert hooks.of("success") == [(1,)]
    assert hooks.of("failure") == []


def test_dead_letter_signal_sends_at_once_with_the_cause_in_the_headers(
    harness, cluster, wait_until
):
    cluster.create_topic("t")
    cluster.create_topic("poison")
    cluster.produce("t", b"{", key=b"k")
    calls: list[int] = []
    pc = harness.make(Options(dead_letter_topic="poison"))

    @pc.poll
    def handle(ctx: PollContext) -> None:
        calls.append(ctx.attempts)
        try:
            raise KeyError("field")
        except KeyError as exc:
            raise DeadLetter("bad json") from exc

    wait_until(lambda: len(_dead_letters(cluster, "poison")) == 1)
    info = dl.read_dead_letter(_dead_letters(cluster, "poison")[0].headers())
    assert info is not None
    assert (info.attempts, info.reason, info.error_type) == (
        0,
        dl.Reason.DEAD_LETTER,
        "builtins.KeyError",
    )
    assert calls == [0]
    pc.close()
    assert _committed(cluster) == 1


def test_non_retryable_errors_go_straight_to_the_dead_letter_topic(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"k")
    calls: list[int] = []
    pc = harness.make(Options(non_retryable=(LookupError,)))

    @pc.poll
    def handle(ctx: PollContext) -> None:
        calls.append(ctx.attempts)
        raise KeyError("missing")

    wait_until(lambda: len(_dead_letters(cluster)) == 1)
    info = dl.read_dead_letter(_dead_letters(cluster)[0].headers())
    assert info is not None
    assert (info.attempts, info.reason) == (1, dl.Reason.NON_RETRYABLE)
    assert calls == [0]


def test_stop_policy_fails_the_consumer_and_commits_nothing_at_or_past_the_record(
    harness, cluster, wait_until
):
    cluster.create_topic("t")
    cluster.produce("t", b"ok", key=b"a")
    cluster.produce("t", b"bad", key=b"b")
    pc = harness.make(
        Options(
            max_retries=1,
            retry_delay=0,
            on_retries_exhausted=OnExhausted.STOP,
            commit_interval=0.01,
        )
    )

    @pc.poll
    def handle(ctx: PollContext) -> None:
        if ctx.value == b"bad":
            raise ValueError("bad for good")

    with pytest.raises(RetriesExhausted, match=r"t\[0\]@1 failed for good") as caught:
        pc.wait(10)
    assert isinstance(caught.value.__cause__, ValueError)
    committed = _committed(cluster)
    assert committed is None or committed <= 1


def test_the_callback_picks_the_policy_per_record(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.produce("t", b"skip-me", key=b"a")
    cluster.produce("t", b"keep-me", key=b"b")
    seen: list[tuple[bytes, str]] = []

    def callback(record: RecordContext, error: BaseException) -> OnExhausted | None:
        seen.append((record.value, str(error)))
        return OnExhausted.SKIP if record.value == b"skip-me" else None

    pc = harness.make(Options(max_retries=0, retries_exhausted_callback=callback))
    pc.poll(lambda ctx: (_ for _ in ()).throw(RuntimeError(ctx.value.decode())))
    wait_until(lambda: len(_dead_letters(cluster)) == 1)
    pc.close()
    assert [m.value() for m in _dead_letters(cluster)] == [b"keep-me"]
    assert sorted(seen) == [(b"keep-me", "keep-me"), (b"skip-me", "skip-me")]
    assert _committed(cluster) == 2


def test_a_failed_dead_letter_write_keeps_the_record_uncommitted_until_it_is_written(
    harness, cluster, clock, wait_until
):
    # Given a dead-letter topic that disappears after start
    cluster.create_topic("t")
    calls: list[bytes] = []
    pc = harness.make(Options(max_retries=0, commit_interval=0.01), clock=clock)

    @pc.poll
    def handle(ctx: PollContext) -> None:
        calls.append(ctx.value)
        if ctx.value == b"poison":
            raise ValueError("poison")

    # (t.dlq was created when the handler was registered; delete it before anything fails)
    cluster.delete_topic("t.dlq")
    cluster.produce("t", b"poison", key=b"k")
    cluster.produce("t", b"after", key=b"k")
    wait_until(lambda: calls == [b"poison"])
    # When the write fails, then the record stays incomplete and its key waits
    wait_until(lambda: pc.statistics().dead_letter_failures >= 1)
    clock.advance(0.5)
    assert calls == [b"poison"]
    assert (_committed(cluster) or 0) == 0
    # When the topic exists again and the resend is due, then it is written and all goes on
    cluster.create_topic("t.dlq")
    clock.advance(2)
    wait_until(lambda: calls == [b"poison", b"after"])
    pc.close()
    assert [m.value() for m in _dead_letters(cluster)] == [b"poison"]
    assert _committed(cluster) == 2
    assert pc.statistics().records_dead_lettered == 1


def test_a_dead_letter_topic_that_cannot_be_created_is_a_configuration_error(harness, cluster):
    cluster.create_topic("t")
    cluster.refuse_topic_creation = True
    pc = harness.make(Options(max_retries=3))
    with pytest.raises(
        ConfigurationError, match=r"'t.dlq' does not exist and could not be created"
    ):
        pc.poll(lambda ctx: None)


def test_a_regex_subscription_needs_an_explicit_dead_letter_topic(harness, cluster):
    cluster.create_topic("t")
    pc = harness.make(Options(max_retries=3), topics=("^t.*",))
    with pytest.raises(ConfigurationError, match="dead_letter_topic"):
        pc.poll(lambda ctx: None)


def test_a_dead_letter_topic_that_is_also_subscribed_is_refused(harness, cluster):
    cluster.create_topic("t")
    cluster.create_topic("u")
    pc = harness.make(Options(dead_letter_topic="u"), topics=("t", "u"))
    with pytest.raises(ConfigurationError, match="'u' is also subscribed"):
        pc.poll(lambda ctx: None)


@pytest.mark.parametrize(
    ("topics", "refused"),
    [
        (("^orders.*",), True),
        (("^ord(ers|x)",), True),  # unanchored at the end, as the client's regex
        (("payments", "^orders.*"), True),
        (("^orders$",), False),
        (("^orders-[a-z]+$",), False),
        (("^[",), False),  # not a Python regex: left to the client
    ],
)
def test_a_regex_subscription_matching_the_dead_letter_topic_is_refused_at_start(
    topics: tuple[str, ...], refused: bool
) -> None:
    from parallel_consumer.kafka.dead_letter_topics import dead_letter_topics

    options = Options(dead_letter_topic="orders.dlq")
    if refused:
        with pytest.raises(ConfigurationError, match=r"'orders\.dlq' is also subscribed"):
            dead_letter_topics(options, topics)
    else:
        assert set(dead_letter_topics(options, topics).values()) == {"orders.dlq"}


def test_a_hook_that_raises_never_breaks_processing(harness, cluster, wait_until):
    class Broken(NoHooks):
        def on_failure(self, record: RecordContext, error: BaseException) -> None:
            raise RuntimeError("metrics down")

        def on_dead_letter(
            self, record: RecordContext, error: BaseException | None, reason: str
        ) -> None:
            raise RuntimeError("metrics down")

        def on_success(self, record: RecordContext) -> None:
            raise RuntimeError("metrics down")

    cluster.create_topic("t")
    cluster.produce("t", b"bad", key=b"a")
    cluster.produce("t", b"good", key=b"a")
    pc = harness.make(Options(max_retries=0), hooks=Broken())
    done: list[bytes] = []

    @pc.poll
    def handle(ctx: PollContext) -> None:
        if ctx.value == b"bad":
            raise ValueError
        done.append(ctx.value)

    wait_until(lambda: done == [b"good"])
    pc.close()
    assert _committed(cluster) == 2


def test_a_batch_fails_only_the_record_passed_to_fail(harness, cluster, wait_until):
    # Given a batch of 4 records of distinct keys, the handler failing one of them once
    cluster.create_topic("t")
    for i in range(4):
        cluster.produce("t", b"%d" % i, key=b"%d" % i)
    calls: list[list[bytes]] = []
    pc = harness.make(
        Options(batch_size=4, max_concurrency=1, ordering=ProcessingOrder.UNORDERED, retry_delay=0)
    )

    @pc.poll
    def handle(ctx: PollContext) -> None:
        calls.append([r.value for r in ctx])
        for record in ctx:
            if record.value == b"2" and record.attempts == 0:
                ctx.fail(record, ValueError("one bad record"))

    # Then only that record runs again
    wait_until(lambda: len(calls) == 2)
    assert calls == [[b"0", b"1", b"2", b"3"], [b"2"]]
    pc.close()
    stats = pc.statistics()
    assert (stats.records_succeeded, stats.records_failed) == (4, 1)


def test_a_batch_can_skip_and_dead_letter_single_records(harness, cluster, wait_until):
    cluster.create_topic("t")
    for i in range(3):
        cluster.produce("t", b"%d" % i, key=b"%d" % i)
    calls: list[int] = []
    pc = harness.make(Options(batch_size=3, max_concurrency=1, dead_letter_topic="dlq"))

    @pc.poll
    def handle(ctx: PollContext) -> None:
        calls.append(len(ctx))
        ctx.fail(ctx[0], Skip("not for us"))
        ctx.fail(ctx[1], DeadLetter("broken"))

    wait_until(lambda: len(cluster.records("dlq")) == 1)
    pc.close()
    assert calls == [3]
    assert cluster.records("dlq")[0].value() == b"1"
    stats = pc.statistics()
    assert (
        stats.records_skipped_on_failure,
        stats.records_dead_lettered,
        stats.records_succeeded,
    ) == (1, 1, 1)
    assert _committed(cluster) == 3


def test_fail_rejects_records_of_another_call_and_non_exceptions() -> None:
    from parallel_consumer.testing.fakes import FakeCluster

    cluster = FakeCluster()
    cluster.create_topic("t")
    cluster.produce("t", b"a")
    cluster.produce("t", b"b")
    first, second = (RecordContext(m) for m in cluster.records("t"))
    ctx = PollContext([first])
    with pytest.raises(ValueError, match="not a record of this call"):
        ctx.fail(second, ValueError())
    with pytest.raises(TypeError, match="exception instance"):
        ctx.fail(first, "boom")  # type: ignore[arg-type]
    assert ctx.outcomes(None) == (None,)


def test_poll_and_produce_sends_the_calls_outputs_and_retries_only_the_failed_record(
    harness, cluster, wait_until
):
    cluster.create_topic("t")
    cluster.create_topic("out")
    for i in range(3):
        cluster.produce("t", b"%d" % i, key=b"%d" % i)
    calls: list[list[bytes]] = []
    pc = harness.make(Options(batch_size=3, max_concurrency=1, retry_delay=0))

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> list[ProducerRecord]:
        calls.append([r.value for r in ctx])
        outputs = []
        for record in ctx:
            if record.value == b"1" and record.attempts == 0:
                ctx.fail(record, ValueError("later"))
            else:
                outputs.append(ProducerRecord("out", record.value, key=record.key))
        return outputs

    wait_until(lambda: len(cluster.records("out")) == 3)
    pc.close()
    assert calls == [[b"0", b"1", b"2"], [b"1"]]
    assert sorted(m.value() for m in cluster.records("out")) == [b"0", b"1", b"2"]
    assert _committed(cluster) == 3


def test_transactional_dead_letters_commit_in_the_transaction_with_the_offset(cluster, wait_until):
    from parallel_consumer import ParallelConsumer
    from parallel_consumer.testing.fakes import FakeProducer

    cluster.create_topic("t")
    cluster.create_topic("out")
    cluster.produce("t", b"bad", key=b"k")
    producers: list[FakeProducer] = []

    def producer(config: dict[str, Any]) -> FakeProducer:
        producers.append(cluster.producer(config))
        return producers[-1]

    pc = ParallelConsumer(
        {"bootstrap.servers": "fake:1", "group.id": "g"},
        Options(commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER, max_retries=0),
        consumer_factory=cluster.consumer,
        producer_factory=producer,
        admin_factory=cluster.admin,
        producer_config={"transactional.id": "tx"},
    )
    pc.subscribe("t")
    try:

        @pc.poll_and_produce
        def handle(ctx: PollContext) -> ProducerRecord:
            raise ValueError("bad")

        wait_until(lambda: any(offsets for _, offsets in producers[0].committed_transactions))
    finally:
        pc.close()
    # The transaction that committed t[0]'s offset 1 holds the dead letter
    [(values, offsets)] = [t for t in producers[0].committed_transactions if t[1]]
    assert values == [b"bad"]
    assert offsets == [(("t", 0), 1)]


def test_a_partition_revoked_while_its_dead_letter_is_in_flight_commits_nothing_past_it(
    harness, cluster, wait_until
):
    # Given a poison record whose dead letter is written but not yet acknowledged
    cluster.create_topic("t")
    calls: list[bytes] = []
    pc = harness.make(Options(max_retries=0, commit_interval=0.01))

    @pc.poll
    def handle(ctx: PollContext) -> None:
        calls.append(ctx.value)
        if ctx.value == b"poison":
            raise ValueError("poison")

    producer = harness.producers[0]
    producer.hold.set()
    cluster.produce("t", b"poison", key=b"a")
    cluster.produce("t", b"ok", key=b"b")
    wait_until(lambda: sorted(calls) == [b"ok", b"poison"])
    wait_until(lambda: len(cluster.records("t.dlq")) == 1)

    # When the partition is revoked before the acknowledgement arrives
    harness.consumers[0].rebalance(revoke=[("t", 0)])
    wait_until(lambda: pc.statistics().partitions == ())
    producer.hold.clear()
    wait_until(lambda: pc.statistics().results_stale == 1)

    # Then nothing was committed past it, and it does not count as dead-lettered here
    assert (_committed(cluster) or 0) == 0
    assert pc.statistics().records_dead_lettered == 0

    # When the partition comes back, then the record runs again and is dead-lettered again
    # (at-least-once: one extra dead letter), and its offset commits this time
    harness.consumers[0].rebalance(assign=[("t", 0)])
    wait_until(lambda: calls.count(b"poison") == 2)
    wait_until(lambda: _committed(cluster) == 2)
    assert [m.value() for m in cluster.records("t.dlq")] == [b"poison", b"poison"]


def test_close_with_a_dead_letter_in_flight_leaves_the_record_uncommitted(
    harness, cluster, wait_until
):
    cluster.create_topic("t")
    calls: list[bytes] = []
    pc = harness.make(Options(max_retries=0, commit_interval=0.01))

    @pc.poll
    def handle(ctx: PollContext) -> None:
        calls.append(ctx.value)
        raise ValueError("poison")

    producer = harness.producers[0]
    producer.hold.set()
    cluster.produce("t", b"poison", key=b"a")
    wait_until(lambda: len(cluster.records("t.dlq")) == 1)
    try:
        # When the consumer closes (draining) and the acknowledgement never comes in time
        pc.close(drain=True, timeout=0.3)
    finally:
        producer.hold.clear()
    # Then the record is not committed: its next owner runs it again
    assert (_committed(cluster) or 0) == 0
    assert pc.statistics().records_dead_lettered == 0


def test_a_final_failure_is_logged_with_its_traceback_and_retries_only_at_debug(
    harness, cluster, wait_until, caplog
):
    # Given a record that fails twice and is then dead-lettered (max_retries=1)
    cluster.create_topic("t")
    cluster.produce("t", b"x")

    def parse_order(value: bytes) -> None:
        raise ValueError("bad order")

    pc = harness.make(Options(max_retries=1, retry_delay=0))
    pc.poll(lambda ctx: parse_order(ctx.value or b""))
    with caplog.at_level(logging.INFO, logger="parallel_consumer"):
        wait_until(lambda: len(_dead_letters(cluster)) == 1)
        pc.close()
    # Then the dead-lettering line carries the traceback (where it was raised) ...
    [final] = [r for r in caplog.records if "dead-lettered to t.dlq" in r.getMessage()]
    assert final.exc_info is not None
    assert "in parse_order" in caplog.text
    assert "after 2 failed attempts" in final.getMessage()
    # ... and the retry before it does not, with DEBUG off
    [retry] = [r for r in caplog.records if "retrying in" in r.getMessage()]
    assert retry.exc_info is None


def test_a_skip_after_exhausted_retries_says_why_once_and_counts_in_the_singular(
    harness, cluster, wait_until, caplog
):
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    pc = harness.make(Options(max_retries=0, on_retries_exhausted="skip"))
    pc.poll(lambda ctx: (_ for _ in ()).throw(ValueError("nope")))
    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        wait_until(lambda: _committed(cluster) == 1)
        pc.close()
    [line] = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert "skipped (retries-exhausted) after 1 failed attempt:" in line
