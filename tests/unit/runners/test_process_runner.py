"""The process runner on its own and through the engine (fakes): calls in worker processes,
failures as values, a crashed worker replaced with its calls retried, configuration errors.

Handlers are module-level functions: worker processes are spawned and import them by name.
Each test starts real processes (about a second on a busy machine), so there are few of them.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from collect import Results
from confluent_kafka import Message

from parallel_consumer import ConfigurationError, Options, ParallelConsumer, PollContext
from parallel_consumer._clock import SystemClock
from parallel_consumer.context import RecordContext
from parallel_consumer.hooks import NoHooks
from parallel_consumer.runners import ProcessRunner, RemoteError, WorkerCrashed
from parallel_consumer.testing.fakes import FakeCluster

# -- handlers (run in the worker processes) ---------------------------------------------------


class Unpicklable(Exception):
    """Cannot be rebuilt from its args: pickling it back to the parent fails."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}/{b}")
        self.lock = threading.Lock()


def describe(ctx: PollContext) -> object:
    """Returns what the worker saw, or fails in the ways the value asks for."""
    record = ctx.record
    if record.value == b"raise":
        raise ValueError(f"bad record {record.offset}")
    if record.value == b"unpicklable-error":
        raise Unpicklable(1, 2)
    if record.value == b"unpicklable-value":
        return threading.Lock()
    if record.value == b"exit":
        os._exit(7)
    if record.value == b"exit-when-told":
        # Say it runs (file ``started``), then die once file ``go`` exists
        files = {k: Path(v.decode()) for k, v in record.headers or () if v is not None}
        files["started"].touch()
        deadline = time.monotonic() + 30
        while not files["go"].exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(9)
    try:
        record.message  # noqa: B018 - the attribute itself is the check
        has_message = True
    except AttributeError:
        has_message = False
    return (
        os.getpid(),
        record.topic,
        record.partition,
        record.offset,
        record.key,
        record.value,
        record.headers,
        record.timestamp,
        record.attempts,
        has_message,
    )


