"""On a share group the ledger maps each record's outcome to an acknowledgement: accept once
it is done (processed, skipped, dead-lettered), release when another delivery should run it
(a retry: after its delay when short, at once when long), and ``ctx.attempts`` is the broker's
delivery count."""

from __future__ import annotations

from typing import Any

import pytest

from parallel_consumer import ConfigurationError, DeadLetter, Options, Skip
from parallel_consumer._events import Assignment, PartitionsAssigned, RecordsPolled
from parallel_consumer.engine.ledger import SHARE_HOLD_LIMIT, Ledger
from parallel_consumer.hooks import NoHooks
from parallel_consumer.testing import FakeClock
from parallel_consumer.work.inflight import Batch

TP = ("t", 0)


class Delivered:
    """A share consumer's record: its offset and how often the broker delivered it."""

    def __init__(self, offset: int, delivery_count: int = 1) -> None:
        self._offset = offset
        self._count = delivery_count

    def offset(self) -> int:
        return self._offset

    def partition(self) -> int:
        return TP[1]

    def topic(self) -> str:
        return TP[0]

    def key(self) -> bytes:
        return b"k%d" % self._offset

    def delivery_count(self) -> int:
        return self._count


def _ledger(**options: Any) -> tuple[Ledger, FakeClock]:
    clock = FakeClock()
    opts = Options(group_protocol="share", ordering="unordered", **options)
    ledger = Ledger(opts, clock, NoHooks())
    ledger.assign(PartitionsAssigned((Assignment(TP, 1, None, None, shared=True),)))
    return ledger, clock


def _run(ledger: Ledger, *messages: Delivered) -> list[Any]:
    """Poll ``messages`` and take each into a call."""
    ledger.on_records(RecordsPolled({TP: (1, list(messages))}))
    items = []
    while (item := ledger.shards.take({})) is not None:
        items.append(item)
    return items


def test_a_processed_record_is_accepted() -> None:
    ledger, _ = _ledger()
    [item] = _run(ledger, Delivered(5))
    ledger.settle(Batch(1, [item], 0.0), [None], 0.0)
    assert ledger.take_acks() == [(TP, 5, True)]
    assert ledger.partitions[TP].dirty is False  # (nothing to commit on a share group)


def test_attempts_are_the_broker_delivery_count_minus_one() -> None:
    ledger, _ = _ledger()
    first, third = _run(ledger, Delivered(1, delivery_count=1), Delivered(2, delivery_count=3))
    assert (first.attempts, third.attempts) == (0, 2)


def test_a_short_retry_is_held_and_released_once_due() -> None:
    ledger, clock = _ledger(max_retries=3, retry_delay=0.5)
    [item] = _run(ledger, Delivered(7))
    ledger.settle(Batch(1, [item], 0.0), [ValueError("transient")], clock.monotonic())
    assert ledger.take_acks() == []  # held for its delay
    assert ledger.pop_due_retries(clock.monotonic() + 0.4) == []
    assert ledger.take_acks() == []
    assert ledger.pop_due_retries(clock.monotonic() + 0.6) == []  # never run again here
    assert ledger.take_acks() == [(TP, 7, False)]
    assert 7 not in ledger.partitions[TP].incomplete


def test_a_long_retry_is_released_at_once() -> None:
    ledger, clock = _ledger(max_retries=3, retry_delay=SHARE_HOLD_LIMIT + 1)
    [item] = _run(ledger, Delivered(7))
    ledger.settle(Batch(1, [item], 0.0), [ValueError("transient")], clock.monotonic())
    assert ledger.take_acks() == [(TP, 7, False)]
    assert not ledger.retries


def test_a_redelivered_record_past_max_retries_goes_to_the_dead_letter_not_back() -> None:
    # Given a record the broker delivered for the third time (two members failed it)
    ledger, clock = _ledger(max_retries=2, retry_delay=0.1)
    [item] = _run(ledger, Delivered(9, delivery_count=3))
    # When it fails again
    ledger.settle(Batch(1, [item], 0.0), [ValueError("poison")], clock.monotonic())
    # Then it is due for its dead letter (written, then accepted), never released
    [(due, _, reason)] = ledger.take_letters_due()
    assert (due.offset, due.attempts, reason) == (9, 3, "retries-exhausted")
    assert ledger.take_acks() == []
    ledger.finish(due, ledger.partitions[TP])  # (what delivery does once the letter is written)
    assert ledger.take_acks() == [(TP, 9, True)]


def test_skip_is_accepted_and_dead_letter_is_due_at_once() -> None:
    ledger, clock = _ledger(max_retries=2, dead_letter_topic="dlq")
    skipped, lettered = _run(ledger, Delivered(1), Delivered(2))
    errors = [Skip("not mine"), DeadLetter("bad")]
    ledger.settle(Batch(1, [skipped, lettered], 0.0), errors, clock.monotonic())
    assert ledger.take_acks() == [(TP, 1, True)]
    assert [d[0].offset for d in ledger.take_letters_due()] == [2]


def test_non_retryable_goes_straight_to_the_dead_letter() -> None:
    ledger, clock = _ledger(max_retries=4, non_retryable=(KeyError,))
    [item] = _run(ledger, Delivered(3))
    ledger.settle(Batch(1, [item], 0.0), [KeyError("x")], clock.monotonic())
    assert [d[0].offset for d in ledger.take_letters_due()] == [3]
    assert ledger.take_acks() == []


def test_a_record_released_and_delivered_again_is_taken_again() -> None:
    ledger, clock = _ledger(max_retries=3, retry_delay=SHARE_HOLD_LIMIT + 1)
    [item] = _run(ledger, Delivered(4))
    ledger.settle(Batch(1, [item], 0.0), [ValueError("transient")], clock.monotonic())
    ledger.take_acks()
    [again] = _run(ledger, Delivered(4, delivery_count=2))
    assert again.attempts == 1


@pytest.mark.parametrize("ordering", ["key", "partition"])
def test_ordered_processing_on_a_share_group_is_refused(ordering: str) -> None:
    with pytest.raises(ConfigurationError, match="share group"):
        Options(group_protocol="share", ordering=ordering)


def test_transactions_on_a_share_group_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="no exactly-once"):
        Options(
            group_protocol="share",
            ordering="unordered",
            commit_mode="periodic_transactional_producer",
        )


def test_a_consumer_group_keeps_no_acknowledgements() -> None:
    ledger = Ledger(Options(), FakeClock(), NoHooks())
    assert ledger.acks is None
    assert ledger.take_acks() == []
