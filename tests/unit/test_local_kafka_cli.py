"""The ``pc`` and ``pc-bench`` command lines, without starting a broker."""

from __future__ import annotations

import pytest

from parallel_consumer.cli import bench, main


@pytest.mark.parametrize(("command", "missing"), [("offsets", "--bootstrap"), ("dlq", "ACTION")])
def test_commands_without_their_required_arguments_exit_2_naming_them(
    command: str, missing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main.main([command])
    assert exited.value.code == 2
    assert missing in capsys.readouterr().err


def test_config_overrides_must_be_key_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main.main(["kafka", "start", "--config", "no-equals-sign"])
    assert exited.value.code == 2
    assert "expected key=value" in capsys.readouterr().err


def test_kafka_start_reports_a_broker_error_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main.main(["kafka", "start", "--backend", "apache"]) == 1
    assert "Java was not found" in capsys.readouterr().err


def test_pc_bench_is_the_benchmark_cli(capsys: pytest.CaptureFixture[str]) -> None:
    # (its behaviour is tested in tests/unit/bench/)
    assert bench.main(["list"]) == 0
    assert "W1 " in capsys.readouterr().out
