"""pc-bench's answers to bad input: one clear line each, and the other contestants still run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from parallel_consumer.bench import cli, kafka_io
from parallel_consumer.bench.contestants import java_pc, pyrallel
from parallel_consumer.testing._broker_process import free_port


@pytest.fixture(autouse=True)
def _answer_fast(monkeypatch):
    # A closed port refuses at once, but the client retries until the timeout.
    monkeypatch.setattr(kafka_io, "REACH_TIMEOUT", 0.5)


def test_an_unknown_workload_is_one_line_naming_the_known_ones(capsys):
    assert cli.main(["run", "W9"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "unknown workload W9" in err
    assert "W1, W1b, W2" in err


def test_an_unknown_peer_is_one_line(capsys):
    assert cli.main(["run", "W1", "--peers", "serial,kafka-streams"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "pc-bench: unknown peer kafka-streams; known: "
        "pc-otel, pc-loop, serial, raw, asyncio, pyrallel, share, pc-share, java-pc"
    )


def test_an_unreachable_bootstrap_is_one_line(capsys):
    port = free_port()
    assert cli.main(["run", "W1", "--peers", "none", "--bootstrap", f"127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"pc-bench: no Kafka broker answers at 127.0.0.1:{port}")


def test_without_java_the_java_peer_is_skipped_with_a_reason(monkeypatch):
    monkeypatch.setattr(java_pc.shutil, "which", lambda tool: None)
    reason = java_pc.JavaParallelConsumerContestant().unavailable()
    assert reason == "java-pc needs java and mvn on PATH (Java 17+ and Maven)"


def test_without_pyrallel_the_pyrallel_peer_is_skipped_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyrallel_consumer", None)  # import raises ImportError
    reason = pyrallel.PyrallelContestant().unavailable()
    assert reason == (
        "pyrallel-consumer is not installed "
        "(pip install --ignore-requires-python pyrallel-consumer)"
    )


def test_skipped_peers_are_named_and_the_run_goes_on_to_the_broker(monkeypatch, capsys):
    # Given neither Java nor pyrallel-consumer here
    monkeypatch.setattr(java_pc.shutil, "which", lambda tool: None)
    monkeypatch.setitem(sys.modules, "pyrallel_consumer", None)

    # When a run names them (against a broker that is not there, to stay fast)
    code = cli.main(
        [
            "run",
            "W1",
            "--peers",
            "java-pc,pyrallel,serial",
            "--bootstrap",
            f"127.0.0.1:{free_port()}",
        ]
    )

    # Then each is skipped in one line and the run still went on to the broker
    captured = capsys.readouterr()
    assert "java-pc skipped: java-pc needs java and mvn on PATH" in captured.out
    assert "pyrallel skipped: pyrallel-consumer is not installed" in captured.out
    assert "serial skipped" not in captured.out
    assert code == 1
    assert "no Kafka broker answers" in captured.err


def test_list_names_every_workload_and_contestant(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("W1", "W1b", "W2", "W3", "W4", "W5", "W6", "pc", "java-pc", "share"):
        assert f"  {name} " in out


def test_plot_of_a_missing_file_fails_in_one_line(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path / "nothing.json")]) == 1
    assert capsys.readouterr().err.strip() == f"pc-bench: no such file: {tmp_path}/nothing.json"


def test_the_help_points_at_a_page_that_exists(capsys):
    # Given pc-bench's top-level help
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    help_text = capsys.readouterr().out
    # Then every document it names is in the repository
    root = Path(__file__).resolve().parents[3]
    named = [word.strip("().,") for word in help_text.split() if word.strip("().,").endswith(".md")]
    assert named, help_text
    for page in named:
        assert (root / page).is_file(), f"pc-bench --help names {page}, which does not exist"
