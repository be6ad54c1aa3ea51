"""The open-loop producer, in a child process of its own (so that producing takes no GIL time
from the Python contestants, and none from one more than from another).

Each record's value is its produce time (epoch seconds, ``%.6f``, taken just before
``produce()``): the record carries it, and the delivery report, which knows the record's
partition and offset, reads it back from the value. The producer lingers 0 ms: a record is sent
as soon as it is due.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from parallel_consumer.bench.latency.load import LoadSpec, RateSchedule, plan_keys

__all__ = ["ProducerProcess", "produce_backlog", "produce_primers"]


def _run(
    bootstrap: str, topic: str, spec: LoadSpec, rate: float, out: str
) -> None:  # pragma: no cover - runs in the child process
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "log_level": 3})
    producer.list_topics(topic, timeout=30)  # connections and metadata before the clock starts
    plan = plan_keys(spec, RateSchedule(rate, spec.duration, 0.0).count)
    keys = [b"key-%d" % k for k, _ in plan]
    log: list[tuple[int, int, float]] = []
    errors: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(str(error))
        else:
            log.append((message.partition(), message.offset(), float(message.value())))

    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    schedule = RateSchedule(rate, spec.duration, time.time())
    late: list[float] = []
    sent = 0
    while sent < schedule.count:
        now = time.time()
        for i in range(sent, schedule.due(now)):
            t = time.time()
            late.append(t - schedule.send_time(i))
            producer.produce(
                topic, b"%.6f" % t, keys[i], partition=plan[i][1], on_delivery=delivered
            )
        sent = max(sent, schedule.due(now))
        producer.poll(0)
        wait = schedule.wait(sent, time.time())
        if wait > 0:
            time.sleep(wait)
    ended = time.time()
    left = producer.flush(60)
    late.sort()
    Path(out).write_text(
        json.dumps(
            {
                "records": log,
                "errors": errors[:5] + ([f"... {len(errors)} in all"] if len(errors) > 5 else []),
                "undelivered": left,
                "started": schedule.start,
                "ended": ended,
                "late_p99": late[int(0.99 * (len(late) - 1))] if late else 0.0,
                "late_max": late[-1] if late else 0.0,
            }
        )
    )


class ProducerProcess:
    """Start the child early (imports, connection, metadata), :meth:`go` when the contestant
    is ready, :meth:`result` once it is done. A child process of its own (``python -m``), not
    ``multiprocessing``: no re-import of whatever script the parent runs."""

    def __init__(self, bootstrap: str, topic: str, spec: LoadSpec, rate: float, out: Path) -> None:
        self._out = out
        argument = json.dumps(
            {
                "bootstrap": bootstrap,
                "topic": topic,
                "spec": dataclasses.asdict(spec),
                "rate": rate,
                "out": str(out),
            }
        )
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, argument],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if line != "ready":
            self.stop()
            raise RuntimeError(f"the open-loop producer did not start (it said {line!r})")

    def go(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write("go\n")
        self._process.stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        """Wait for the child; its log: ``records`` as ``[partition, offset, produce time]``."""
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"the open-loop producer did not finish in {timeout:g} s") from None
        if not self._out.exists():
            raise RuntimeError(f"the open-loop producer failed (exit {self._process.returncode})")
        document: dict[str, Any] = json.loads(self._out.read_text())
        if document["errors"] or document["undelivered"]:
            raise RuntimeError(
                f"the open-loop producer could not deliver every record: {document['errors']}, "
                f"{document['undelivered']} left"
            )
        return document

    def stop(self) -> None:
        """End the child if it still runs (after a failure elsewhere)."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait(10)
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                stream.close()


def produce_primers(bootstrap: str, topic: str, partitions: int) -> None:
    """One record on each partition before the contestant starts: the contestant is *ready*
    once its handler has run once (it has joined the group and fetches); primers are not
    measured."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "log_level": 3})
    for p in range(partitions):
        producer.produce(topic, b"primer", b"primer", partition=p)
    if producer.flush(60):
        raise RuntimeError(f"could not produce the primer records to {topic}")


def produce_backlog(bootstrap: str, topic: str, spec: LoadSpec, count: int) -> None:
    """``count`` records of the run's key plan, all at once: the capacity run's backlog."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "log_level": 3,
        }
    )
    for key, partition in plan_keys(spec, count):
        while True:
            try:
                producer.produce(topic, b"%.6f" % time.time(), b"key-%d" % key, partition=partition)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise RuntimeError(f"could not produce {count} records to {topic}")


if __name__ == "__main__":  # pragma: no cover - the child process
    _arguments = json.loads(sys.argv[1])
    _run(
        _arguments["bootstrap"],
        _arguments["topic"],
        LoadSpec(**_arguments["spec"]),
        _arguments["rate"],
        _arguments["out"],
    )
