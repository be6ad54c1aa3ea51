"""A poll_and_produce pipeline in its own process, for the exactly-once test.

``python tests/produce_worker.py BOOTSTRAP SOURCE SINK GROUP MODE INSTANCE``: consumes SOURCE in
KEY order and writes one output per input to SINK (value ``"<partition>:<offset>"``, the input's
key), in commit mode MODE (``transactional`` or ``async``). It prints ``produced <n>`` to stdout
every 100 acknowledged outputs (the test kills it at random points of that progress), closes
gracefully on SIGTERM, and exits by itself when its parent dies.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from parallel_consumer import (
    CommitMode,
    Lifecycle,
    Options,
    ParallelConsumer,
    PollContext,
    ProcessingOrder,
    ProduceResult,
    ProducerRecord,
)


def main(argv: list[str]) -> int:
    bootstrap, source, sink, group, mode, instance = argv
    transactional = mode == "transactional"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()
    produced = 0
    lock = threading.Lock()

    def handle(ctx: PollContext) -> ProducerRecord:
        time.sleep(0.001)  # some work, so that kills land mid-stream
        return ProducerRecord(sink, f"{ctx.partition}:{ctx.offset}", key=ctx.key)

    def on_produced(result: ProduceResult) -> None:
        nonlocal produced
        with lock:
            produced += 1
            if produced % 100 == 0:
                print(f"produced {produced}", flush=True)

    pc = ParallelConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            # A static member: its restart takes its partitions over at once, and its
            # transactional.id is stable, so the restart aborts the killed one's transaction.
            "group.instance.id": instance,
            "session.timeout.ms": 6000,
            "auto.offset.reset": "earliest",
        },
        Options(
            ordering=ProcessingOrder.KEY,
            max_concurrency=16,
            commit_mode=(
                CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER
                if transactional
                else CommitMode.PERIODIC_CONSUMER_ASYNC
            ),
            commit_interval=0.1 if transactional else 1.0,
        ),
        producer_config={"transactional.id": f"{group}-tx"} if transactional else None,
    )
    pc.subscribe(source)
    pc.poll_and_produce(handle, on_produced=on_produced)
    print("started", flush=True)
    while not stop.wait(0.1):
        if os.getppid() != parent:
            os._exit(3)
        if pc.lifecycle is Lifecycle.CLOSED:
            print(f"failed {pc.failure!r}", flush=True)
            return 2
    pc.close()
    print("closed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
