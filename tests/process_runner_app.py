"""A service with ``runner="process"`` stopped by a signal sent to its whole process group, as
a terminal's Ctrl-C (SIGINT) or systemd's default ``KillMode=control-group`` (SIGTERM) do: the
worker processes get the signal too.

``python tests/process_runner_app.py [--dead-letter]``: runs ``pc.run()`` over an in-memory
FakeCluster (one partition, 200 records, 50 ms calls, two worker processes). Workers print
``done <offset>`` for each record they finished; after run() returns the app prints
``committed <offset>``, ``dead-lettered <count>`` and ``closed``, then exits 0.
``--dead-letter``: no retries, a failed record goes to a dead-letter topic.
"""

from __future__ import annotations

import os
import sys
import time

from parallel_consumer import Options, ParallelConsumer, PollContext, ProcessingOrder
from parallel_consumer.testing.fakes import FakeCluster


def handle(ctx: PollContext) -> None:
    time.sleep(0.05)
    os.write(1, f"done {ctx.offset}\n".encode())  # one write: two workers share stdout


def main(argv: list[str]) -> int:
    dead_letters = "--dead-letter" in argv
    cluster = FakeCluster()
    cluster.create_topic("t")
    cluster.create_topic("t.dlq")
    for i in range(200):
        cluster.produce("t", b"%d" % i, key=b"k%d" % i)
    pc = ParallelConsumer(
        {"bootstrap.servers": "fake:9092", "group.id": "g"},
        Options(
            runner="process",
            processes=2,
            ordering=ProcessingOrder.UNORDERED,
            commit_interval=60.0,
            shutdown_timeout=5.0,
            # (--dead-letter: a record that fails once goes to t.dlq)
            **({"max_retries": 0, "dead_letter_topic": "t.dlq"} if dead_letters else {}),
        ),
        consumer_factory=cluster.consumer,
        producer_factory=cluster.producer,
        admin_factory=cluster.admin,
    )
    pc.subscribe(["t"])
    pc.poll(handle)
    pc.run()
    found = cluster.committed("g", "t", 0)
    print(f"committed {found[0] if found else 0}", flush=True)
    print(f"dead-lettered {len(cluster.records('t.dlq'))}", flush=True)
    print("closed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