def log_and_crash_once(ctx: PollContext) -> None:
    """Appends ``key offset attempts`` to the log named by header ``dir``; on the first attempt
    at a record whose value is ``crash`` it kills its own process first (marker file)."""
    folder = Path(dict(ctx.headers)["dir"].decode())  # type: ignore[union-attr]
    if ctx.value == b"crash":
        marker = folder / f"crashed-{ctx.offset}"
        if not marker.exists():
            marker.touch()
            os._exit(1)
    if ctx.value == b"fail" and ctx.attempts == 0:
        raise Unpicklable(3, 4)
    line = f"{ctx.key.decode()} {ctx.offset} {ctx.attempts} {ctx.last_failure!r}\n"  # type: ignore[union-attr]
    fd = os.open(folder / "log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def fail_odd_records(ctx: PollContext) -> str:
    """Fails the records with odd offsets one by one (one with an unpicklable error)."""
    for record in ctx:
        if record.offset % 2:
            error = Unpicklable(5, 6) if record.offset == 3 else ValueError(f"odd {record.offset}")
            ctx.fail(record, error)
    return "returned"


# -- direct runner tests ----------------------------------------------------------------------


def context(
    offset: int, value: bytes, *, headers: list[tuple[str, bytes]] | None = None
) -> PollContext:
    message = Message(
        topic="t",
        partition=2,
        offset=offset,
        key=b"k%d" % offset,
        value=value,
        headers=headers,
        timestamp=(1, 1_700_000_000_123),
    )
    return PollContext([RecordContext(message, attempts=1)])


class CallLog(NoHooks):
    def __init__(self) -> None:
        self.started: list[int] = []
        self.ended: list[int] = []

    def on_call_start(self, batch: int, context: PollContext) -> None:
        self.started.append(batch)

    def on_call_end(self, batch: int, context: PollContext, error: BaseException | None) -> None:
        self.ended.append(batch)


@pytest.fixture
def runner() -> Iterator[tuple[ProcessRunner, Results, CallLog]]:
    hooks = CallLog()
    results = Results()
    started = ProcessRunner(2, SystemClock(), name="ptest", hooks=hooks)
    started.start(describe, results)
    yield started, results, hooks
    started.stop(1.0)


def test_calls_run_in_worker_processes_with_the_records_attributes(runner):
    process_runner, results, hooks = runner
    # When 40 calls run (several per message)
    for i in range(40):
        process_runner.submit(i, context(i, b"v%d" % i, headers=[("h", b"x")]))
    done = results.take(40)
    # Then each ran in a worker process and saw every attribute but .message
    pids = set()
    for i, event in done.items():
        assert event.errors == (None,)
        pid, topic, partition, offset, key, value, headers, ts, attempts, has_message = event.value
        pids.add(pid)
        assert (topic, partition, offset, key, value) == ("t", 2, i, b"k%d" % i, b"v%d" % i)
        assert headers == [("h", b"x")]
        assert ts is not None
        assert ts.timestamp() == pytest.approx(1_700_000_000.123)
        assert attempts == 1
        assert has_message is False
    assert os.getpid() not in pids
    # And the runner hooks ran in the parent around each call
    assert sorted(hooks.started) == sorted(hooks.ended) == list(range(40))


def test_exceptions_come_back_as_failures_and_unpicklable_ones_keep_their_name(runner):
    process_runner, results, _ = runner
    process_runner.submit(1, context(1, b"raise"))
    process_runner.submit(2, context(2, b"unpicklable-error"))
    process_runner.submit(3, context(3, b"unpicklable-value"))
    process_runner.submit(4, context(4, b"fine"))
    done = results.take(4)
    assert isinstance(done[1].errors[0], ValueError)
    assert str(done[1].errors[0]) == "bad record 1"
    unpicklable = done[2].errors[0]
    assert isinstance(unpicklable, RemoteError)
    assert unpicklable.type_name.endswith("Unpicklable")
    assert unpicklable.message == "1/2"
    assert "Traceback" in unpicklable.remote_traceback
    assert isinstance(done[3].errors[0], RemoteError)
    assert "cannot be pickled" in str(done[3].errors[0])
    assert done[4].errors == (None,)


class _UnpicklableCause(Exception):
    def __init__(self, a: int, b: int) -> None:  # pickling calls __init__(*args): one arg only
        super().__init__(f"{a}/{b}")


def test_a_dead_letter_keeps_its_cause_through_the_pickle_round_trip():
    import pickle

    from parallel_consumer import DeadLetter
    from parallel_consumer.runners._process_worker import portable_error

    # Given DeadLetter raised from a picklable cause: the cause travels with it
    try:
        try:
            int("x")
        except ValueError as exc:
            raise DeadLetter("not a number") from exc
    except DeadLetter as raised:
        letter = raised
    back = pickle.loads(pickle.dumps(portable_error(letter)))
    assert isinstance(back, DeadLetter)
    assert back.reason == "not a number"
    assert isinstance(back.__cause__, ValueError)
    # Given a cause that cannot be pickled: still a DeadLetter, its cause a RemoteError
    portable = portable_error(DeadLetter("odd", cause=_UnpicklableCause(1, 2)))
    back = pickle.loads(pickle.dumps(portable))
    assert isinstance(back, DeadLetter)
    assert isinstance(back.__cause__, RemoteError)
    assert back.__cause__.type_name.endswith("_UnpicklableCause")


def test_a_crashed_worker_is_replaced_and_its_calls_report_failed(runner):
    process_runner, results, _ = runner
    # When a call kills its worker process
    process_runner.submit(1, context(1, b"exit"))
    done = results.take(1)
    # Then the call reports WorkerCrashed with the exit code
    error = done[1].errors[0]
    assert isinstance(error, WorkerCrashed)
    assert error.exitcode == 7
    # And a replacement takes calls again: two workers serve calls afterwards
    deadline = time.monotonic() + 20
    pids: set[int] = set()
    batch = 100
    while len(pids) < 2 and time.monotonic() < deadline:
        for _ in range(8):
            process_runner.submit(batch, context(batch, b"ok"))
            batch += 1
        for event in results.take(8).values():
            assert event.errors == (None,)
            pids.add(event.value[0])
    assert len(pids) == 2
    assert process_runner.restarts == 1


def test_stop_ends_the_workers_and_the_pool_thread(runner):
    process_runner, results, _ = runner
    for i in range(10):
        process_runner.submit(i, context(i, b"v"))
    results.take(10)
    workers = [w.process for w in process_runner._workers]
    assert process_runner.stop(5.0) is True
    assert process_runner._thread is not None
    assert not process_runner._thread.is_alive()
    for process in workers:
        with pytest.raises(ValueError, match="closed"):
            process.is_alive()  # closed: it exited and was released


def test_a_worker_that_dies_while_the_runner_stops_still_reports_its_call(runner, tmp_path):
    # Given a call running in its worker process (waited for: a call only shipped to the worker,
    # as on_call_start says, may not have started when the stop reaches the worker, and a
    # worker that stops cleanly reports nothing of what it held, which made this test fail on
    # a loaded machine)
    process_runner, results, _ = runner
    started, go = tmp_path / "started", tmp_path / "go"
    headers = [("started", str(started).encode()), ("go", str(go).encode())]
    process_runner.submit(1, context(1, b"exit-when-told", headers=headers))
    wait_until(started.exists)
    # When the runner stops, and the call kills its worker meanwhile (not after a fixed 0.3 s:
    # before the stop, the worker would be replaced)
    stopper = threading.Thread(target=process_runner.stop, args=(5.0,))
    stopper.start()
    wait_until(lambda: not process_runner._open)
    go.touch()
    stopper.join(15)
    assert not stopper.is_alive()
    # Then the call reports WorkerCrashed (its record will be retried), and no replacement starts
    error = results.take(1)[1].errors[0]
    assert isinstance(error, WorkerCrashed)
    assert error.exitcode == 9
    assert process_runner.restarts == 0


def test_a_lambda_or_closure_handler_is_a_configuration_error():
    cluster = FakeCluster()
    cluster.create_topic("t")

    def closure(ctx: PollContext) -> None:
        pass

    for handler in (lambda ctx: None, closure):
        pc = ParallelConsumer(
            {"bootstrap.servers": "fake:9092", "group.id": "g"},
            Options(runner="process", processes=1),
            consumer_factory=cluster.consumer,
        )
        pc.subscribe("t")
        with pytest.raises(ConfigurationError, match="can be pickled"):
            pc.poll(handler)
        pc.close()


# -- through the engine -----------------------------------------------------------------------


def wait_until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {condition}")
        time.sleep(0.01)


def test_key_order_holds_and_a_crashed_record_is_retried(tmp_path):
    # Given 300 records over 10 keys; record 50 kills its worker on its first attempt and
    # record 120 raises an unpicklable exception on its first attempt
    cluster = FakeCluster()
    cluster.create_topic("t", 2)
    headers = [("dir", str(tmp_path).encode())]
    for i in range(300):
        value = b"crash" if i == 50 else b"fail" if i == 120 else b"ok"
        cluster.produce("t", value, key=b"k%d" % (i % 10), partition=0, headers=headers)
    pc = ParallelConsumer(
        {"bootstrap.servers": "fake:9092", "group.id": "g"},
        Options(runner="process", processes=2, ordering="key", retry_delay=0.05),
        consumer_factory=cluster.consumer,
    )
    pc.subscribe("t")
    # When a process runner runs them
    try:
        pc.poll(log_and_crash_once)
        wait_until(lambda: pc.statistics().records_succeeded == 300, timeout=60)
    finally:
        pc.close()
    # Then every record was processed, and each key's records in offset order
    lines = [line.split(" ", 3) for line in (tmp_path / "log").read_text().splitlines()]
    by_key: dict[str, list[int]] = defaultdict(list)
    for key, offset, _, _ in lines:
        by_key[key].append(int(offset))
    assert {o for offsets in by_key.values() for o in offsets} == set(range(300))
    # (a record finished but not yet reported when its worker died runs again, right away)
    assert all(offsets == sorted(offsets) for offsets in by_key.values())
    # And the crashed record ran again as a retry, after the worker was replaced
    assert (tmp_path / "crashed-50").exists()
    retried = {int(o): (int(a), f) for _, o, a, f in lines if int(a) > 0}
    assert retried[50][0] >= 1
    assert "WorkerCrashed" in retried[50][1]
    # And the unpicklable failure reached the retry as a RemoteError naming its type
    assert "RemoteError" in retried[120][1]
    assert "Unpicklable" in retried[120][1]
    assert cluster.committed("g", "t", 0) == (300, None)


def test_records_failed_with_ctx_fail_come_back_one_by_one():
    # Given a handler that fails the odd records of its batch and returns
    results = Results()
    process_runner = ProcessRunner(1, SystemClock(), name="pfail")
    process_runner.start(fail_odd_records, results)
    try:
        records = [context(i, b"v").record for i in range(5)]
        process_runner.submit(1, PollContext(records))
        [event] = results.take(1).values()
    finally:
        process_runner.stop(1.0)
    # Then each record has its own outcome, the call's value counts, and it is marked partial
    assert event.value == "returned"
    assert event.partial
    assert [type(e).__name__ if e else None for e in event.errors] == [
        None,
        "ValueError",
        None,
        "RemoteError",
        None,
    ]
    assert str(event.errors[1]) == "odd 1"
