"""What crosses to a worker process of the process runner, and the worker's main loop.

Records travel as plain tuples (:func:`portable_record`), rebuilt in the worker as
:class:`DetachedRecord` contexts: the attributes of a :class:`RecordContext` without the
``confluent_kafka.Message`` behind them. Exceptions travel back as values
(:func:`portable_error`): one that would not survive pickling becomes a :class:`RemoteError`
that keeps its type name and message.

Messages, parent -> worker: ``("calls", [(batch, records), ...])`` and ``("stop",)``.
Worker -> parent: ``("ready", pid)``, ``("load_failed", text)``,
``("done", [(batch, result), ...])`` and ``("extend", batch, seconds)`` (a handler's
``ctx.extend_deadline``). ``records`` is the call's record tuples and ``result`` its
``(value, error, failures)``, where ``failures`` maps the index of each record the handler
failed with ``PollContext.fail`` to its (portable) exception.

``records`` and ``result`` travel pickled on their own (:func:`pack_records`,
:func:`unpack_result`...), inside messages of plain ints and bytes: a user value that cannot be
pickled, or pickles but cannot be rebuilt on the other side (a class whose constructor wants
other arguments than its pickled state), fails its own call and nothing else. Unpickled with
the rest of a message, it would fail the whole message, and with it the thread reading it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from collections.abc import Sequence
from datetime import datetime
from multiprocessing.connection import Connection
from typing import Any

from parallel_consumer.context import Headers, PollContext, RecordContext
from parallel_consumer.errors import DeadLetter, ParallelConsumerError

__all__ = [
    "DetachedRecord",
    "RemoteError",
    "Result",
    "WorkerCrashed",
    "pack_records",
    "portable_error",
    "portable_record",
    "unpack_result",
    "worker_main",
]

#: A worker sends what it finished once nothing more is waiting for it, or once its oldest
#: unsent result is this old (so a slow call does not hold back the results before it); a
#: thread of its own sends them, so this holds while the next call runs.
FLUSH_AFTER = 0.005

#: What a call gave: returned value, raised error, per-record failures.
Result = tuple[object, BaseException | None, dict[int, BaseException]]
#: What a worker reports per call: batch, and its Result pickled.
Finished = tuple[int, bytes]

RecordTuple = tuple[str, int, int, Any, Any, Any, Any, int, BaseException | None, datetime | None]


#: The attribute that carries an error's traceback text back from a worker process.
REMOTE_TRACEBACK = "_pc_remote_traceback"


class RemoteError(ParallelConsumerError):
    """A handler in a worker process raised an exception that cannot be pickled back to the
    parent; this one keeps its type name, message and traceback text."""

    def __init__(self, type_name: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.type_name, self.message, self.remote_traceback))


class WorkerCrashed(ParallelConsumerError):
    """The worker process running (or holding) this call died; the call counts as failed and
    its records are retried. ``exitcode`` is the process's exit code (negative: the signal)."""

    def __init__(self, message: str, exitcode: int | None = None) -> None:
        super().__init__(message)
        self.exitcode = exitcode

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.exitcode))


def portable_error(error: BaseException) -> BaseException:
    """``error`` if it survives a pickle round trip, else a :class:`RemoteError` naming it.
    Either way it carries its traceback's text (a traceback does not pickle), for the dead
    letter's header: in the attribute named ``REMOTE_TRACEBACK``, or a RemoteError's
    ``remote_traceback``."""
    if error.__traceback__ is not None:
        # (an exception type without a __dict__, or a property in the way, keeps none)
        with contextlib.suppress(Exception):
            setattr(error, REMOTE_TRACEBACK, "".join(traceback.format_exception(error)))
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        cause = error.__cause__
        if isinstance(error, DeadLetter) and cause is not None:
            # Still a DeadLetter (the parent must dead-letter the record, not retry it): only
            # its cause, which did not survive the pickle, becomes a RemoteError.
            portable = DeadLetter(error.reason, cause=portable_error(cause))
            try:
                pickle.loads(pickle.dumps(portable))
            except Exception:
                pass
            else:
                return portable
        text = "".join(traceback.format_exception(error))
        return RemoteError(_type_name(error), str(error), text)
    return error


def _type_name(value: object) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def portable_record(record: RecordContext) -> RecordTuple:
    message = record.message
    failure = record.last_failure
    return (
        message.topic(),
        message.partition(),
        message.offset(),
        message.key(),
        message.value(),
        message.headers(),
        message.timestamp(),
        record.attempts,
        None if failure is None else portable_error(failure),
        record.last_failure_at,
    )


