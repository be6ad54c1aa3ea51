"""Poller: the only code that touches the ``confluent_kafka.Consumer`` (thread ``<name>-poller``).

It fetches in batches, stamps each partition's records with its assignment epoch, posts them to
the controller, runs the commits and pause decisions the controller sends it, and handles the
rebalance callbacks, which the client runs inside ``consume()`` on this same thread.

Credit (``work/credit.py``): the poller never holds more than ``limit`` records in the engine.
Every record it posts takes one unit; the controller gives units back (``Release``) as records
leave. ``consume()`` asks for at most the remaining credit, so the bound holds exactly. When too
little credit is left the poller waits for some without calling the client, which keeps its
prefetched records (pausing would drop them and cost a fetch round trip on resume); only a wait
longer than ``STALL_PAUSE_AFTER`` pauses every partition so that ``consume()`` serves the group
protocol.

Commits carry the assignment epoch they were planned in. One whose partition was revoked (or
revoked and assigned again) before it is sent never reaches the client: a commit queued before a
revoke must not land after the revoke's final commit and move the group's offset back.

One commit request at a time, queued commits merged, late answers: decided by
``kafka/commit_requests.py``, carried out on the client by ``kafka/client_offsets.py``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from parallel_consumer._events import (
    Commit,
    ControllerEvent,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
    PollerCommand,
    PollerFailed,
    PositionsReached,
    RecordsPolled,
    RecordUnreadable,
    Release,
    SetPaused,
    StopPoller,
    Transact,
)
from parallel_consumer.kafka import client_offsets
from parallel_consumer.kafka.access import is_refusal
from parallel_consumer.kafka.assigned import AssignedPartitions, Batches
from parallel_consumer.kafka.client_log import ClientLog
from parallel_consumer.kafka.client_offsets import CommitClient
from parallel_consumer.kafka.client_pauses import ClientPauses
from parallel_consumer.kafka.committed_reader import CommittedReader
from parallel_consumer.kafka.producer import Outputs
from parallel_consumer.kafka.spill_store import SpillStore
from parallel_consumer.kafka.topic_check import MissingTopics
from parallel_consumer.kafka.transactions import Transactions
from parallel_consumer.status import PollerStatistics
from parallel_consumer.work.credit import Credit
from parallel_consumer.work.item import TopicPartition

__all__ = ["Poller", "RebalanceCallback"]

log = logging.getLogger("parallel_consumer")

RebalanceCallback = Callable[[Any, list[Any]], object]
#: What the poller publishes for other threads (see Poller.statistics): held, assigned,
#: paused, last poll, stalled since, commit sent at, commits queued, all brokers down since.
_Snapshot = tuple[int, int, int, float | None, float | None, float | None, int, float | None]

#: How long one consume() blocks when nothing arrives: bounds the latency of commands. A
#: command cannot wake a consume() in progress, so this is also how long a commit may wait
#: to be sent.
POLL_TIMEOUT = 0.05
#: The same while a commit is on its way, and while the engine holds records and records came
#: or left within BUSY_FOR (a commit is coming): the commit after the last records of a burst
#: goes out within this, not up to POLL_TIMEOUT later.
BUSY_POLL_TIMEOUT = 0.005
#: How long after records were handed over or given back the poller counts as busy. A
#: consume() that returns nothing costs about 30 us of this thread here: a consumer that holds
#: records nobody finishes (a hung handler, long calls) goes back to POLL_TIMEOUT after this.
BUSY_FOR = 1.0
#: How long the poller may wait for credit without calling ``consume()``. Past it, every
#: partition is paused so that ``consume()`` can serve rebalances and commit answers again.
STALL_PAUSE_AFTER = 1.0
#: How long a revoke waits for the controller's final commit of the revoked partitions.
REVOKE_TIMEOUT = 10.0
#: How long one committed() request (on assignment) may take before the attempt counts as failed.
#: Commits have no timeout of ours: the client's own request timeouts apply.
REQUEST_TIMEOUT = 10.0
#: An asynchronous commit the client has not answered after this long counts as lost (failed:
#: the controller sends its offsets again), and the commits waiting behind it go out. The client
#: answers every request (within its own time-outs and retries); this only bounds a wait for an
#: answer that can no longer be matched to its request.
COMMIT_ANSWER_TIMEOUT = 5.0


class Poller:
    """Owns the Kafka consumer. Every method except :meth:`send`, :meth:`join`,
    :meth:`statistics` and the set-up calls runs on the poller thread."""

    def __init__(
        self,
        consumer_factory: Callable[[dict[str, Any]], Any],
        config: dict[str, Any],
        *,
        post: Callable[[ControllerEvent], None],
        limit: int,
        fetch_batch: int,
        name: str = "pc",
        spill: SpillStore | None = None,
    ) -> None:
        #: Epochs and what was handed over per partition; records held back beyond the credit.
        self._assigned = AssignedPartitions()
        #: The client's log lines and errors, and whether all brokers are down.
        self._client_log = ClientLog(f"{name} consumer", str(config.get("bootstrap.servers")))
        # Built on the caller's thread so that configuration errors surface at construction;
        # from start() on only the poller thread touches it.
        self._consumer = consumer_factory(
            self._client_log.configure({**config, "on_commit": self._on_commit})
        )
        #: One commit request at a time, decided and carried out on the client.
        #: The side topic of offset maps over the metadata limit (None: they never spill).
        self._spill = spill
        self._commits = CommitClient(self._consumer, self._assigned, spill, name=name)
        #: Reads committed metadata with its exact length (``kafka/committed_reader.py``),
        #: through a handle of its own made from the same configuration: only for a real client.
        self._exact_reader = (
            CommittedReader(config, name=name) if isinstance(self._consumer, Consumer) else None
        )
        self._subscription: list[str] = []
        #: Subscriptions that match no topic of the cluster (a typo looks like an idle consumer).
        self._missing = MissingTopics(())
        self._probe_topic: str | None = None
        self._post = post
        self._fetch_batch = fetch_batch
        self._user_on_assign: RebalanceCallback | None = None
        self._user_on_revoke: RebalanceCallback | None = None
        self._commands: queue.SimpleQueue[PollerCommand] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"{name}-poller", daemon=True)
        # Owned by the poller thread:
        self._credit = Credit(limit, fetch_batch)
        #: Which partitions the client should have paused; the wait for credit.
        self._pauses = ClientPauses()
        #: Until when consume() waits only BUSY_POLL_TIMEOUT (records came or left recently).
        self._busy_until = 0.0
        #: When the positions are next read after a consume() that returned nothing.
        self._next_positions = 0.0
        self._last_poll: float | None = None
        self._stopping = False
        #: Runs the transactions of the library's producer (transactional mode only).
        self._transactions: Transactions | None = None
        #: Partitions being revoked right now (inside the revoke callback).
        self._revoking: frozenset[TopicPartition] = frozenset()
        #: The latest snapshot for other threads: replaced whole, never changed in place.
        self._published: _Snapshot = (0, 0, 0, None, None, None, 0, None)

    # -- called from other threads ------------------------------------------------------------

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None,
        on_revoke: RebalanceCallback | None,
    ) -> None:
        """Set what to subscribe to once started (before :meth:`start`)."""
        self._subscription = topics
        self._missing = MissingTopics(topics)
        #: What a probe for a broker asks metadata of (see ClientLog.probe): one topic, not all.
        self._probe_topic = next((t for t in topics if not t.startswith("^")), None)
        self._user_on_assign = on_assign
        self._user_on_revoke = on_revoke

    def run_transactions(self, outputs: Outputs) -> None:
        """Run the transactions of ``outputs`` (before :meth:`start`)."""
        self._transactions = Transactions(
            outputs,
            self._consumer,
            self._assigned,
            self._post,
            request_timeout=REQUEST_TIMEOUT,
            exact=self._commits.exact,
            spill=self._spill,
        )

    def start(self) -> None:
        self._thread.start()

    def close_unstarted(self) -> None:
        """Close the client of a poller that was never started (on the caller's thread)."""
        if not self._thread.is_alive() and self._thread.ident is None:
            self._consumer.close()

    def send(self, command: PollerCommand) -> None:
        """Queue a command (thread-safe); it runs before the next ``consume()``."""
        self._commands.put(command)

    def join(self, timeout: float) -> bool:
        if self._thread.ident is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def statistics(self) -> PollerStatistics:
        """A snapshot of the poller's side (any thread): what it published last."""
        held, assigned, paused, last_poll, stalled_since, commit_sent, queued, down_since = (
            self._published
        )
        now = time.monotonic()
        limit = self._credit.limit
        return PollerStatistics(
            held=held,
            limit=limit,
            credit=limit - held,
            assigned_partitions=assigned,
            paused_partitions=paused,
            since_last_poll=None if last_poll is None else now - last_poll,
            waiting_for_credit=None if stalled_since is None else now - stalled_since,
            commit_unanswered_for=None if commit_sent is None else now - commit_sent,
            commits_queued=queued,
            brokers_down_for=None if down_since is None else now - down_since,
            missing_topics=(missing := self._missing).missing,
            missing_topics_for=None if missing.since is None else now - missing.since,
            access_refused=self._client_log.refusals.texts,
        )

    # -- the poller thread --------------------------------------------------------------------

    def _assert_owner(self) -> None:
        owner = self._thread.ident
        if owner is not None and owner != threading.get_ident():
            raise RuntimeError(
                f"the Kafka consumer belongs to {self._thread.name}; "
                f"{threading.current_thread().name} must send it commands instead"
            )

    def _publish(self) -> None:
        self._published = (
            self._credit.held,
            len(self._assigned.epochs),
            len(self._pauses.paused),
            self._last_poll,
            self._pauses.stalled_since,
            None if (sent := self._commits.requests.unanswered) is None else sent.sent_at,
            self._commits.requests.queued,
            self._client_log.down_since,
        )

    def _run(self) -> None:
        consumer = self._consumer
        credit = self._credit
        assigned = self._assigned
        try:
            consumer.subscribe(
                self._subscription,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
            while not self._stopping:
                self._run_commands()
                self._send_queued()
                if assigned.overflow:
                    self._post_batches(*assigned.release(credit.available))
                self._publish()
                if self._stopping:
                    break
                if (assigned.overflow or not credit.can_fetch()) and self._wait_for_credit():
                    continue
                self._apply_pauses()
                self._client_log.probe(consumer, self._probe_topic)
                self._missing.check(consumer, time.monotonic())
                self._last_poll = time.monotonic()
                busy = self._commits.requests.waiting or (
                    credit.held and self._last_poll < self._busy_until
                )
                messages = consumer.consume(
                    num_messages=max(1, min(self._fetch_batch, credit.available)),
                    timeout=BUSY_POLL_TIMEOUT if busy else POLL_TIMEOUT,
                )
                if messages:
                    self._busy_until = self._last_poll + BUSY_FOR
                    self._client_log.reachable()
                    self._hand_over(messages)
                    self._report_positions()
                elif self._last_poll >= self._next_positions:
                    # After an empty consume(), at most every POLL_TIMEOUT: such turns may come
                    # every BUSY_POLL_TIMEOUT, and this asks the client about every partition.
                    self._next_positions = self._last_poll + POLL_TIMEOUT
                    self._report_positions()
        except BaseException as exc:
            log.error("poller failed", exc_info=True)
            self._post(PollerFailed(exc))
        finally:
            self._stopping = True
            self._commits.close("the consumer closed before the commit was answered")
            self._publish()
            try:
                consumer.close()
            except Exception:
                log.warning("closing the Kafka consumer failed", exc_info=True)
            if self._exact_reader is not None:
                self._exact_reader.close()
            if self._spill is not None:
                try:
                    self._spill.close()
                except Exception:
                    log.warning("closing the offset map clients failed", exc_info=True)

    def _wait_for_credit(self) -> bool:
        """Too little credit: wait for the controller to return some, without touching the client,
        so that it keeps what it prefetched (a pause would drop it). True if the caller should
        loop again; False once the wait has lasted STALL_PAUSE_AFTER, from when on every
        partition is paused and ``consume()`` serves the group protocol and callbacks."""
        if not self._pauses.waiting(time.monotonic(), STALL_PAUSE_AFTER):
            return False
        try:
            command = self._commands.get(timeout=POLL_TIMEOUT)
        except queue.Empty:
            return True
        self._run_command(command)
        return True

    def _run_commands(self) -> None:
        commands = self._commands
        while not self._stopping:
            try:
                command = commands.get_nowait()
            except queue.Empty:
                return
            self._run_command(command)

    def _run_command(self, command: PollerCommand) -> None:
        self._assert_owner()
        if isinstance(command, Release):
            credit = self._credit
            credit.give_back(command.count)
            self._busy_until = time.monotonic() + BUSY_FOR
            if credit.can_fetch():
                self._pauses.credit_back()
        elif isinstance(command, Commit):
            self._commits.commit(command, self._revoking)
        elif isinstance(command, Transact):
            assert self._transactions is not None, "Transact needs run_transactions()"
            self._transactions.transact(command, self._revoking)
        elif isinstance(command, SetPaused):
            self._pauses.wanted = command.tps
        elif isinstance(command, StopPoller):
            self._stopping = True

    def _hand_over(self, messages: Sequence[Any]) -> None:
        """Deliver what ``consume()`` returned (see AssignedPartitions.split and admit)."""
        assigned = self._assigned
        batches, count, errors = assigned.split(messages)
        for error, message in errors:
            self._client_error(error, message)
        if count:
            self._post_batches(*assigned.admit(batches, count, self._credit.available))

    def _post_batches(self, batches: Batches, count: int) -> None:
        if not count:
            return
        self._assigned.handed_over(batches)
        self._credit.take(count)
        self._post(RecordsPolled(batches))

    def _report_positions(self) -> None:
        """Tell the controller when the client has read past the last delivered record (see
        AssignedPartitions.reached)."""
        epochs = self._assigned.epochs
        if not epochs:
            return
        request = [KafkaTopicPartition(t, p) for t, p in epochs]
        answers = self._consumer.position(request)
        changed = self._assigned.reached(((a.topic, a.partition), a.offset) for a in answers)
        if changed:
            self._post(PositionsReached(changed))

    def _client_error(self, error: Any, message: Any) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if error.fatal():
            raise KafkaException(error)
        tp = (message.topic(), message.partition())
        offset = message.offset()
        if is_refusal(error.code()):
            # A missing ACL on the group or a topic: nothing is read meanwhile, and nothing
            # committed; the client asks again, and an assignment or records end it.
            self._client_log.refused(error, "READ", message.topic())
            return
        if tp in self._assigned.epochs and offset is not None and offset >= 0:
            # A record the client cannot deliver (corrupt, too large, ...). Skipping it would
            # let a later commit pass it unprocessed: stop instead, and say where.
            self._post(RecordUnreadable(tp, offset, str(error)))
            self._stopping = True
            return
        log.warning("Kafka client reported: %s", error)

    def _apply_pauses(self) -> None:
        to_pause, to_resume = self._pauses.changes(self._assigned.epochs.keys())
        if to_pause:
            self._consumer.pause([KafkaTopicPartition(t, p) for t, p in to_pause])
        if to_resume:
            self._consumer.resume([KafkaTopicPartition(t, p) for t, p in to_resume])

    # -- commits (carried out by CommitClient) -----------------------------------------------

    def _send_queued(self) -> None:
        """Send the commits that waited, once the request before them is answered (or counts
        as lost)."""
        self._commits.turn(time.monotonic(), COMMIT_ANSWER_TIMEOUT)

    def _on_commit(self, error: Any, partitions: list[Any]) -> None:
        """The client's ``on_commit`` callback (served inside ``consume()`` on this thread)."""
        self._commits.on_commit(error, partitions)

    # -- rebalance callbacks (inside consume(), on this thread) --------------------------------

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._assert_owner()
        self._client_log.reachable()  # (the group coordinator answered)
        tps = [(p.topic, p.partition) for p in partitions]
        read = client_offsets.read_committed(
            self._consumer, tps, REQUEST_TIMEOUT, exact_reader=self._exact_reader, attempts=3
        )
        if read is None:
            log.warning(
                "could not read committed offsets of %s: finished records above the committed "
                "offset will be processed again",
                _names(partitions),
            )
        committed, exact = read or ({}, False)
        epoch = self._assigned.assign(tps)
        assignments = []
        for tp in tps:
            found = committed.get(tp)
            assignment = client_offsets.assignment(self._spill, tp, epoch, found, exact=exact)
            assignments.append(assignment)
        log.info("assigned %s", _names(partitions))
        self._post(PartitionsAssigned(tuple(assignments)))
        self._call_user(self._user_on_assign, consumer, partitions)

    def _forget(self, partitions: list[Any]) -> tuple[TopicPartition, ...]:
        """Drop the poller's per-partition state of partitions leaving the assignment."""
        tps = tuple((p.topic, p.partition) for p in partitions)
        self._resume_leaving(tps)
        self._assigned.forget(tps)
        if self._spill is not None:
            self._spill.forget(tps)
        return tps

    def _resume_leaving(self, tps: tuple[TopicPartition, ...]) -> None:
        """Resume the paused partitions of ``tps`` before they leave the assignment (see
        ClientPauses.leaving): a partition handed back comes back fresh, as in the Java client."""
        paused = self._pauses.leaving(tps)
        if not paused:
            return
        try:
            self._consumer.resume([KafkaTopicPartition(t, p) for t, p in paused])
        except KafkaException as exc:  # (a lost partition may be gone from the client already)
            log.debug("resuming %s as they leave the assignment failed: %s", paused, exc)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._assert_owner()
        log.info("revoked %s", _names(partitions))
        if not self._stopping:
            tps = tuple((p.topic, p.partition) for p in partitions)
            self._revoking = frozenset(tps)
            reply: Future[None] = Future()
            self._post(PartitionsRevoked(tps, reply))
            # Run what the controller sends meanwhile (commits queued earlier, then the final
            # commit of these partitions, sent before it answers), while they are still ours.
            deadline = time.monotonic() + REVOKE_TIMEOUT
            while not reply.done() and time.monotonic() < deadline:
                try:
                    command = self._commands.get(timeout=POLL_TIMEOUT)
                except queue.Empty:
                    continue
                self._run_command(command)
            if reply.done():
                # Everything queued so far, even after a StopPoller: the final commit is in it.
                while True:
                    try:
                        command = self._commands.get_nowait()
                    except queue.Empty:
                        break
                    self._run_command(command)
            else:
                log.warning(
                    "no final commit for revoked %s within %.0fs; records finished since the "
                    "last commit will be processed again by the next owner",
                    _names(partitions),
                    REVOKE_TIMEOUT,
                )
                if self._transactions is not None:
                    self._transactions.abort("a revoke timed out", self._revoking)
        self._revoking = frozenset()
        self._forget(partitions)
        self._call_user(self._user_on_revoke, consumer, partitions)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        tps = self._forget(partitions)
        log.warning("lost %s without a final commit", _names(partitions))
        self._post(PartitionsLost(tps))
        self._call_user(self._user_on_revoke, consumer, partitions)

    def _call_user(
        self, callback: RebalanceCallback | None, consumer: Any, parts: list[Any]
    ) -> None:
        if callback is None:
            return
        try:
            callback(consumer, parts)
        except Exception:
            log.error("user rebalance callback %r failed", callback, exc_info=True)

    def __repr__(self) -> str:
        return (
            f"<Poller assigned={len(self._assigned.epochs)} paused={len(self._pauses.paused)} "
            f"{self._credit!r}{' stopping' if self._stopping else ''}>"
        )


def _names(partitions: list[Any]) -> str:
    return ", ".join(f"{p.topic}[{p.partition}]" for p in partitions) or "nothing"
