"""The README's main job (`pc demo`) works against a real broker and checks its own result."""

from __future__ import annotations

import pytest

from parallel_consumer.cli import demo


@pytest.mark.kafka_requires("commit_metadata")
def test_demo_processes_everything_in_order_and_commits_to_the_end(kafka, capsys):
    code = demo.main(["--bootstrap", kafka.bootstrap_servers, "--records", "600", "--keys", "20"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "per-key order kept: True" in out
    assert out.rstrip().endswith("OK")
