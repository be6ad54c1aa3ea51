"""A service as a user writes one: ``pc.run()`` in the main thread, stopped by SIGTERM.

``python tests/run_app.py BOOTSTRAP TOPIC GROUP [IDLE_STOP]``: processes TOPIC in KEY order, each
call taking 20 ms, and prints ``done <partition> <offset>`` for each record it finished. It runs
until SIGTERM (or, with IDLE_STOP seconds, until nothing was processed for that long, after the
first record), then exits with status 0 after ``run()`` returned.
"""

from __future__ import annotations

import sys
import threading
import time

from parallel_consumer import Options, ParallelConsumer, PollContext, ProcessingOrder


def main(argv: list[str]) -> int:
    bootstrap, topic, group = argv[:3]
    idle_stop = float(argv[3]) if len(argv) > 3 else None
    last = [0.0]
    lock = threading.Lock()
    pc = ParallelConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"},
        Options(ordering=ProcessingOrder.KEY, max_concurrency=16, commit_interval=60.0),
    )
    pc.subscribe([topic])

    @pc.poll
    def handle(ctx: PollContext) -> None:
        time.sleep(0.02)
        with lock:
            print(f"done {ctx.partition} {ctx.offset}", flush=True)
            last[0] = time.monotonic()

    if idle_stop is not None:

        def stop_when_idle() -> None:
            while not last[0] or time.monotonic() - last[0] < idle_stop:
                time.sleep(0.1)
            pc.close()

        threading.Thread(target=stop_when_idle, daemon=True).start()
    pc.run()
    print("closed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
