"""The transactional producer rides out a coordinator failover: a fatal error after the
transaction outlived ``transaction.timeout.ms`` (the new coordinator aborted it and bumped the
epoch), or an abort that fails, renews the producer instead of stopping for good; being fenced
by another instance with the same id still stops."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from parallel_consumer.kafka.producer import RENEWALS, Outputs, TransactionOutcome


class StubProducer:
    """The transactional calls of a producer, failing as told."""

    def __init__(self, commit_error: KafkaError | None = None) -> None:
        self.commit_error = commit_error
        self.abort_error: KafkaError | None = None
        self.calls: list[str] = []

    def init_transactions(self, timeout: float = -1) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self.calls.append("offsets")

    def commit_transaction(self, timeout: float = -1) -> None:
        self.calls.append("commit")
        if self.commit_error is not None:
            raise KafkaException(self.commit_error)

    def abort_transaction(self, timeout: float = -1) -> None:
        self.calls.append("abort")
        if self.abort_error is not None:
            raise KafkaException(self.abort_error)

    def poll(self, timeout: float = 0) -> int:
        return 0

    def purge(self) -> None:
        self.calls.append("purge")


FENCED = KafkaError(KafkaError._FENCED, "Producer fenced by newer instance", fatal=True)


def sending_offsets(offsets: list[Any], group_metadata: Any) -> Any:
    """What Transactions hands to Outputs.transact: the offsets sent on the producer given."""

    def send(producer: Any, timeout: float) -> None:
        producer.send_offsets_to_transaction(offsets, group_metadata, timeout)

    return send


def outputs_with(
    first: StubProducer, later: list[StubProducer], *, transaction_timeout: float
) -> Outputs:
    outputs = Outputs(
        first,
        post=lambda event: None,
        transactional=True,
        renew=lambda: later.pop(0),
        transaction_timeout=transaction_timeout,
    )
    first.init_transactions()
    outputs._begin()
    return outputs


def test_fenced_after_the_transaction_timed_out_renews_the_producer_and_aborts() -> None:
    # Given a transaction older than transaction.timeout.ms whose commit is fenced (what a new
    # coordinator does to a transaction that timed out during its failover)
    old, new = StubProducer(FENCED), StubProducer()
    outputs = outputs_with(old, [new], transaction_timeout=0.0)
    # When it commits
    outcome, reason = outputs.transact(None)
    # Then the old producer is dropped, a new one initialised with a transaction begun, and
    # the transaction counts as aborted (its inputs are processed again)
    assert outcome is TransactionOutcome.ABORTED
    assert "re-initialised" in reason
    assert old.calls[-1] == "purge"
    assert new.calls == ["init", "begin"]
    # and the next transaction goes through the new producer
    assert outputs.transact(None)[0] is TransactionOutcome.COMMITTED
    assert new.calls[-2:] == ["commit", "begin"]


def test_fenced_while_the_transaction_is_young_stops_for_good() -> None:
    # Given a transaction younger than its timeout: only another instance with the same
    # transactional.id can have fenced it
    old, new = StubProducer(FENCED), StubProducer()
    outputs = outputs_with(old, [new], transaction_timeout=60.0)
    outcome, reason = outputs.transact(None)
    assert outcome is TransactionOutcome.FATAL
    assert "fenced" in reason
    assert new.calls == []


def test_an_abort_that_fails_renews_the_producer_instead_of_stopping() -> None:
    # Given a commit that needs an abort, and an abort that fails (not fatally)
    old = StubProducer(KafkaError(KafkaError._STATE, "txn", txn_requires_abort=True))
    old.abort_error = KafkaError(KafkaError.INVALID_TXN_STATE, "invalid state")
    new = StubProducer()
    outputs = outputs_with(old, [new], transaction_timeout=60.0)
    outcome, reason = outputs.transact(None)
    assert outcome is TransactionOutcome.ABORTED
    assert "aborting failed too" in reason
    assert new.calls == ["init", "begin"]


def test_renewals_in_a_row_without_a_commit_stop_for_good_and_a_commit_resets_the_count() -> None:
    # Given producers that all fail their commits fatally, after the timeout
    failing = [StubProducer(FENCED) for _ in range(RENEWALS + 1)]
    outputs = outputs_with(failing[0], failing[1:], transaction_timeout=0.0)
    outcomes = [outputs.transact(None)[0] for _ in range(RENEWALS + 1)]
    # Then RENEWALS renewals are tried, and the next failure is fatal
    assert outcomes == [TransactionOutcome.ABORTED] * RENEWALS + [TransactionOutcome.FATAL]

    # And with a commit in between, the count starts again
    class CommitsOnce(StubProducer):
        def commit_transaction(self, timeout: float = -1) -> None:
            super().commit_transaction(timeout)
            self.commit_error = FENCED

    producers = [StubProducer(FENCED) for _ in range(RENEWALS)] + [CommitsOnce()]
    producers += [StubProducer(FENCED) for _ in range(RENEWALS - 1)] + [StubProducer()]
    outputs = outputs_with(producers[0], producers[1:], transaction_timeout=0.0)
    results = [outputs.transact(None)[0] for _ in range(2 * RENEWALS + 1)]
    assert TransactionOutcome.FATAL not in results
    assert results.count(TransactionOutcome.COMMITTED) == 1


def test_a_renewal_whose_init_keeps_failing_retriably_stops_with_the_reason() -> None:
    class NeverInits(StubProducer):
        def init_transactions(self, timeout: float = -1) -> None:
            self.calls.append("init")
            raise KafkaException(
                KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "loading", retriable=True)
            )

    never = NeverInits()
    outputs = outputs_with(StubProducer(FENCED), [never], transaction_timeout=0.0)
    outcome, reason = outputs.transact(None)
    assert outcome is TransactionOutcome.FATAL
    assert "could not be re-initialised" in reason
    assert never.calls.count("init") > 1


def test_offsets_that_time_out_abort_the_transaction_and_a_blocked_abort_renews() -> None:
    # Given sending the offsets times out, and the call goes on in the client, so that the
    # abort fails with _CONFLICT (as librdkafka does)
    class SlowOffsets(StubProducer):
        def send_offsets_to_transaction(self, *args: Any) -> None:
            self.calls.append("offsets")
            self.abort_error = KafkaError(KafkaError._CONFLICT, "offsets call in progress")
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True))

    producer, new = SlowOffsets(), StubProducer()
    outputs = outputs_with(producer, [new], transaction_timeout=10.0)
    # When the transaction commits with offsets
    outcome, reason = outputs.transact(sending_offsets(["an offset"], "group metadata"))
    # Then it is not committed without them: aborted, through a new producer
    assert outcome is TransactionOutcome.ABORTED
    assert "sending the offsets failed" in reason
    assert "commit" not in producer.calls
    assert producer.calls[-3:] == ["offsets", "abort", "purge"]
    assert new.calls == ["init", "begin"]


def test_a_fatal_error_on_the_delivery_thread_waits_for_the_renewal_instead_of_stopping() -> None:
    # Given a producer whose client reports a fatal error that a renewal cures (the epoch bump
    # after outputs timed out in a failover), on its delivery thread
    class FailsOnPoll(StubProducer):
        def poll(self, timeout: float = 0) -> int:
            self.calls.append("poll")
            raise KafkaException(
                KafkaError(KafkaError.INVALID_TXN_STATE, "invalid state", fatal=True)
            )

    events: list[object] = []
    old = FailsOnPoll(KafkaError(KafkaError.INVALID_TXN_STATE, "invalid state", fatal=True))
    new = StubProducer()
    new_polls: list[float] = []
    new.poll = lambda timeout=0: new_polls.append(timeout) or 0  # type: ignore[method-assign]
    outputs = Outputs(
        old,
        post=events.append,
        transactional=True,
        renew=lambda: new,
        transaction_timeout=60.0,
    )
    outputs.start()
    try:
        deadline = time.monotonic() + 5
        while old.calls.count("poll") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        # Then nothing stops the consumer; the poller's next commit renews the producer,
        # and the delivery thread serves the new one
        assert outputs.transact(None)[0] is TransactionOutcome.ABORTED
        while not new_polls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert new_polls
        assert events == []
    finally:
        outputs.close(abort=True)


def test_offsets_whose_call_blocks_past_its_deadline_renew_the_producer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a client whose send_offsets_to_transaction blocks far past its timeout (seen after
    # a group coordinator moved)
    import threading

    from parallel_consumer.kafka import producer as producer_module

    monkeypatch.setattr(producer_module, "STUCK_AFTER", 0.1)
    release = threading.Event()

    class Blocks(StubProducer):
        def send_offsets_to_transaction(self, *args: Any) -> None:
            self.calls.append("offsets")
            release.wait(10)

    blocked, new = Blocks(), StubProducer()
    outputs = outputs_with(blocked, [new], transaction_timeout=0.0)
    try:
        started = time.monotonic()
        outcome, reason = outputs.transact(sending_offsets(["an offset"], "group metadata"))
        # Then the wait ends at its deadline, and the producer is renewed
        assert time.monotonic() - started < 9
        assert outcome is TransactionOutcome.ABORTED
        assert "did not return" in reason
        assert new.calls == ["init", "begin"]
    finally:
        release.set()
