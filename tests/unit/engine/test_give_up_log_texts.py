"""The log line for a record given up on reads as English and carries the handler's traceback
(issue 35, items 10 and 11: no ``skipped (skipped (...))``, no ``1 failed attempts``)."""

from __future__ import annotations

import logging

from parallel_consumer import Options, PollContext


def test_a_record_skipped_after_one_failed_attempt_is_logged_in_plain_words(
    harness, cluster, wait_until, caplog
):
    # Given a record whose first attempt fails and no retries, skipped when exhausted
    cluster.create_topic("t")
    cluster.produce("t", b"x")

    def handle(ctx: PollContext) -> None:
        raise ValueError("boom")

    pc = harness.make(Options(max_retries=0, on_retries_exhausted="skip"))
    with caplog.at_level(logging.INFO, logger="parallel_consumer"):
        pc.poll(handle)
        wait_until(lambda: cluster.committed("g", "t", 0) == (1, None))
        pc.close()
    [line] = [r.getMessage() for r in caplog.records if "t[0]@0 skipped" in r.getMessage()]
    # Then the line says it once, with the right number
    assert "1 failed attempts" not in line
    assert "skipped (skipped" not in line


def _fails_in_a_named_frame(ctx: PollContext) -> None:
    raise ValueError("boom")


def _logged_text(record: logging.LogRecord) -> str:
    text = record.getMessage()
    if record.exc_info:
        text += "\n" + logging.Formatter().formatException(record.exc_info)
    return text


def test_the_final_failure_is_logged_with_the_handlers_traceback(
    harness, cluster, wait_until, caplog
):
    # Given a record that fails for good (no retries, skipped when exhausted)
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    pc = harness.make(Options(max_retries=0, on_retries_exhausted="skip"))
    with caplog.at_level(logging.INFO, logger="parallel_consumer"):
        pc.poll(_fails_in_a_named_frame)
        wait_until(lambda: cluster.committed("g", "t", 0) == (1, None))
        pc.close()
    # Then its log line carries the traceback, down to the handler's frame (issue 35, item 10)
    [record] = [r for r in caplog.records if "t[0]@0 skipped" in r.getMessage()]
    text = _logged_text(record)
    assert "Traceback" in text
    assert "_fails_in_a_named_frame" in text
