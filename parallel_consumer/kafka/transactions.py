"""Exactly-once on the poller thread: the open transaction of the library's producer commits
with the offsets of its inputs, or aborts and every partition starts again from its committed
offset.

The poller owns one :class:`Transactions` in transactional mode (``CommitMode.
PERIODIC_TRANSACTIONAL_PRODUCER``) and hands it every :class:`~parallel_consumer._events.
Transact` command. It works with the poller's client and :class:`AssignedPartitions` (same
thread) and posts the rewinds to the controller. See docs/exactly-once.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition as KafkaTopicPartition

from parallel_consumer._events import ControllerEvent, PartitionsAssigned, Transact
from parallel_consumer.errors import InternalError
from parallel_consumer.kafka import client_offsets
from parallel_consumer.kafka.assigned import AssignedPartitions
from parallel_consumer.kafka.commit_requests import split_live
from parallel_consumer.kafka.exact_commits import ExactCommits
from parallel_consumer.kafka.producer import Outputs, TransactionOutcome
from parallel_consumer.kafka.spill_store import SpillFailed, SpillStore
from parallel_consumer.work.commit_tracker import CommitAnswer, OffsetCommit
from parallel_consumer.work.item import TopicPartition

__all__ = ["Transactions"]

log = logging.getLogger("parallel_consumer")


class Transactions:
    """The transactions of ``outputs``, run on the poller thread."""

    def __init__(
        self,
        outputs: Outputs,
        consumer: Any,
        assigned: AssignedPartitions,
        post: Callable[[ControllerEvent], None],
        *,
        request_timeout: float,
        exact: ExactCommits | None = None,
        spill: SpillStore | None = None,
    ) -> None:
        self._outputs = outputs
        #: Sends the maps byte for byte when it can (``kafka/exact_commits.py``).
        self._exact = exact
        self._spill = spill
        self._consumer = consumer
        self._assigned = assigned
        self._post = post
        self._request_timeout = request_timeout

    def transact(self, command: Transact, revoking: frozenset[TopicPartition]) -> None:
        """Commit the open transaction with these offsets (see :class:`Transact`)."""
        outputs = self._outputs
        live, dropped = split_live(command.offsets, self._assigned.epochs)
        if command.abort:
            outcome, reason = outputs.abort(
                "an output of the transaction was not sent, or partitions with outputs in it "
                "were lost"
            )
        else:
            try:
                # Spilled maps join the open transaction: they commit (or abort) with it.
                refs = client_offsets.spill_references(self._spill, live, outputs.producer)
            except SpillFailed as exc:
                outcome, reason = outputs.abort(str(exc))
                if exc.permanent and outcome is TransactionOutcome.ABORTED:
                    outcome = TransactionOutcome.FATAL
            else:
                wire = client_offsets.on_the_wire(live, refs)
                outcome, reason = outputs.transact(self._offsets_sender(wire) if wire else None)
        if outcome is TransactionOutcome.COMMITTED:
            command.reply.set_result((*dropped, *(CommitAnswer(c) for c in live)))
            return
        if self._spill is not None:
            self._spill.forget()  # the side records of the transaction are aborted too
        if outcome is TransactionOutcome.ABORTED:
            # Outputs and offsets of the aborted transaction are gone, while the controller
            # counts their records as finished: start every partition again from its committed
            # offset (under a new epoch, so nothing of the old one is produced or committed).
            self._rewind(revoking)
            failure = f"transaction aborted ({reason}); processing again from the committed offset"
            command.reply.set_result((*dropped, *(CommitAnswer(c, failure) for c in live)))
            return
        command.reply.set_result(
            (*dropped, *(CommitAnswer(c, reason, permanent=True) for c in live))
        )
        if not live:
            # Nothing to carry the failure to the controller: stop through the poller instead.
            raise InternalError(reason)

    def _offsets_sender(self, live: list[OffsetCommit]) -> Callable[[Any, float], None]:
        """What adds ``live`` to the open transaction (see ``Outputs.transact``)."""

        def send(producer: Any, timeout: float) -> None:
            client_offsets.send_offsets_to_transaction(
                producer, self._consumer, self._exact, live, timeout
            )

        return send

    def abort(self, reason: str, revoking: frozenset[TopicPartition]) -> None:
        """Abort the open transaction (a revoke timed out: outputs of the revoked partitions
        may be in it, which must then not commit without their offsets) and start the
        partitions kept again."""
        outcome, why = self._outputs.abort(reason)
        if self._spill is not None:
            self._spill.forget()
        if outcome is TransactionOutcome.FATAL:
            raise InternalError(why)
        self._rewind(revoking)

    def _rewind(self, revoking: frozenset[TopicPartition]) -> None:
        """After an abort: seek every partition kept (not being revoked) back to its committed
        offset and post it as assigned again, under a new epoch. Partitions being revoked get a
        new epoch too, without an assignment: offsets the controller planned for them before it
        learnt of the abort (their records' outputs are gone) are then dropped, never
        committed."""
        epoch, first_seen = self._assigned.renew(revoking)
        if not first_seen:
            return
        # Strict (one attempt, its error raised): a rewind to a guessed offset would produce
        # outputs committed before again.
        read = client_offsets.read_committed(
            self._consumer, list(first_seen), self._request_timeout
        )
        assert read is not None
        committed = read[0]
        assignments = []
        for tp, first in first_seen.items():
            found = committed.get(tp)
            offset = found[0] if found is not None else first
            if offset is not None:
                self._consumer.seek(KafkaTopicPartition(tp[0], tp[1], offset))
            assignments.append(client_offsets.assignment(self._spill, tp, epoch, found))
        rewound = ", ".join(f"{t}[{p}]" for t, p in first_seen)
        log.warning("rewound %s to the committed offsets", rewound)
        self._post(PartitionsAssigned(tuple(assignments)))
