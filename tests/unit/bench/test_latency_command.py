"""``pc-bench latency``'s answers to bad input: one line each, exit status 2, no broker."""

from __future__ import annotations

import pytest

from parallel_consumer.bench import cli


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--loads", "0.5,abc"], "--loads: could not convert string to float: 'abc'"),
        (["--loads", "0"], "--loads takes fractions of the capacity"),
        (["--loads", "3"], "--loads takes fractions of the capacity"),
        (["--repeat", "0"], "--repeat must be 1 or more"),
        (
            ["--peers", "pc-otel"],
            "unknown peer pc-otel; L1 knows java-pc, pyrallel, share, serial, raw",
        ),
        (["--peers", "pc"], "unknown peer pc"),
    ],
)
def test_bad_latency_arguments_are_one_line_each(argv, message, capsys):
    assert cli.main(["latency", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert message in err


def test_the_latency_command_is_listed_in_the_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "latency" in capsys.readouterr().out
