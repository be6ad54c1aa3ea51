"""The library's producer for ``poll_and_produce`` (thread ``<name>-producer``).

The controller hands it the outputs of one handler call (:meth:`Outputs.send`); the broker's
delivery reports are gathered per call, and the calls settled during one round of the producer
thread (``producer.poll``) go back as one
:class:`~parallel_consumer._events.OutputsDelivered` event. The thread serves the delivery
reports whatever the controller and the poller are doing, a revoke included.

In the transactional commit mode the poller drives the transaction (it holds the consumer's
group metadata, which fences zombies, KIP-447): :meth:`Outputs.transact` sends the offsets into
the open transaction, commits it and begins the next one, or aborts it. The controller makes
sure no output is sent while that happens.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from parallel_consumer._events import ControllerEvent, OutputsDelivered, ProducerFailed
from parallel_consumer.errors import ConfigurationError, ParallelConsumerError
from parallel_consumer.kafka.bounded_call import CallStuck, call_within
from parallel_consumer.kafka.client_log import ClientLog
from parallel_consumer.kafka.delivery_reports import (
    CallDelivery,
    RunDelivery,
    Settled,
    SettledRun,
)
from parallel_consumer.kafka.delivery_reports import refused as refused_write
from parallel_consumer.produce import ProduceError, ProducerRecord
from parallel_consumer.work.runs import drain_left

__all__ = ["Outputs", "TransactionOutcome", "start_outputs"]

log = logging.getLogger("parallel_consumer")

#: How long one transactional request (init, send offsets, commit, abort) may take.
TRANSACTION_TIMEOUT = 30.0
#: How often a commit that failed with a retriable error is tried again before aborting.
COMMIT_ATTEMPTS = 3
#: Renewals of the transactional producer in a row, no commit between, before it is fatal.
RENEWALS = 5
#: How often a re-initialisation's ``init_transactions`` is tried while it fails retriably
#: (the coordinator is moving or loading its state).
INIT_ATTEMPTS = 4
#: Seconds past its own timeout a transactional call may block before the producer is renewed.
STUCK_AFTER = 5.0
#: How long close() waits for outputs still on their way.
FLUSH_TIMEOUT = 10.0
#: Seconds between metadata requests for topics the brokers refused a write on.
REFRESH_REFUSED_EVERY = 1.0
#: After waiting this long for room in the producer's queue, say so (once per output).
QUEUE_FULL_WARNING = 5.0


class TransactionOutcome(enum.Enum):
    COMMITTED = "committed"
    #: The transaction was aborted (its outputs and offsets are gone) and a new one begun.
    ABORTED = "aborted"
    #: The producer cannot go on (fenced by a newer instance, or another fatal error).
    FATAL = "fatal"


class Outputs:
    """Wraps the ``confluent_kafka.Producer`` the library owns."""

    def __init__(
        self,
        producer: Any,
        *,
        post: Callable[[ControllerEvent], None],
        transactional: bool,
        name: str = "pc",
        renew: Callable[[], Any] | None = None,
        transaction_timeout: float = 60.0,
    ) -> None:
        """``renew`` makes a producer with the same settings, ``transaction_timeout`` is
        their ``transaction.timeout.ms`` in seconds (see :meth:`_renew`)."""
        self._producer = producer
        self._name = name
        self._renew_producer = renew
        self._transaction_timeout = transaction_timeout
        #: When the open transaction began (monotonic), and re-initialisations in a row.
        self._began = 0.0
        self._renewals = 0
        self._post = post
        self.transactional = transactional
        self._stopping = threading.Event()
        #: Calls whose outputs are all settled, not yet posted (appended by any thread).
        self._settled: deque[Settled] = deque()
        self._settled_runs: deque[SettledRun] = deque()
        #: Controller thread: (call or run, first output not sent yet, outputs), in order.
        self._backlog: deque[tuple[CallDelivery | RunDelivery, int, Sequence[ProducerRecord]]] = (
            deque()
        )
        self._full_since: float | None = None
        self._delivery_lock = threading.Lock()
        #: Topics the brokers refused a write on (appended by the controller thread): the
        #: producer thread asks for their metadata, or the client would go on refusing them
        #: from its cache after the ACL is granted (until its next metadata refresh).
        self._refused_topics: deque[str] = deque()
        self._next_refresh = 0.0
        self._thread = threading.Thread(target=self._serve, name=f"{name}-producer", daemon=True)
        self._closed = False

    # -- set-up (caller's thread) -----------------------------------------------------------------

    def start(self) -> None:
        """Start serving delivery reports; in the transactional mode, fence older instances
        with the same ``transactional.id`` and begin the first transaction (blocks)."""
        if self.transactional:
            self._producer.init_transactions(TRANSACTION_TIMEOUT)
            self._begin()
        self._thread.start()

    def _begin(self) -> None:
        self._producer.begin_transaction()
        self._began = time.monotonic()

    # -- the controller thread ------------------------------------------------------------------

    def send(self, batch: int, outputs: Sequence[ProducerRecord]) -> None:
        """Produce one call's outputs; an OutputsDelivered event follows once all are settled.
        Never blocks: outputs that find the producer's queue full wait in a backlog that
        :meth:`pump` sends on (the controller calls it every turn while :attr:`backlog` holds
        any)."""
        delivery = CallDelivery(batch, len(outputs), self._settled, self._delivery_lock)
        backlog = self._backlog
        if backlog:
            backlog.append((delivery, 0, outputs))
            self.pump()
        else:
            self._produce(delivery, 0, outputs)

    def send_run(self, run: int, outputs: Sequence[ProducerRecord], owners: Sequence[int]) -> None:
        """Produce the outputs of a run's records (``owners[i]``: the index of the record that
        returned output ``i``); once all are settled an OutputsDelivered event reports the
        run, with the failures per record (as :meth:`send`)."""
        delivery = RunDelivery(run, owners, self._settled_runs, self._delivery_lock)
        if self._backlog:
            self._backlog.append((delivery, 0, outputs))
            self.pump()
        else:
            self._produce(delivery, 0, outputs)

    def _fenced_by_another(self, error: KafkaError) -> bool:
        """Fenced with the transaction younger than its timeout: no coordinator did it."""
        age = time.monotonic() - self._began
        return error.code() in _FENCED and age < self._transaction_timeout

    @property
    def _renews(self) -> bool:
        """Transactional, with a way to renew the producer (see :meth:`_renew`)."""
        return self.transactional and self._renew_producer is not None

    @property
    def backlog(self) -> bool:
        """Outputs wait for room in the producer's queue."""
        return bool(self._backlog)

    def pump(self) -> None:
        """Send outputs of the backlog until the producer's queue is full again."""
        backlog = self._backlog
        while backlog:
            delivery, start, outputs = backlog.popleft()
            if not self._produce(delivery, start, outputs):
                return
        self._full_since = None

    def _produce(
        self, delivery: CallDelivery | RunDelivery, start: int, outputs: Sequence[ProducerRecord]
    ) -> bool:
        """Produce ``outputs[start:]``; False if the queue filled up (the rest went to the
        front of the backlog). A rejected output fails the rest of the call unsent."""
        produce = self._producer.produce
        index = start
        while index < len(outputs):
            record = outputs[index]
            try:
                produce(
                    record.topic,
                    record.value,
                    record.key,
                    partition=-1 if record.partition is None else record.partition,
                    headers=record.headers or None,
                    on_delivery=partial(delivery.report, index),
                )
            except BufferError:
                # The producer's queue is full: its thread drains it as the broker answers.
                self._backlog.appendleft((delivery, index, outputs))
                self._queue_full()
                return False
            except (KafkaException, TypeError, ValueError) as exc:
                # It fails its call; the call's other outputs not sent yet are not sent (a run
                # goes on with the next call's).
                first, end = delivery.call_span(index)
                error = exc.args[0] if exc.args else exc
                what = f"output {index - first} to {record.topic} rejected"
                refused = refused_write(what, error, record.topic)
                if refused is not None:
                    self._refused_topics.append(record.topic)
                delivery.report(index, refused or ProduceError(f"{what}: {error}"), None)
                for rest in range(index + 1, end):
                    skipped = (
                        f"output {rest - first} not sent: output {index - first} of the call "
                        "was rejected"
                    )
                    delivery.report(rest, ProduceError(skipped), None)
                index = end
                continue
            index += 1
        return True

    def _queue_full(self) -> None:
        now = time.monotonic()
        if self._full_since is None:
            self._full_since = now
        elif now - self._full_since > QUEUE_FULL_WARNING:
            log.warning(
                "the producer's queue has been full for %.0fs (is the broker reachable?); "
                "raise queue.buffering.max.messages if outputs are many",
                now - self._full_since,
            )
            self._full_since = now

    # -- the poller thread (transactional mode) --------------------------------------------------

    @property
    def producer(self) -> Any:
        """The client, for records the poller writes inside the open transaction (spilled
        offset maps, ``kafka/spill_store.py``)."""
        return self._producer

    def abort(self, reason: str) -> tuple[TransactionOutcome, str]:
        """Abort the open transaction and begin the next one."""
        return self._abort_after(None, reason)

    def transact(
        self, send_offsets: Callable[[Any, float], None] | None
    ) -> tuple[TransactionOutcome, str]:
        """Add the offsets to the open transaction (``send_offsets(producer, timeout)``, which
        raises KafkaException as ``send_offsets_to_transaction`` does; None: no offsets), commit
        it, and begin the next one. On an abortable error abort instead (and begin the next
        one)."""
        producer = self._producer
        if send_offsets is not None:
            # Not longer than the transaction may live: past that it cannot commit anyway.
            timeout = min(TRANSACTION_TIMEOUT, max(self._transaction_timeout, 5.0))
            try:
                call_within(
                    partial(send_offsets, producer, timeout),
                    timeout + STUCK_AFTER,
                    name=f"{self._name}-send-offsets",
                )
            except CallStuck as exc:
                return self._renew(None, str(exc))
            except KafkaException as exc:
                # (a timeout too: the call goes on in the client, blocking all others)
                return self._abort_after(_kafka_error(exc), f"sending the offsets failed: {exc}")
        error: KafkaError | None = None
        for _ in range(COMMIT_ATTEMPTS):
            try:
                producer.commit_transaction(TRANSACTION_TIMEOUT)
            except KafkaException as exc:
                error = _kafka_error(exc)
                if error is not None and error.retriable() and not error.txn_requires_abort():
                    log.info("committing the transaction failed (%s); trying again", error)
                    continue
                break
            else:
                self._renewals = 0
                self._begin()
                return TransactionOutcome.COMMITTED, ""
        return self._abort_after(error)

    def _abort_after(
        self, error: KafkaError | None, reason: str | None = None
    ) -> tuple[TransactionOutcome, str]:
        reason = reason or str(error)
        if error is not None and error.fatal():
            return self._renew(error, reason)
        log.warning("aborting the transaction: %s", reason)
        try:
            self._producer.abort_transaction(TRANSACTION_TIMEOUT)
            self._begin()
        except KafkaException as exc:
            return self._renew(_kafka_error(exc), f"{reason}; aborting failed too: {exc}")
        return TransactionOutcome.ABORTED, reason

    def _renew(self, error: KafkaError | None, reason: str) -> tuple[TransactionOutcome, str]:
        """Replace a producer that cannot go on with (or abort) its transaction by a new one of
        the same ``transactional.id`` (its ``init_transactions`` aborts what was left open);
        ABORTED then: the caller rewinds. A coordinator failover aborts transactions older than
        ``transaction.timeout.ms`` and bumps the epoch (reported as fenced or fatal). Fenced by
        another instance, or RENEWALS renewals in a row without a commit, stay FATAL."""
        if error is not None and self._fenced_by_another(error):
            return TransactionOutcome.FATAL, _fatal_reason(error)
        age = time.monotonic() - self._began
        if self._renew_producer is None or self._renewals >= RENEWALS:
            if error is not None and error.fatal():
                return TransactionOutcome.FATAL, _fatal_reason(error)
            return TransactionOutcome.FATAL, f"the transaction could not be aborted: {reason}"
        self._renewals += 1
        log.warning(
            "re-initialising the transactional producer (%s; the transaction was open %.1fs); "
            "its uncommitted outputs are dropped and their inputs processed again",
            reason,
            age,
        )
        _discard(self._producer)
        producer = self._renew_producer()
        for attempt in range(1, INIT_ATTEMPTS + 1):
            try:
                producer.init_transactions(TRANSACTION_TIMEOUT)
                break
            except KafkaException as exc:
                init_error = _kafka_error(exc)
                if attempt == INIT_ATTEMPTS or init_error is None or not init_error.retriable():
                    return (
                        TransactionOutcome.FATAL,
                        f"the transactional producer could not be re-initialised: {exc}",
                    )
                log.info("re-initialising the producer failed (%s); trying again", init_error)
        self._producer = producer
        self._begin()
        return TransactionOutcome.ABORTED, f"{reason}; the producer was re-initialised"

    # -- delivery reports and close -------------------------------------------------------------

    def _serve(self) -> None:
        """Serve delivery reports; post the calls they settled, as one event per round."""
        settled = self._settled
        settled_runs = self._settled_runs
        post = self._post
        stopping = self._stopping
        failed: Any = None
        while not stopping.is_set():
            producer = self._producer  # (each round: the poller may renew it)
            if producer is None:
                return
            if producer is failed:
                stopping.wait(0.05)
                continue
            try:
                producer.poll(0.05)
            except Exception as exc:
                error = _kafka_error(exc) if isinstance(exc, KafkaException) else None
                if (
                    error is not None
                    and error.fatal()
                    and self._renews
                    and not self._fenced_by_another(error)
                ):
                    # The poller's next commit or abort fails too and renews the producer.
                    log.warning("the transactional producer failed: %s", error.str())
                    failed = producer
                    continue
                # A fatal producer error that no renewal can cure: stop the consumer.
                reason = (
                    _fatal_reason(error) if error is not None else f"the producer failed: {exc!r}"
                )
                log.error("%s", reason)
                post(ProducerFailed(reason))
                return
            if settled or settled_runs:
                post(OutputsDelivered(tuple(drain_left(settled)), tuple(drain_left(settled_runs))))
            if self._refused_topics:
                self._refresh_refused()

    def _refresh_refused(self) -> None:
        """Ask for the metadata of the topics refused lately (at most once a second): an ACL
        granted meanwhile then takes effect."""
        now = time.monotonic()
        if now < self._next_refresh:
            return
        self._next_refresh = now + REFRESH_REFUSED_EVERY
        for topic in set(drain_left(self._refused_topics)):
            try:
                self._producer.list_topics(topic, timeout=REFRESH_REFUSED_EVERY)
            except Exception:  # still refused, or no answer: the next refusal asks again
                log.debug("metadata of refused topic %s not read", topic, exc_info=True)

    def close(self, *, abort: bool) -> None:
        """Stop serving; wait for outputs still on their way (non-transactional), or abort the
        open transaction. Called once the poller has stopped."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        if self._thread.ident is not None:
            self._thread.join(1.0)
        try:
            if self.transactional:
                # Everything finished was committed by the final commit; what is left of the
                # open transaction (nothing, or outputs of records not committed) goes.
                if self._thread.ident is not None:
                    self._producer.abort_transaction(5.0)
            else:
                left = self._producer.flush(0.0 if abort else FLUSH_TIMEOUT)
                if left:
                    log.warning("%d outputs were still on their way when the producer closed", left)
        except Exception:
            log.warning("closing the producer failed", exc_info=True)
        # The client's threads and connections end when it is garbage collected.
        self._producer = None

    def __repr__(self) -> str:
        mode = "transactional" if self.transactional else "idempotent"
        return f"<Outputs {mode}{' closed' if self._closed else ''}>"


def _kafka_error(exc: KafkaException) -> KafkaError | None:
    error = exc.args[0] if exc.args else None
    return error if isinstance(error, KafkaError) else None


_FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED})


def _discard(producer: Any) -> None:
    """Fail the outputs a replaced producer still holds (their reports are served here)."""
    try:
        producer.purge()
        producer.poll(0)
    except Exception:  # a fatal or half-broken client: nothing more to save
        log.debug("purging the replaced producer failed", exc_info=True)


def _fatal_reason(error: KafkaError) -> str:
    if error.code() in _FENCED:
        return (
            f"the transactional producer was fenced ({error}): another instance uses the same "
            "transactional.id; each instance needs its own (see docs/exactly-once.md)"
        )
    return f"the transactional producer failed for good: {error}"


def start_outputs(
    factory: Callable[[dict[str, Any]], Any],
    config: dict[str, Any],
    *,
    post: Callable[[ControllerEvent], None],
    transactional: bool,
    name: str,
) -> Outputs:
    """The library's producer made by ``factory`` from ``config`` (librdkafka's log and errors
    into ``logging``, as for the consumer), its thread started; in the transactional mode its
    transactions initialised. Bad settings are a ConfigurationError."""
    try:
        servers = str(config.get("bootstrap.servers"))
        said = ClientLog(f"{name} producer", servers, reports_health=False)
        configured = said.configure(config)
        producer = factory(configured)
    except KafkaException as exc:
        raise ConfigurationError(f"invalid producer_config: {exc}") from exc
    outputs = Outputs(
        producer,
        post=post,
        transactional=transactional,
        name=name,
        renew=lambda: factory(configured),
        transaction_timeout=float(configured.get("transaction.timeout.ms", 60_000)) / 1000,
    )
    try:
        outputs.start()
    except KafkaException as exc:
        raise ParallelConsumerError(
            "could not start the transactional producer "
            f"(transactional.id={config.get('transactional.id')!r}): {exc}"
        ) from exc
    return outputs
