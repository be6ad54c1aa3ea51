"""What the poller holds per partition (kafka/assigned.py), without a client: epochs, records
held back beyond the credit, positions past the last record handed over."""

from __future__ import annotations

from confluent_kafka import Message

from parallel_consumer.kafka.assigned import AssignedPartitions

T0, T1 = ("t", 0), ("t", 1)


def _records(tp: tuple[str, int], *offsets: int) -> list[Message]:
    return [Message(topic=tp[0], partition=tp[1], offset=o) for o in offsets]


def _offsets(batches: dict) -> dict:
    return {tp: [m.offset() for m in batch] for tp, (_, batch) in batches.items()}


def test_records_beyond_the_credit_wait_in_order_until_credit_returns():
    assigned = AssignedPartitions()
    assigned.assign([T0, T1])
    batches, count, errors = assigned.split(_records(T0, 1, 2, 3) + _records(T1, 7))
    assert (count, errors) == (4, [])

    admitted, admitted_count = assigned.admit(batches, count, available=2)

    assert (_offsets(admitted), admitted_count) == ({T0: [1, 2]}, 2)
    later, later_count = assigned.release(available=10)
    assert (_offsets(later), later_count) == ({T0: [3], T1: [7]}, 2)
    assert not assigned.overflow


def test_a_rewind_gives_every_partition_a_new_epoch_and_starts_delivery_again():
    assigned = AssignedPartitions()
    first_epoch = assigned.assign([T0, T1])
    batches, _, _ = assigned.split(_records(T0, 5, 6) + _records(T1, 9))
    assigned.handed_over(batches)

    epoch, first_seen = assigned.renew(revoking=frozenset({T1}))

    assert epoch > first_epoch
    assert first_seen == {T0: 5}, "only partitions kept start again"
    assert assigned.epochs == {T0: epoch, T1: epoch}
    assert T0 not in assigned.delivered_to


def test_a_position_past_the_last_record_handed_over_is_reported_once():
    assigned = AssignedPartitions()
    epoch = assigned.assign([T0])
    batches, _, _ = assigned.split(_records(T0, 3))
    assigned.handed_over(batches)

    assert assigned.reached([(T0, 4)]) == (), "no gap: 4 is one past the last record"
    assert assigned.reached([(T0, 6)]) == ((T0, epoch, 6),)
    assert assigned.reached([(T0, 6)]) == ()


def test_records_of_a_partition_not_held_are_dropped():
    assigned = AssignedPartitions()
    assigned.assign([T0])
    assigned.forget([T0])

    batches, count, _ = assigned.split(_records(T0, 1, 2))

    assert (batches, count) == ({}, 0)
