"""Poller: the only code that touches the ``confluent_kafka.Consumer`` (thread ``<name>-poller``).

It fetches in batches, stamps each partition's records with its assignment epoch, posts them to
the controller, runs the commits and pause decisions the controller sends it, and handles the
rebalance callbacks, which the client runs inside ``consume()`` on this same thread.

Credit: the poller never holds more than ``limit`` records in the engine. Every record it posts
uses one credit; the controller returns credit (``Release``) as records leave. ``consume()`` asks
for at most the remaining credit, so the bound holds exactly. When no credit is left the poller
waits for some without calling the client, which keeps its prefetched records (pausing would
drop them and cost a fetch round trip on resume); only a stall longer than
``STALL_PAUSE_AFTER`` pauses every partition so that ``consume()`` serves the group protocol.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from parallel_consumer._events import (
    Assignment,
    Commit,
    CommitResult,
    ControllerEvent,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
    PollerCommand,
    PollerFailed,
    PositionsReached,
    RecordsPolled,
    Release,
    SetPaused,
    StopPoller,
)
from parallel_consumer.work.backpressure import credit_chunk
from parallel_consumer.work.item import TopicPartition

__all__ = ["Poller", "RebalanceCallback"]

log = logging.getLogger("parallel_consumer")

RebalanceCallback = Callable[[Any, list[Any]], object]

#: How long one consume() blocks when nothing arrives: bounds the latency of commands.
POLL_TIMEOUT = 0.05
#: How long the poller may wait for credit without calling ``consume()``. Past it, every
#: partition is paused so that ``consume()`` can serve rebalances and commit answers again.
STALL_PAUSE_AFTER = 1.0
#: How long a revoke waits for the controller's final offsets of the revoked partitions.
REVOKE_TIMEOUT = 10.0
#: How long one committed() request (on assignment) may take before the attempt counts as failed.
#: Commits have no timeout of ours: the client's own request timeouts apply.
REQUEST_TIMEOUT = 10.0


class Poller:
    """Owns the Kafka consumer. Every method except :meth:`send` runs on the poller thread."""

    def __init__(
        self,
        consumer_factory: Callable[[dict[str, Any]], Any],
        config: dict[str, Any],
        *,
        post: Callable[[ControllerEvent], None],
        limit: int,
        fetch_batch: int,
        name: str = "pc",
    ) -> None:
        # Built on the caller's thread so that configuration errors surface at construction;
        # from start() on only the poller thread touches it.
        self._consumer = consumer_factory({**config, "on_commit": self.on_commit})
        self._subscription: list[str] = []
        self._post = post
        self._limit = limit
        self._fetch_batch = fetch_batch
        self._min_fetch = credit_chunk(limit, fetch_batch)
        self._user_on_assign: RebalanceCallback | None = None
        self._user_on_revoke: RebalanceCallback | None = None
        self._commands: queue.SimpleQueue[PollerCommand] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"{name}-poller", daemon=True)
        # Owned by the poller thread:
        self._epochs: dict[TopicPartition, int] = {}
        self._next_epoch = 0
        self._held = 0
        self._wanted_paused: frozenset[TopicPartition] = frozenset()
        self._paused: set[TopicPartition] = set()
        #: Per partition: the client position last reported, and one past the last delivered offset.
        self._positions: dict[TopicPartition, int] = {}
        self._delivered_to: dict[TopicPartition, int] = {}
        #: Since when the engine has held ``limit`` records (None while there is credit).
        self._stalled_since: float | None = None
        self._async_commits = 0
        self._stopping = False

    # -- called from other threads ------------------------------------------------------------

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None,
        on_revoke: RebalanceCallback | None,
    ) -> None:
        """Set what to subscribe to once started (before :meth:`start`)."""
        self._subscription = topics
        self._user_on_assign = on_assign
        self._user_on_revoke = on_revoke

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
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the poller thread --------------------------------------------------------------------

    def _run(self) -> None:
        consumer = self._consumer
        try:
            consumer.subscribe(
                self._subscription,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
            while not self._stopping:
                self._run_commands()
                if self._stopping:
                    break
                credit = self._limit - self._held
                if credit < self._min_fetch and self._wait_for_credit():
                    continue
                self._apply_pauses()
                messages = consumer.consume(
                    num_messages=max(1, min(self._fetch_batch, credit)), timeout=POLL_TIMEOUT
                )
                if messages:
                    self._hand_over(messages)
                self._report_positions()
        except BaseException as exc:
            log.error("poller failed", exc_info=True)
            self._post(PollerFailed(exc))
        finally:
            self._stopping = True
            try:
                consumer.close()
            except Exception:
                log.warning("closing the Kafka consumer failed", exc_info=True)

    def _wait_for_credit(self) -> bool:
        """Too little credit: wait for the controller to return some, without touching the client,
        so that it keeps what it prefetched (a pause would drop it). True if the caller should
        loop again; False once the stall has lasted STALL_PAUSE_AFTER, from when on every
        partition is paused and ``consume()`` serves the group protocol and callbacks."""
        now = time.monotonic()
        if self._stalled_since is None:
            self._stalled_since = now
        if now - self._stalled_since >= STALL_PAUSE_AFTER:
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
        if isinstance(command, Release):
            self._held -= command.count
            if self._limit - self._held >= self._min_fetch:
                self._stalled_since = None
                self._held -= command.count
        elif isinstance(command, Commit):
            self._commit(command.offsets, sync=command.sync)
        elif isinstance(command, SetPaused):
            self._wanted_paused = command.tps
        elif isinstance(command, StopPoller):
            self._stopping = True

    def _hand_over(self, messages: Sequence[Any]) -> None:
        batches: dict[TopicPartition, tuple[int, list[Any]]] = {}
        epochs = self._epochs
        count = 0
        for message in messages:
            error = message.error()
            if error is not None:
                self._client_error(error)
                continue
            tp = (message.topic(), message.partition())
            batch = batches.get(tp)
            if batch is None:
                epoch = epochs.get(tp)
                if epoch is None:
                    continue  # a straggler of a partition revoked during this consume()
                batch = batches[tp] = (epoch, [])
            batch[1].append(message)
            count += 1
        for tp, (_, batch_messages) in batches.items():
            self._delivered_to[tp] = batch_messages[-1].offset() + 1
        if count:
            self._held += count
            self._post(RecordsPolled(batches, count))

    def _report_positions(self) -> None:
        """Tell the controller when the client has read past the last delivered record.

        That happens only where the log ends with offsets that are not records (transaction
        markers, aborted records): without it the group would show a lag of one forever.
        """
        if not self._epochs:
            return
        request = [KafkaTopicPartition(t, p) for t, p in self._epochs]
        changed = []
        for answer in self._consumer.position(request):
            tp = (answer.topic, answer.partition)
            offset = answer.offset
            epoch = self._epochs.get(tp)
            if (
                epoch is None
                or offset < 0
                or offset <= self._delivered_to.get(tp, -1)
                or offset == self._positions.get(tp)
            ):
                continue
            self._positions[tp] = offset
            changed.append((tp, epoch, offset))
        if changed:
            self._post(PositionsReached(tuple(changed)))

    def _client_error(self, error: Any) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if error.fatal():
            raise KafkaException(error)
        log.warning("Kafka client reported: %s", error)

    def _apply_pauses(self) -> None:
        assigned = self._epochs.keys()
        if self._stalled_since is not None:
            wanted = set(assigned)
        else:
            wanted = set(self._wanted_paused & assigned)
        if wanted == self._paused:
            return
        to_pause = wanted - self._paused
        to_resume = (self._paused - wanted) & assigned
        if to_pause:
            self._consumer.pause([KafkaTopicPartition(t, p) for t, p in to_pause])
        if to_resume:
            self._consumer.resume([KafkaTopicPartition(t, p) for t, p in to_resume])
        self._paused = set(wanted)

    # -- commits ------------------------------------------------------------------------------

    def _commit(self, offsets: Sequence[tuple[TopicPartition, int, str]], *, sync: bool) -> None:
        request = [KafkaTopicPartition(t, p, o, metadata) for (t, p), o, metadata in offsets]
        if sync:
            self._post(CommitResult(tuple(self._commit_sync(request))))
            return
        self._async_commits += 1
        try:
            self._consumer.commit(offsets=request, asynchronous=True)
        except KafkaException as exc:
            self._async_commits -= 1
            self._post(CommitResult(_failed(request, exc)))

    def _commit_sync(
        self, request: list[Any]
    ) -> list[tuple[TopicPartition, int, str | None, str | None]]:
        try:
            answer = self._consumer.commit(offsets=request, asynchronous=False)
        except KafkaException as exc:
            log.warning("commit failed: %s", exc)
            return list(_failed(request, exc))
        return [
            (
                (r.topic, r.partition),
                r.offset,
                r.metadata,
                None if r.error is None else str(r.error),
            )
            for r in answer or request
        ]

    def on_commit(self, error: Any, partitions: list[Any]) -> None:
        """The client's ``on_commit`` callback (served inside ``consume()`` on this thread)."""
        if self._async_commits == 0:
            return  # the echo of a synchronous commit, already reported
        self._async_commits -= 1
        results = tuple(
            (
                (p.topic, p.partition),
                p.offset,
                p.metadata,
                None if (p.error or error) is None else str(p.error or error),
            )
            for p in partitions
        )
        self._post(CommitResult(results))

    # -- rebalance callbacks (inside consume(), on this thread) --------------------------------

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._next_epoch += 1
        epoch = self._next_epoch
        committed = self._committed(partitions)
        assignments = []
        for p in partitions:
            tp = (p.topic, p.partition)
            self._epochs[tp] = epoch
            self._positions.pop(tp, None)
            self._delivered_to.pop(tp, None)
            found = committed.get(tp)
            offset, metadata = found if found is not None else (None, None)
            assignments.append(Assignment(tp, epoch, offset, metadata))
        log.info("assigned %s", _names(partitions))
        self._post(PartitionsAssigned(tuple(assignments)))
        self._call_user(self._user_on_assign, consumer, partitions)

    def _committed(self, partitions: list[Any]) -> dict[TopicPartition, tuple[int, str | None]]:
        request = [KafkaTopicPartition(p.topic, p.partition) for p in partitions]
        for attempt in range(3):
            try:
                answer = self._consumer.committed(request, timeout=REQUEST_TIMEOUT)
            except KafkaException as exc:
                log.warning("reading committed offsets failed (attempt %d): %s", attempt + 1, exc)
                continue
            return {
                (r.topic, r.partition): (r.offset, r.metadata)
                for r in answer
                if r.error is None and r.offset >= 0
            }
        log.warning(
            "could not read committed offsets of %s: finished records above the committed "
            "offset will be processed again",
            _names(partitions),
        )
        return {}

    def _forget(self, partitions: list[Any]) -> tuple[TopicPartition, ...]:
        """Drop the poller's per-partition state of partitions leaving the assignment."""
        tps = tuple((p.topic, p.partition) for p in partitions)
        for tp in tps:
            self._epochs.pop(tp, None)
            self._paused.discard(tp)
            self._positions.pop(tp, None)
            self._delivered_to.pop(tp, None)
        return tps

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        tps = self._forget(partitions)
        log.info("revoked %s", _names(partitions))
        if not self._stopping:
            reply: Future[list[tuple[TopicPartition, int, str]]] = Future()
            self._post(PartitionsRevoked(tps, reply))
            try:
                offsets = reply.result(timeout=REVOKE_TIMEOUT)
            except FutureTimeout:
                log.warning(
                    "no final offsets for revoked %s within %.0fs; records finished since the "
                    "last commit will be processed again by the next owner",
                    _names(partitions),
                    REVOKE_TIMEOUT,
                )
                offsets = []
            if offsets:
                request = [KafkaTopicPartition(t, p, o, md) for (t, p), o, md in offsets]
                self._post(CommitResult(tuple(self._commit_sync(request))))
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
            f"<Poller assigned={len(self._epochs)} paused={len(self._paused)} "
            f"held={self._held}/{self._limit}{' stopping' if self._stopping else ''}>"
        )


def _failed(
    request: list[Any], exc: BaseException
) -> tuple[tuple[TopicPartition, int, str | None, str | None], ...]:
    return tuple(((r.topic, r.partition), r.offset, r.metadata, str(exc)) for r in request)


def _names(partitions: list[Any]) -> str:
    return ", ".join(f"{p.topic}[{p.partition}]" for p in partitions) or "nothing"
