"""``run(handle_signals=False)`` on the main thread keeps Python's own SIGINT handler, so Ctrl-C
arrives as a KeyboardInterrupt inside run(): run() must not return (or raise) with the
consumer still running, its threads alive and what finished uncommitted."""

from __future__ import annotations

import os
import signal
import threading
import time

from parallel_consumer import Lifecycle, Options, PollContext


def test_a_keyboard_interrupt_in_run_without_signal_handlers_still_closes(
    harness, cluster, wait_until, default_sigint
):
    # Given a running consumer that finished records 0..2, and Python's default SIGINT handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    cluster.create_topic("t")
    for i in range(3):
        cluster.produce("t", b"%d" % i)
    ran: list[int] = []

    def handle(ctx: PollContext) -> None:
        ran.append(ctx.offset)

    pc = harness.make(Options(ordering="partition"))
    pc.poll(handle)

    def interrupt() -> None:
        wait_until(lambda: ran == [0, 1, 2])
        time.sleep(0.2)  # run() is waiting by now
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=interrupt, daemon=True)
    sender.start()
    # When Ctrl-C arrives while run(handle_signals=False) blocks
    interrupted = False
    try:
        pc.run(handle_signals=False)
    except KeyboardInterrupt:
        interrupted = True
    sender.join()
    # Then, whether or not run() lets the interrupt out, the consumer is closed and what
    # finished is committed
    try:
        assert interrupted or pc.lifecycle is Lifecycle.CLOSED
        assert pc.lifecycle is Lifecycle.CLOSED
        assert cluster.committed("g", "t", 0) == (3, None)
    finally:
        pc.close()
