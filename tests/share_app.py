"""One member of a share group in its own process, to be killed: ``python tests/share_app.py
BOOTSTRAP TOPIC GROUP``. Runs UNORDERED on the share group, each call taking 20 ms, and prints
``start <partition> <offset> <attempts>`` as a call starts and ``done ...`` as it ends."""

from __future__ import annotations

import sys
import threading
import time

from parallel_consumer import Options, ParallelConsumer, PollContext


def main(argv: list[str]) -> int:
    bootstrap, topic, group = argv[:3]
    lock = threading.Lock()
    pc = ParallelConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group},
        Options(group_protocol="share", ordering="unordered", max_concurrency=8, max_retries=3),
    )
    pc.subscribe([topic])

    @pc.poll
    def handle(ctx: PollContext) -> None:
        with lock:
            print(f"start {ctx.partition} {ctx.offset} {ctx.attempts}", flush=True)
        time.sleep(0.02)
        with lock:
            print(f"done {ctx.partition} {ctx.offset} {ctx.attempts}", flush=True)

    pc.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
