"""One member of the chaos test's consumer group: ``python tests/chaos_worker.py --help``.

The chaos test (``tests/chaos_harness.py``) starts several of these as real processes, SIGKILLs
some and SIGTERMs the rest. Each runs a ParallelConsumer in KEY order and writes what it does to
its own log, one line per event, each with a single unbuffered ``os.write`` on a file opened with
``O_APPEND``. A handler call writes its line *before* it returns, so any record whose offset was
committed has its line on disk even if the process is SIGKILLed a moment later.

Log lines (``<ns>`` is ``time.monotonic_ns()``, comparable between processes on one machine)::

    S <ns> <pid>                                   started
    A <ns> <p>,<p>,...                             partitions assigned (on_assign)
    R <ns> <p>,<p>,... <p>=<offset> ...            partitions revoked or lost (on_revoke, which
                                                   runs after the library's final commit), and
                                                   their committed offsets read from the broker
                                                   (``closing`` instead when closing gracefully)
    H <ns> <partition> <offset> <key> <attempts>   a handler call is about to return
    C <ns> <stale> <p>=<offset> ...                every --sample seconds: results dropped as
                                                   stale so far, and for each assigned partition
                                                   the committed offset the broker acknowledged
    F <ns> <stale> <succeeded> <commits acked>     closed gracefully (after SIGTERM)
    W <ns> <text>                                  something the test reports
    X <ns> <text>                                  something went wrong (the test fails on it)

It exits by itself when its parent dies, so a crashed test leaves nothing running.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import TopicPartition

from parallel_consumer import Lifecycle, Options, ParallelConsumer, PollContext, ProcessingOrder


class Log:
    """Appends whole lines to one file, each with one unbuffered write (safe across threads)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def line(self, kind: str, *fields: object) -> None:
        text = " ".join([kind, str(time.monotonic_ns()), *map(str, fields)])
        os.write(self._fd, text.encode() + b"\n")

    def close(self) -> None:
        os.close(self._fd)


def _partitions(partitions: Sequence[Any]) -> str:
    return ",".join(str(tp.partition) for tp in partitions) or "-"


def _on_revoke(log: Log, closing: bool, consumer: Any, partitions: Sequence[Any]) -> None:
    if closing:  # the final commit is checked by the test: committed offsets == topic end
        log.line("R", _partitions(partitions), "closing")
        return
    try:
        request = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        answer = consumer.committed(request, timeout=5)
        committed = [f"{tp.partition}={tp.offset}" for tp in answer if tp.error is None]
    except Exception as exc:  # the test then counts every unconfirmed record as at risk
        log.line("W", f"reading committed offsets at a revoke failed: {exc!r}")
        committed = []
    log.line("R", _partitions(partitions), *committed)


def _sample(pc: ParallelConsumer, log: Log) -> None:
    stats = pc.statistics()
    committed = " ".join(
        f"{s.partition}={s.committed_offset}"
        for s in stats.partitions
        if s.committed_offset is not None
    )
    log.line("C", stats.results_stale, committed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chaos_worker", description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--log", required=True, help="file to append this member's events to")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-sleep-ms", type=float, default=2.0, help="handler sleeps 0..this")
    parser.add_argument("--commit-interval", type=float, default=0.3)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--sample", type=float, default=0.1, help="seconds between C lines")
    args = parser.parse_args(argv)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log = Log(args.log)
    log.line("S", os.getpid())  # from here on, SIGTERM means "close gracefully"
    parent = os.getppid()
    max_sleep = args.max_sleep_ms / 1000.0

    def handle(ctx: PollContext) -> None:
        record = ctx.record
        time.sleep(random.uniform(0.0, max_sleep))  # simulated work
        key = (record.key or b"-").decode()
        log.line("H", record.partition, record.offset, key, record.attempts)

    config = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": args.session_timeout_ms,
        "heartbeat.interval.ms": 500,
        "fetch.wait.max.ms": 50,
    }
    options = Options(
        ordering=ProcessingOrder.KEY,
        max_concurrency=args.concurrency,
        commit_interval=args.commit_interval,
    )
    pc = ParallelConsumer(config, options)
    pc.subscribe(
        [args.topic],
        on_assign=lambda _c, parts: log.line("A", _partitions(parts)),
        on_revoke=lambda consumer, parts: _on_revoke(log, stop.is_set(), consumer, parts),
    )
    pc.poll(handle)
    try:
        while not stop.wait(args.sample):
            if os.getppid() != parent:
                log.line("X", "the test process died; exiting")
                os._exit(3)  # like a kill: no final commit
            if pc.lifecycle is Lifecycle.CLOSED:
                log.line("X", f"the consumer stopped by itself: {pc.failure!r}")
                return 2
            _sample(pc, log)
        pc.close()
        _sample(pc, log)  # the acknowledged final commit (the controller has stopped)
        stats = pc.statistics()
        log.line(
            "F",
            stats.results_stale,
            stats.records_succeeded,
            stats.commits_acknowledged,
            stats.chains,
        )
        return 0
    except Exception as exc:
        log.line("X", repr(exc).replace("\n", " "))
        raise
    finally:
        if pc.lifecycle is not Lifecycle.CLOSED:
            pc.close(drain=False, timeout=5.0)
        log.close()


if __name__ == "__main__":
    sys.exit(main())
