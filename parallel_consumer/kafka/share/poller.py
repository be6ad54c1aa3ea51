"""The share-group poller (thread ``<name>-poller``): owns the ``confluent_kafka.ShareConsumer``
clients of one instance and acknowledges each record the engine let go of.

A share consumer must acknowledge every record of one poll before it polls again. One client
would hold the engine to one poll's records at a time (and a single slow record would stop
everything), so an instance runs several clients (``clients``) and polls whichever has nothing
outstanding, while the credit allows (``work/credit.py``, the same bound as on a consumer group).
A poll may return more than asked (the broker hands out whole producer batches): what the credit
cannot take waits here (no client polls meanwhile) and goes to the engine as credit returns; what
waited SURPLUS_HOLD is released for other members rather than hoarded towards its lock. (Released
at once, it would come back with its delivery count raised, which is the engine's attempt count:
records that never failed reached the broker's delivery limit that way.)

Each partition the clients see is announced to the engine once as a *shared* assignment
(``work/shared.py``): records come in any order and again after a release, nothing is
committed. The controller sends ``Acknowledge`` (accept: done; release: deliver again); the
acknowledgements travel with the client's next poll, once it has none of its records out (a
``commit_async`` while another is on its way makes the broker refuse the acknowledgements with
INVALID_REQUEST, and its answer only arrives inside a later call of the same client).
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from parallel_consumer._events import (
    Acknowledge,
    Assignment,
    Commit,
    ControllerEvent,
    PartitionsAssigned,
    PollerCommand,
    PollerFailed,
    RecordsPolled,
    Release,
    SetPaused,
    StopPoller,
    Transact,
)
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.kafka.client_log import ClientLog
from parallel_consumer.status import PollerStatistics
from parallel_consumer.work.commit_tracker import CommitAnswer
from parallel_consumer.work.credit import Credit
from parallel_consumer.work.item import TopicPartition

__all__ = ["CLIENTS", "SharePoller", "share_client_config"]

log = logging.getLogger("parallel_consumer")

#: Share consumers per instance (see the module docstring and docs/share-groups.md).
CLIENTS = 4
#: How long the thread waits for a command when no client could poll or none returned records.
IDLE_WAIT = 0.005
#: The epoch of every shared assignment: a share group has no rebalance of partitions.
EPOCH = 1
#: How long records of a poll beyond the credit wait here for credit before they are released
#: for other members (a third of the shortest acquisition lock a group may have, 15 s).
SURPLUS_HOLD = 5.0
#: Acknowledgements normally travel with the client's next poll. One that waited this long (a
#: slow record of the same poll, a pause, no credit) is sent on its own (``commit_sync``), long
#: before the record's acquisition lock (15 s at least) could expire.
ACK_FLUSH_AFTER = 1.0
#: How long that ``commit_sync`` may block the poller thread.
ACK_FLUSH_TIMEOUT = 2.0

_NOT_APPLICABLE = re.compile(r"`([^`]+)` is not applicable for share consumer")


def share_client_config(
    factory: Callable[[dict[str, Any]], Any], config: Mapping[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """A client made from ``config``, without the consumer-group settings a share consumer
    refuses (``enable.auto.commit``, ``auto.offset.reset``, ...); returns it and the settings
    that made it, for the other clients."""
    settings = {**config, "share.acknowledgement.mode": "explicit"}
    while True:
        try:
            return factory(settings), settings
        except Exception as exc:
            found = _NOT_APPLICABLE.search(str(exc))
            if found is None or found.group(1) not in settings:
                raise
            log.debug("share consumer: dropping %s (not applicable)", found.group(1))
            del settings[found.group(1)]


def _unsupported(exc: BaseException) -> ConfigurationError | None:
    """A broker without share groups fails the first heartbeat (UNSUPPORTED_VERSION, fatal):
    said plainly, within the first poll, rather than as a client error code."""
    from confluent_kafka import KafkaError, KafkaException

    if not isinstance(exc, KafkaException) or not exc.args:
        return None
    error = exc.args[0]
    if not isinstance(error, KafkaError) or error.code() != KafkaError.UNSUPPORTED_VERSION:
        return None
    unsupported = ConfigurationError(
        "the broker has no share groups (it refused the share-group heartbeat: "
        f"{error.str()}); share groups (KIP-932) need Apache Kafka 4.2 or later with the "
        "share.version feature enabled, or use group_protocol='consumer'"
    )
    unsupported.__cause__ = exc
    return unsupported


class _Client:
    __slots__ = ("client", "out", "unsent_since")

    def __init__(self, client: Any) -> None:
        self.client = client
        #: Records of its last polls the engine has not let go of yet.
        self.out = 0
        #: When its oldest acknowledgement not sent to the broker yet was made (None: none).
        self.unsent_since: float | None = None


def _unsent(c: _Client) -> None:
    """``c`` has an acknowledgement to send (with its next poll, or on its own: see
    :meth:`SharePoller._flush_acknowledgements`)."""
    if c.unsent_since is None:
        c.unsent_since = time.monotonic()


class SharePoller:
    """Owns the share consumers. Every method except :meth:`send`, :meth:`join`,
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
        clients: int = CLIENTS,
    ) -> None:
        self._client_log = ClientLog(f"{name} share consumer", str(config.get("bootstrap.servers")))
        configured = self._client_log.configure(
            {"max.poll.records": fetch_batch, **config, "log_level": config.get("log_level", 3)}
        )
        first, settings = share_client_config(consumer_factory, configured)
        made = [first] + [consumer_factory(dict(settings)) for _ in range(clients - 1)]
        self._clients = [_Client(c) for c in made]
        for c in self._clients:
            c.client.set_acknowledgement_commit_callback(self._on_acknowledged)
        self._post = post
        self._subscription: list[str] = []
        self._commands: queue.SimpleQueue[PollerCommand] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"{name}-poller", daemon=True)
        # Owned by the poller thread:
        self._credit = Credit(limit, fetch_batch)
        #: (tp, offset) -> the client that acquired it, while the engine holds it.
        self._held: dict[tuple[TopicPartition, int], _Client] = {}
        #: Records of a poll beyond the credit, in poll order: (acquired at, client, record).
        self._surplus: deque[tuple[float, _Client, Any]] = deque()
        #: Partitions announced to the engine.
        self._known: set[TopicPartition] = set()
        self._paused = False
        self._stopping = False
        self._next = 0
        self._last_poll: float | None = None
        #: Acquired records released unprocessed: beyond the credit for SURPLUS_HOLD, or
        #: already held here.
        self.released_surplus = 0
        #: Acknowledgements the broker refused (their lock had expired: delivered again).
        self.refused = 0
        self._published: tuple[int, int, float | None, float | None] = (0, 0, None, None)

    # -- called from other threads ------------------------------------------------------------

    def subscribe(self, topics: list[str], on_assign: Any = None, on_revoke: Any = None) -> None:
        if on_assign is not None or on_revoke is not None:
            raise ConfigurationError(
                "a share group has no partition assignment: on_assign/on_revoke cannot be used "
                "with group_protocol='share'"
            )
        if any(t.startswith("^") for t in topics):
            raise ConfigurationError("a share consumer subscribes to topic names, not ^patterns")
        self._subscription = topics

    def run_transactions(self, outputs: Any) -> None:
        raise ConfigurationError("a share group has no transactions")  # (Options refuses it)

    def start(self) -> None:
        self._thread.start()

    def close_unstarted(self) -> None:
        if not self._thread.is_alive() and self._thread.ident is None:
            for c in self._clients:
                c.client.close()

    def send(self, command: PollerCommand) -> None:
        self._commands.put(command)

    def join(self, timeout: float) -> bool:
        if self._thread.ident is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def statistics(self) -> PollerStatistics:
        held, known, last_poll, down_since = self._published
        now = time.monotonic()
        limit = self._credit.limit
        return PollerStatistics(
            held=held,
            limit=limit,
            credit=limit - held,
            assigned_partitions=known,
            paused_partitions=known if self._paused else 0,
            since_last_poll=None if last_poll is None else now - last_poll,
            waiting_for_credit=None,
            commit_unanswered_for=None,
            commits_queued=0,
            brokers_down_for=None if down_since is None else now - down_since,
            missing_topics=(),
            missing_topics_for=None,
        )

    # -- the poller thread --------------------------------------------------------------------

    def _publish(self) -> None:
        self._published = (
            self._credit.held,
            len(self._known),
            self._last_poll,
            self._client_log.down_since,
        )

    def _run(self) -> None:
        try:
            for c in self._clients:
                c.client.subscribe(self._subscription)
            while not self._stopping:
                self._run_commands(block=False)
                if self._stopping:
                    break
                polled = self._poll_once()
                self._flush_acknowledgements()
                self._publish()
                if not polled:
                    self._run_commands(block=True)
        except BaseException as raised:
            exc = _unsupported(raised)
            if exc is None:
                log.error("share poller failed", exc_info=True)
            else:
                log.error("%s", exc)
            self._post(PollerFailed(exc or raised))
        finally:
            self._stopping = True
            self._publish()
            self._release_surplus()
            self._close_clients()

    def _release_surplus(self) -> None:
        """Closing: the records beyond the credit go back at once (with the clients' close)."""
        if not self._surplus:
            return
        from confluent_kafka import AcknowledgeType

        while self._surplus:
            _, c, message = self._surplus.popleft()
            try:
                self._release_unprocessed(c, message, AcknowledgeType.RELEASE)
            except Exception:
                log.warning("releasing a share record failed", exc_info=True)

    def _close_clients(self) -> None:
        """Close every client at once (each sends its acknowledgements and leaves the group,
        which releases what it still holds; a close takes about a second)."""

        def close(client: Any) -> None:
            try:
                client.close()
            except Exception:
                log.warning("closing a share consumer failed", exc_info=True)

        threads = [
            threading.Thread(target=close, args=(c.client,), name=f"{self._thread.name}-close")
            for c in self._clients
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _run_commands(self, *, block: bool) -> None:
        commands = self._commands
        if block:
            try:
                self._run_command(commands.get(timeout=IDLE_WAIT))
            except queue.Empty:
                return
        while not self._stopping:
            try:
                command = commands.get_nowait()
            except queue.Empty:
                return
            self._run_command(command)

    def _run_command(self, command: PollerCommand) -> None:
        if isinstance(command, Acknowledge):
            self._acknowledge(command.acks)
        elif isinstance(command, Release):
            self._credit.give_back(command.count)
        elif isinstance(command, Commit):
            # Nothing to commit on a share group (its acknowledgements go with the polls).
            command.reply.set_result(tuple(CommitAnswer(offset) for offset in command.offsets))
        elif isinstance(command, SetPaused):
            # A share consumer cannot pause a partition: stop polling once every one is paused.
            self._paused = bool(command.tps) and self._known <= command.tps
        elif isinstance(command, StopPoller):
            self._stopping = True  # (closing a client sends its acknowledgements)
        elif isinstance(command, Transact):
            command.reply.set_exception(ConfigurationError("a share group has no transactions"))

    def _acknowledge(self, acks: tuple[tuple[TopicPartition, int, bool], ...]) -> None:
        from confluent_kafka import AcknowledgeType

        held = self._held
        accept, release = AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE
        for tp, offset, done in acks:
            c = held.pop((tp, offset), None)
            if c is None:
                log.debug("acknowledgement of %s[%d]@%d: not held", *tp, offset)
                continue
            c.out -= 1
            try:
                c.client.acknowledge_offset(tp[0], tp[1], offset, accept if done else release)
            except Exception as exc:
                self.refused += 1
                log.warning("acknowledging %s[%d]@%d failed: %s", *tp, offset, exc)
            else:
                _unsent(c)

    def _flush_acknowledgements(self) -> None:
        """Send the acknowledgements that waited ACK_FLUSH_AFTER for their client's next poll:
        a slow record of the same poll, a pause or a lack of credit would otherwise keep them
        here past the records' locks, and the broker would deliver them again. (A blocking
        ``commit_sync``: its answer is in before the client's next call, which a
        ``commit_async`` would share a share session with.)"""
        due = time.monotonic() - ACK_FLUSH_AFTER
        for c in self._clients:
            since = c.unsent_since
            if since is None or since > due:
                continue
            c.unsent_since = None
            try:
                answers = c.client.commit_sync(ACK_FLUSH_TIMEOUT)
            except Exception as exc:
                log.warning("sending share acknowledgements failed: %s", exc)
                continue
            refused = [tp for tp, error in (answers or {}).items() if error is not None]
            if refused:
                log.warning(
                    "the broker refused the share acknowledgements of %d partitions: those "
                    "records are delivered again (%s)",
                    len(refused),
                    answers,
                )

    def _on_acknowledged(self, offsets: Any, error: Any) -> None:
        if error is not None:
            count = sum(len(v) for v in offsets.values()) if offsets else 0
            self.refused += count
            log.warning(
                "the broker refused %d share acknowledgements (%s): those records are "
                "delivered again",
                count,
                error,
            )

    def _poll_once(self) -> bool:
        """Poll each client that has nothing out, while the credit allows; True if records
        came."""
        if self._surplus:
            return self._hand_over_surplus()
        if self._paused:
            return False
        clients = self._clients
        count = len(clients)
        came = False
        for step in range(count):
            if not self._credit.can_fetch():
                break
            c = clients[(self._next + step) % count]
            if c.out:
                continue
            self._last_poll = time.monotonic()
            c.unsent_since = None  # (the poll carries its acknowledgements)
            messages = c.client.poll(0)
            if messages:
                self._client_log.reachable()
                came = self._hand_over(c, messages) or came
        self._next = (self._next + 1) % count
        return came

    def _hand_over(self, c: _Client, messages: Any) -> bool:
        from confluent_kafka import AcknowledgeType, KafkaException

        held = self._held
        available = self._credit.available
        batches: dict[TopicPartition, tuple[int, list[Any]]] = {}
        new: list[TopicPartition] = []
        taken = 0
        now = time.monotonic()
        for message in messages:
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise KafkaException(error)
                log.warning("share consumer reported: %s", error)
                continue
            tp = (message.topic(), message.partition())
            key = (tp, message.offset())
            if key in held:
                # Delivered again while its earlier delivery is still here (its lock expired):
                # give it back for other members.
                self.released_surplus += 1
                c.client.acknowledge(message, AcknowledgeType.RELEASE)
                _unsent(c)
                continue
            held[key] = c
            c.out += 1
            if tp not in self._known:
                self._known.add(tp)
                new.append(tp)
            if taken >= available:
                self._surplus.append((now, c, message))  # (waits for credit)
                continue
            taken += 1
            batches.setdefault(tp, (EPOCH, []))[1].append(message)
        if new:
            assignments = tuple(Assignment(tp, EPOCH, None, None, shared=True) for tp in new)
            self._post(PartitionsAssigned(assignments))
        if not taken:
            return False
        self._credit.take(taken)
        self._post(RecordsPolled(batches))
        return True

    def _hand_over_surplus(self) -> bool:
        """Release the records beyond the credit that waited SURPLUS_HOLD (with the paused,
        every one that waited it) and hand what the credit takes of the others to the engine
        (none while paused); True if records went."""
        from confluent_kafka import AcknowledgeType

        surplus = self._surplus
        expired = time.monotonic() - SURPLUS_HOLD
        while surplus and surplus[0][0] <= expired:
            _, c, message = surplus.popleft()
            self._release_unprocessed(c, message, AcknowledgeType.RELEASE)
        if self._paused or not surplus:
            return False
        count = min(self._credit.available, len(surplus))
        if not count:
            return False
        batches: dict[TopicPartition, tuple[int, list[Any]]] = {}
        for _ in range(count):
            _, c, message = surplus.popleft()
            batches.setdefault((message.topic(), message.partition()), (EPOCH, []))[1].append(
                message
            )
        self._credit.take(count)
        self._post(RecordsPolled(batches))
        return True

    def _release_unprocessed(self, c: _Client, message: Any, release: Any) -> None:
        """Give ``message`` (acquired by ``c``, never handed to the engine) back to the broker."""
        self._held.pop(((message.topic(), message.partition()), message.offset()), None)
        c.out -= 1
        self.released_surplus += 1
        c.client.acknowledge(message, release)
        _unsent(c)

    def __repr__(self) -> str:
        return (
            f"<SharePoller clients={len(self._clients)} held={len(self._held)} "
            f"{self._credit!r}{' stopping' if self._stopping else ''}>"
        )
