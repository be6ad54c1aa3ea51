"""Delivery.dead_letter, the seam other policies (on_stall=DEAD_LETTER) call: a record
waiting for its retry is taken out of the retry queue, dead-lettered, and committed only once
the write is acknowledged. The controller is stepped by hand (no controller thread)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from doubles import IdleRunner, StuckPoller

from parallel_consumer import Options, PollContext
from parallel_consumer import dead_letter as dl
from parallel_consumer._events import Assignment, PartitionsAssigned, RecordsPolled, WorkDone
from parallel_consumer.engine.controller import Controller
from parallel_consumer.engine.letters import DeadLetters
from parallel_consumer.kafka.committers import ConsumerCommitter
from parallel_consumer.kafka.producer import Outputs
from parallel_consumer.testing.clock import FakeClock
from parallel_consumer.testing.fakes import FakeCluster


class RecordingRunner(IdleRunner):
    capacity = 4

    def __init__(self) -> None:
        self.submitted: list[tuple[int, PollContext]] = []

    def submit(self, batch: int, context: PollContext) -> None:
        self.submitted.append((batch, context))


@pytest.fixture
def stepped() -> Iterator[tuple[Controller, RecordingRunner, FakeCluster, FakeClock]]:
    clock = FakeClock()
    cluster = FakeCluster()
    cluster.create_topic("t")
    cluster.create_topic("t.dlq")
    options = Options(max_retries=10, retry_delay=1000)
    poller = StuckPoller()
    runner = RecordingRunner()
    controller = Controller(
        options,
        runner=runner,
        poller=poller,
        committer=ConsumerCommitter(poller, options.commit_mode),
        clock=clock,
    )
    outputs = Outputs(cluster.producer({}), post=controller.post, transactional=False, name="seam")
    outputs.start()
    try:
        controller.start(
            lambda ctx: None,
            thread=False,
            outputs=outputs,
            produces=False,
            dead_letters=DeadLetters(options, "g"),
        )
        controller.post(PartitionsAssigned((Assignment(("t", 0), 1, None, None),)))
        yield controller, runner, cluster, clock
    finally:
        outputs.close(abort=False)


def _step_until(controller: Controller, condition: Any) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        controller.run_once(block=True)


def test_a_record_waiting_for_its_retry_is_dead_lettered_and_then_committed(stepped) -> None:
    controller, runner, cluster, clock = stepped
    # Given a record that failed once and waits 1000 s for its retry
    cluster.produce("t", b"v", key=b"k")
    controller.post(RecordsPolled({("t", 0): (1, cluster.records("t"))}))
    controller.run_once(block=False)
    [(batch, _)] = runner.submitted
    controller.post(WorkDone(batch, (ValueError("slow"),), None, clock.monotonic()))
    controller.run_once(block=False)
    assert controller.statistics().retry_waiting == 1
    [item] = [entry[2] for entry in controller.ledger.retries._heap]

    # When a policy dead-letters it now
    controller.delivery.dead_letter(item, item.last_failure, dl.Reason.STALLED)

    # Then it leaves the retry queue at once and is done once the write is acknowledged
    assert controller.statistics().retry_waiting == 0
    _step_until(controller, lambda: controller.statistics().records_dead_lettered == 1)
    [letter] = cluster.records("t.dlq")
    info = dl.read_dead_letter(letter.headers())
    assert info is not None
    assert (info.offset, info.attempts, info.reason, info.error_message) == (
        0,
        1,
        dl.Reason.STALLED,
        "slow",
    )
    snapshot = controller.statistics().partitions[0]
    assert snapshot.incomplete == 0
    assert snapshot.highest_succeeded == 0
    # and it never runs again
    clock.advance(2000)
    controller.run_once(block=False)
    assert len(runner.submitted) == 1


def test_a_failed_write_of_a_dead_letter_now_keeps_the_record_incomplete(stepped) -> None:
    controller, runner, cluster, clock = stepped
    cluster.produce("t", b"v", key=b"k")
    controller.post(RecordsPolled({("t", 0): (1, cluster.records("t"))}))
    controller.run_once(block=False)
    [(batch, _)] = runner.submitted
    controller.post(WorkDone(batch, (ValueError("slow"),), None, clock.monotonic()))
    controller.run_once(block=False)
    [item] = [entry[2] for entry in controller.ledger.retries._heap]
    cluster.delete_topic("t.dlq")

    controller.delivery.dead_letter(item, item.last_failure, dl.Reason.STALLED)

    _step_until(controller, lambda: controller.statistics().dead_letter_failures == 1)
    stats = controller.statistics()
    assert stats.partitions[0].incomplete == 1
    assert stats.retry_waiting == 1  # waiting to be written again, not to run again
    cluster.create_topic("t.dlq")
    clock.advance(1.5)
    _step_until(controller, lambda: controller.statistics().records_dead_lettered == 1)
    assert len(runner.submitted) == 1
    assert controller.statistics().partitions[0].incomplete == 0


def test_a_subscribed_topic_that_does_not_exist_gets_no_dead_letter_topic(harness, cluster, caplog):
    # Given dead-lettering on, one real topic and one misspelled subscription
    cluster.create_topic("orders")
    with caplog.at_level("WARNING", logger="parallel_consumer"):
        pc = harness.make(Options(max_retries=1), topics=("orders", "ordres"))
        pc.poll(lambda ctx: None)
        pc.close()
    # Then only the real topic's dead-letter topic was created, and the typo is named
    assert "orders.dlq" in cluster._topics()
    assert "ordres.dlq" not in cluster._topics()
    assert "subscribed topic 'ordres' does not exist" in caplog.text
