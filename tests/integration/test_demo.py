"""The README's main job (`pc demo`) works against a real broker and checks its own result."""

from __future__ import annotations

import logging
import re

import pytest

from parallel_consumer.cli import demo

#: The library's warning for one failed attempt of one record: "<topic>[<p>]@<o> failed (attempt
#: <n>), retrying in ...".
PER_RECORD_RETRY = re.compile(r"\(attempt \d+\)")


@pytest.mark.kafka_requires("commit_metadata")
def test_demo_processes_everything_in_order_and_commits_to_the_end(kafka, capsys, caplog):
    # Given a demo whose handler fails the first attempt of about 120 of its 600 records
    caplog.set_level(logging.WARNING)

    # When it runs
    code = demo.main(
        [
            "--bootstrap",
            kafka.bootstrap_servers,
            "--records",
            "600",
            "--keys",
            "20",
            "--failure-rate",
            "0.2",
        ]
    )

    # Then everything was processed in key order and committed
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, out
    assert "per-key order kept: True" in out
    assert out.rstrip().endswith("OK")
    # And the retries were counted, not printed one line per record: none failed twice, so not
    # one of the ~120 per-attempt warnings is shown (whether printed or sent to logging)
    retried = int(re.search(r"retried after failures: (\d+)", out).group(1))
    assert retried > 20, out
    assert re.search(r"retries +\d+", out), out
    shown = [
        line
        for line in [*out.splitlines(), *captured.err.splitlines(), *caplog.messages]
        if PER_RECORD_RETRY.search(line)
    ]
    assert len(shown) < 5, "\n".join(shown[:20])
