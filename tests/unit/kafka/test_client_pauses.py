"""Which partitions the poller has the client pause (kafka/client_pauses.py)."""

from __future__ import annotations

from parallel_consumer.kafka.client_pauses import ClientPauses

T0, T1, T2 = ("t", 0), ("t", 1), ("t", 2)


def test_the_partitions_the_controller_wants_paused_are_paused_and_resumed_once():
    pauses = ClientPauses()
    pauses.wanted = frozenset({T0, T2})

    assert pauses.changes({T0, T1}) == ({T0}, set()), "T2 is not assigned"
    assert pauses.changes({T0, T1}) == (set(), set()), "nothing changed"
    pauses.wanted = frozenset()
    assert pauses.changes({T0, T1}) == (set(), {T0})


def test_a_long_wait_for_credit_pauses_every_partition_until_credit_returns():
    pauses = ClientPauses()

    assert pauses.waiting(10.0, pause_after=1.0), "a short wait goes on without the client"
    assert pauses.waiting(10.5, pause_after=1.0)
    assert not pauses.waiting(11.0, pause_after=1.0)
    assert pauses.changes({T0, T1}) == ({T0, T1}, set())

    pauses.credit_back()
    assert pauses.changes({T0, T1}) == (set(), {T0, T1})


def test_paused_partitions_leaving_the_assignment_are_resumed_first():
    pauses = ClientPauses()
    pauses.wanted = frozenset({T0, T1})
    pauses.changes({T0, T1, T2})

    assert pauses.leaving([T1, T2]) == [T1]
    assert pauses.paused == {T0}
