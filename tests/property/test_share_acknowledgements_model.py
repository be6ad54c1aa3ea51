"""The ledger's acknowledgements on a share group, driven through any mix of outcomes: every
delivery of a record ends in exactly one acknowledgement (accept, or release for another
delivery), a record is accepted once, and one that keeps failing is dead-lettered on exactly
its ``max_retries + 1``-th delivery, never released past it (docs/share-groups.md)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from parallel_consumer import DeadLetter, Options, Skip
from parallel_consumer._events import Assignment, PartitionsAssigned, RecordsPolled
from parallel_consumer.engine.ledger import SHARE_HOLD_LIMIT, Ledger
from parallel_consumer.hooks import NoHooks
from parallel_consumer.testing import FakeClock
from parallel_consumer.work.inflight import Batch

TP = ("t", 0)
#: The broker's share.delivery.count.limit (its default).
LIMIT = 5


class Delivered:
    def __init__(self, offset: int, delivery_count: int) -> None:
        self._offset, self._count = offset, delivery_count

    def offset(self) -> int:
        return self._offset

    def partition(self) -> int:
        return TP[1]

    def topic(self) -> str:
        return TP[0]

    def key(self) -> bytes:
        return b"k"

    def headers(self) -> None:
        return None

    def delivery_count(self) -> int:
        return self._count


OUTCOMES = st.sampled_from(["ok", "fail", "fail", "skip", "dead-letter"])


@settings(max_examples=150, deadline=None)
@given(
    records=st.integers(1, 12),
    max_retries=st.integers(0, LIMIT - 1),
    long_delay=st.booleans(),
    outcomes=st.lists(OUTCOMES, min_size=1, max_size=200),
    letters_fail=st.lists(st.booleans(), max_size=50),
)
def test_every_delivery_ends_in_one_acknowledgement(
    records: int,
    max_retries: int,
    long_delay: bool,
    outcomes: list[str],
    letters_fail: list[bool],
) -> None:
    clock = FakeClock()
    delay = SHARE_HOLD_LIMIT + 1 if long_delay else 0.5
    options = Options(
        group_protocol="share", ordering="unordered", max_retries=max_retries, retry_delay=delay
    )
    ledger = Ledger(options, clock, NoHooks())
    ledger.assign(PartitionsAssigned((Assignment(TP, 1, None, None, shared=True),)))
    deliveries = Counter(dict.fromkeys(range(records), 1))
    accepted: Counter[int] = Counter()
    lettered: dict[int, int] = {}
    archived: set[int] = set()
    letter_failed: set[int] = set()
    acked_deliveries: Counter[tuple[int, int]] = Counter()
    next_outcome = itertools.cycle(outcomes)
    next_letter = iter(letters_fail + [False] * 1000)
    ledger.on_records(RecordsPolled({TP: (1, [Delivered(o, 1) for o in range(records)])}))
    for _ in range(2_000):
        items = []
        while (item := ledger.shards.take({})) is not None:
            items.append(item)
        if items:
            errors: list[Any] = []
            for _ in items:
                outcome = next(next_outcome)
                errors.append(
                    None
                    if outcome == "ok"
                    else ValueError("x")
                    if outcome == "fail"
                    else Skip("s")
                    if outcome == "skip"
                    else DeadLetter("d")
                )
            ledger.settle(Batch(1, items, 0.0), errors, clock.monotonic())
        for item, _, _ in ledger.take_letters_due():
            # (what delivery does: the letter written, accept; its write failed, release)
            if next(next_letter):
                letter_failed.add(item.offset)
                ledger.release(item)
            else:
                lettered[item.offset] = item.message.delivery_count()
                ledger.finish(item, ledger.partitions[TP])
        clock.advance(0.25)
        ledger.pop_due_retries(clock.monotonic())
        redeliver = []
        for tp, offset, accept in ledger.take_acks():
            assert tp == TP
            acked_deliveries[(offset, deliveries[offset])] += 1
            if accept:
                accepted[offset] += 1
            elif deliveries[offset] >= LIMIT:
                archived.add(offset)  # (the broker's delivery limit: no further delivery)
            else:
                deliveries[offset] += 1
                redeliver.append(Delivered(offset, deliveries[offset]))
        if redeliver:
            ledger.on_records(RecordsPolled({TP: (1, redeliver)}))
        if len(accepted) + len(archived) == records and not ledger.retries:
            break
    # Every delivery ended in exactly one acknowledgement; a record is accepted at most once
    assert all(n == 1 for n in acked_deliveries.values()), acked_deliveries
    assert all(n == 1 for n in accepted.values()), accepted
    # Every record ended: accepted, or (only when its dead letter could not be written on its
    # last delivery) archived by the broker
    assert set(accepted) | archived == set(range(records))
    # A record dead-lettered (its letter written at once) was delivered at most max_retries + 1
    # times: a retry never outlives the broker's count
    assert all(n <= max_retries + 1 for o, n in lettered.items() if o not in letter_failed)
    # Only a record whose dead letter could not be written is released at its last delivery
    assert archived <= letter_failed, (archived, letter_failed)