def pack_records(records: Sequence[RecordContext]) -> bytes:
    """The records of one call, pickled for a worker; a TypeError saying what to do if they
    cannot be."""
    try:
        return pickle.dumps(tuple(portable_record(r) for r in records), pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        first = records[0].message if records else None
        where = "" if first is None else f" ({first.topic()}[{first.partition()}]@{first.offset()})"
        raise TypeError(
            f"a record of this call{where} cannot be sent to a worker process of "
            f"runner='process': its key, value or headers cannot be pickled ({exc!r}). The "
            "process runner needs records that pickle: the bytes the Kafka client returns do, "
            "so deserialize in the handler"
        ) from exc


def _unpack_records(payload: bytes) -> tuple[RecordTuple, ...]:
    try:
        return pickle.loads(payload)  # type: ignore[no-any-return]
    except Exception as exc:
        raise TypeError(
            f"the records of this call were pickled in the parent but cannot be rebuilt in the "
            f"worker process ({exc!r}): a key, value or header of a class whose constructor "
            "wants other arguments than its pickled state (define __reduce__ or "
            "__getnewargs__), or one the worker cannot import"
        ) from exc


def _pack_result(result: Result) -> bytes:
    try:
        return pickle.dumps(result, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        value, _, failures = result
        failure = RemoteError(
            "TypeError",
            f"the handler returned a {_type_name(value)}, which cannot be pickled back from "
            f"the worker process ({exc}); return None or picklable data",
        )
        return pickle.dumps((None, failure, failures), pickle.HIGHEST_PROTOCOL)


def unpack_result(payload: bytes) -> Result:
    """A call's result, as the worker pickled it; if it cannot be rebuilt here, the call
    fails with a TypeError saying why."""
    try:
        return pickle.loads(payload)  # type: ignore[no-any-return]
    except Exception as exc:
        error = TypeError(
            "the handler's return value (or exception) was pickled in the worker process but "
            f"cannot be rebuilt in the parent ({exc!r}): a class whose constructor wants other "
            "arguments than its pickled state (define __reduce__ or __getnewargs__), or one the "
            "parent cannot import; return None or plain data"
        )
        error.__cause__ = exc
        return None, error, {}


class _DetachedMessage:
    """The accessors of a ``confluent_kafka.Message`` that RecordContext reads."""

    __slots__ = ("_headers", "_key", "_offset", "_partition", "_timestamp", "_topic", "_value")

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: Any,
        value: Any,
        headers: Any,
        timestamp: Any,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = headers
        self._timestamp = timestamp

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> Any:
        return self._key

    def value(self) -> Any:
        return self._value

    def headers(self) -> Headers | None:
        return self._headers  # type: ignore[no-any-return]

    def timestamp(self) -> Any:
        return self._timestamp


class DetachedRecord(RecordContext):
    """A :class:`RecordContext` in a worker process: the same attributes (``key``, ``value``,
    ``headers``, ``topic``, ``partition``, ``offset``, ``timestamp``, ``attempts``,
    ``last_failure``, ``last_failure_at``), but no ``message``: the
    ``confluent_kafka.Message`` stays in the parent."""

    __slots__ = ()

    @classmethod
    def from_tuple(cls, values: RecordTuple) -> DetachedRecord:
        topic, partition, offset, key, value, headers, timestamp, attempts, failure, at = values
        message = _DetachedMessage(topic, partition, offset, key, value, headers, timestamp)
        return cls(message, attempts, failure, at)

    @property
    def message(self) -> Any:
        raise AttributeError(
            "a record in a worker process of runner='process' has no .message (the "
            "confluent_kafka.Message stays in the parent); use .key, .value, .headers, .topic, "
            ".partition, .offset and .timestamp"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        m = self._message
        values = (
            m.topic(),
            m.partition(),
            m.offset(),
            m.key(),
            m.value(),
            m.headers(),
            m.timestamp(),
            self.attempts,
            self.last_failure,
            self.last_failure_at,
        )
        return (DetachedRecord.from_tuple, (values,))


def worker_main(handler_bytes: bytes, tasks: Connection, results: Connection) -> None:
    """The worker process: load the handler, then run calls until told to stop or the parent
    goes away (the task pipe reaches its end)."""
    # Ctrl-C, and a service manager's SIGTERM (systemd signals the whole group), reach every
    # process of the group: the parent handles them and stops the workers after their calls.
    # A worker killed by them would fail the records of its calls, which never failed.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        handler = pickle.loads(handler_bytes)
    except BaseException as exc:
        results.send(("load_failed", "".join(traceback.format_exception(exc))))
        return
    results.send(("ready", os.getpid()))
    # The handler (or a thread it started) may send keep-alives while results go out.
    send_lock = threading.Lock()
    inbox: queue.SimpleQueue[tuple[int, bytes] | None] = queue.SimpleQueue()
    stopping = threading.Event()
    # A thread keeps reading the task pipe, so the parent's writes do not wait for a call to
    # end (and the two pipes can never both be full with each side waiting for the other).
    # While a call keeps the GIL in C code, nothing here reads: the parent writes from a feeder
    # thread per worker, so that holds up this worker's messages only.
    receiver = threading.Thread(
        target=_receive, args=(tasks, inbox, stopping), name="pc-task-receiver", daemon=True
    )
    receiver.start()
    outbox = _Outbox(results, send_lock)
    try:
        while True:
            task = inbox.get()
            if task is None or stopping.is_set():
                return
            batch, payload = task
            result = _pack_result(_run(handler, batch, payload, results, send_lock))
            # Nothing else waiting for this worker: no reason to gather more results first.
            outbox.put((batch, result), urgent=inbox.empty())
    finally:
        outbox.close()


class _Outbox:
    """Results of finished calls on their way to the parent, in as few messages as possible and
    none more than FLUSH_AFTER late. Owned by the worker's main thread, which sends them all at
    once when the worker has nothing else to run; otherwise a timer thread sends them
    FLUSH_AFTER after the first unsent one, so a result never waits for the call after it (a
    thread of its own: unless that call keeps the GIL, in C code that never releases it).

    The two threads meet only through queues: ``_finished`` (results not sent yet; a flush, by
    either thread, takes all there are), ``_arm`` (main -> timer: flush at this time) and
    ``_fired`` (timer -> main: an armed flush began, so a later result needs a new one). The
    timer is armed once per FLUSH_AFTER window, not once per result: a result costs a queue put
    and no thread switch.
    """

    def __init__(self, results: Connection, lock: threading.Lock) -> None:
        self._results = results
        self._lock = lock
        self._finished: queue.SimpleQueue[Finished] = queue.SimpleQueue()
        self._arm: queue.SimpleQueue[float | None] = queue.SimpleQueue()
        self._fired: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._armed = False  # main thread only: a flush is armed and has not begun yet
        self._timer = threading.Thread(target=self._run_timer, name="pc-result-timer", daemon=True)
        self._timer.start()

    def put(self, finished: Finished, *, urgent: bool) -> None:
        self._finished.put(finished)
        if urgent:
            self._flush()
            return
        if self._armed:
            try:
                self._fired.get_nowait()
            except queue.Empty:
                return  # the armed flush has not begun: it will take this result too
        self._armed = True
        self._arm.put(time.monotonic() + FLUSH_AFTER)

    def close(self) -> None:
        """Send what is left, and end the timer thread."""
        self._arm.put(None)
        self._timer.join()
        with contextlib.suppress(OSError):  # the parent is gone: nobody reads the results
            self._flush()

    def _flush(self) -> None:
        finished: list[Finished] = []
        while True:
            try:
                finished.append(self._finished.get_nowait())
            except queue.Empty:
                break
        if finished:
            with self._lock:
                self._results.send(("done", finished))

    def _run_timer(self) -> None:
        while True:
            due = self._arm.get()
            if due is None:
                return
            time.sleep(max(0.0, due - time.monotonic()))
            # Before the flush: a result put after this point gets a flush of its own.
            self._fired.put(True)
            try:
                self._flush()
            except OSError:
                return  # the parent is gone


def _run(
    handler: Any, batch: int, payload: bytes, results: Connection, send_lock: threading.Lock
) -> Result:
    """One call: its records rebuilt, then the handler."""
    try:
        records = _unpack_records(payload)
    except TypeError as exc:
        return None, portable_error(exc), {}
    context = PollContext(
        [DetachedRecord.from_tuple(r) for r in records],
        keep_alive=functools.partial(_keep_alive, results, send_lock, batch),
    )
    value: object = None
    error: BaseException | None = None
    try:
        value = handler(context)
    except BaseException as exc:  # SystemExit too: it fails the call, not the worker
        error = portable_error(exc)
    failures = (
        {i: portable_error(e) for i, e in context.failures.items()} if context.has_failures else {}
    )
    return value, error, failures


def _keep_alive(results: Connection, lock: threading.Lock, batch: int, seconds: float) -> None:
    with lock:
        results.send(("extend", batch, seconds))


def _receive(
    tasks: Connection,
    inbox: queue.SimpleQueue[tuple[int, bytes] | None],
    stopping: threading.Event,
) -> None:
    try:
        while True:
            message = tasks.recv()
            if message[0] == "stop":
                stopping.set()
                break
            for call in message[1]:
                inbox.put(call)
    except (EOFError, OSError):
        stopping.set()  # the parent is gone: nobody would read the results
    inbox.put(None)
