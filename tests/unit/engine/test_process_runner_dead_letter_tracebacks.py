"""A record dead-lettered from a worker process of ``runner="process"`` carries its handler's
traceback in ``pc.dlq.error.stacktrace`` too (issue 35, item 10): the worker has it, the parent
only gets the exception without its frames."""

from __future__ import annotations

from parallel_consumer import Options, PollContext
from parallel_consumer import dead_letter as dl


def fail_in_a_worker(ctx: PollContext) -> None:
    """Module level: the workers import it by name."""
    raise ValueError(f"cannot handle {ctx.offset}")


def test_a_dead_letter_from_a_worker_process_carries_the_handlers_traceback(
    harness, cluster, wait_until
):
    # Given a handler that fails in a worker process, and no retries
    cluster.create_topic("t")
    cluster.create_topic("dlq")
    cluster.produce("t", b"x")
    pc = harness.make(
        Options(runner="process", processes=1, max_retries=0, dead_letter_topic="dlq")
    )
    pc.poll(fail_in_a_worker)
    try:
        wait_until(lambda: len(cluster.records("dlq")) == 1, timeout=30)
    finally:
        pc.close()
    # Then its dead letter names the error and carries the traceback down to the handler
    info = dl.read_dead_letter(cluster.records("dlq")[0].headers())
    assert info is not None
    assert info.error_type == "builtins.ValueError"
    assert "fail_in_a_worker" in info.error_stacktrace
