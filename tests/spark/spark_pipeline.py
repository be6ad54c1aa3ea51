"""The handler the end-to-end Spark tests run, on ``local[2]`` (imported by reference: the
session's Python workers have the tests' ``sys.path``) and on the standalone cluster (shipped
with ``addPyFile``, as docs/spark.md says: the executors' path lacks this folder).

Transient failures (first attempt) on 3 % of the records, poison on 0.5 %; the output topic
comes in a header so one handler serves every test. Each output also says where it was made:
the client the handler used (created lazily, once per Python worker process, as docs/spark.md
advises), the process groups of the process and its ancestors (on the standalone cluster, one is its
Worker's) and the file
this module was imported from. A record with a ``pause-at`` header (a file path) stops its task
the first time it is seen: it writes the file, then waits, so that a test can kill the node
running it mid-micro-batch.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import zlib

from parallel_consumer import PollContext, ProducerRecord

OUTPUT_TOPIC_HEADER = "out-topic"
PAUSE_HEADER = "pause-at"
CLIENT_HEADER = "made-by-client"
NODE_HEADER = "made-in-group"
MODULE_HEADER = "handler-module"
#: How long the paused record's task waits to be killed before it goes on.
PAUSE_SECONDS = 60.0


def _bucket(value: bytes | None) -> int:
    return zlib.crc32(value or b"") % 1000


def is_poison(value: bytes | None) -> bool:
    return _bucket(value) < 5  # 0.5 %


def is_flaky(value: bytes | None) -> bool:
    return 5 <= _bucket(value) < 35  # 3 %


class Client:
    """Stands for a database pool or an HTTP session: it holds a lock, so it cannot be pickled
    into the closure Spark sends to the executors; it must be made where it is used."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.name = f"{os.getpid()}-{id(self)}"

    def call(self, value: bytes | None) -> bytes | None:
        with self._lock:
            return value


@functools.cache
def client() -> Client:
    return Client()


@functools.cache
def ancestor_groups() -> str:
    """The process groups of this process and its ancestors, e.g. ``"31,30,20,1"``: on the
    standalone cluster one of them is the Worker's (pyspark's daemon takes a group of its own,
    the executor stays in its Worker's)."""
    groups: list[int] = []
    pid = os.getpid()
    while pid > 1:
        groups.append(os.getpgid(pid))
        with open(f"/proc/{pid}/stat", "rb") as stat:
            pid = int(stat.read().rsplit(b")", 1)[1].split()[1])  # the parent
    return ",".join(map(str, groups))


def _pause_once(path: str) -> None:
    try:
        with open(path, "x") as marker:  # only the first time: a re-run task goes on
            marker.write(f"{ancestor_groups()}\n")
    except FileExistsError:
        return
    time.sleep(PAUSE_SECONDS)


def pipeline(ctx: PollContext) -> ProducerRecord:
    headers = dict(ctx.headers)
    pause = headers.get(PAUSE_HEADER)
    if pause is not None:
        _pause_once(pause.decode())
    if is_poison(ctx.value):
        raise ValueError(f"poison {ctx.value!r}")
    if is_flaky(ctx.value) and ctx.attempts == 0:
        raise ConnectionError("transient")
    target = headers[OUTPUT_TOPIC_HEADER]
    assert target is not None
    made = client()
    return ProducerRecord(
        target.decode(),
        made.call(ctx.value),
        ctx.key,
        headers=[
            (CLIENT_HEADER, made.name.encode()),
            (NODE_HEADER, ancestor_groups().encode()),
            (MODULE_HEADER, os.path.abspath(__file__).encode()),
        ],
    )
