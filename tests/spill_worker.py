"""A consumer with one poison record, for the spilled-map tests: ``python tests/spill_worker.py
--help``.

It runs a ParallelConsumer in KEY order over one topic; the record at ``--poison`` fails on
every attempt (retried every 50 ms, for ever), every other record succeeds at once. It writes one
line per handler call to ``--log``, each with a single unbuffered ``os.write`` on a file opened
with ``O_APPEND`` (so a SIGKILL loses none)::

    C <offset>        a call starts (before the handler does anything)
    H <offset>        a call is about to return successfully

It exits by itself when its parent dies, so a crashed test leaves nothing running.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from parallel_consumer import Options, ParallelConsumer, PollContext, ProcessingOrder


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--poison", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--max-buffered", type=int, default=20_000)
    args = parser.parse_args(argv)
    fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    poison = args.poison

    def handle(ctx: PollContext) -> None:
        os.write(fd, b"C %d\n" % ctx.offset)
        if ctx.offset == poison:
            raise RuntimeError("poison record")
        os.write(fd, b"H %d\n" % ctx.offset)

    options = Options(
        ordering=ProcessingOrder.KEY,
        max_concurrency=16,
        retry_delay=0.05,
        commit_interval=0.2,
        max_buffered_records=args.max_buffered,
        stall_threshold=None,
    )
    config = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
    }
    pc = ParallelConsumer(config, options)
    pc.subscribe(args.topic)
    pc.poll(handle)
    parent = os.getppid()
    while os.getppid() == parent and pc.failure is None:
        time.sleep(0.2)
    failure = pc.failure
    threading.Thread(target=pc.close, kwargs={"drain": False, "timeout": 2}, daemon=True).start()
    time.sleep(2.5)
    if failure is not None:
        print(f"failed: {failure!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
