"""The ``pc`` and ``pc-bench`` command lines without a broker: an unreachable broker ends every
command in one line, ``--version``, defaults in every ``--help``, and the ``--filter`` match."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

import parallel_consumer
from parallel_consumer import dead_letter as dl
from parallel_consumer.bench import cli as bench_cli
from parallel_consumer.cli import main
from parallel_consumer.cli.dlq_records import header_filter, matches

UNREACHABLE = "127.0.0.1:1"


@pytest.mark.parametrize(
    "argv",
    [
        ["pc", "offsets", "--group", "g"],
        ["pc", "offsets", "--group", "g", "--topic", "t"],
        ["pc", "dlq", "show", "orders.dlq"],
        ["pc", "dlq", "redrive", "--from", "orders.dlq"],
        ["pc", "demo"],
        ["pc-bench", "run", "W1", "--peers", "none"],
    ],
    ids=lambda argv: " ".join(argv[:3]),
)
def test_an_unreachable_broker_ends_each_command_in_one_line_with_exit_1(
    argv: list[str],
) -> None:
    # Given a command pointed at an address where no broker listens
    module = "parallel_consumer.cli.main" if argv[0] == "pc" else "parallel_consumer.cli.bench"
    extra = ["--bootstrap", UNREACHABLE]
    if argv[0] == "pc":
        extra += ["--timeout", "1"]
    # When it runs as a process (librdkafka writes to the process's stderr, not to sys.stderr)
    done = subprocess.run(
        [sys.executable, "-m", module, *argv[1:], *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    # Then it exits 1 with one line naming the address: no traceback, no librdkafka log lines
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1, done.stderr
    assert UNREACHABLE in lines[0]
    assert "Traceback" not in done.stderr
    assert "%3|" not in done.stderr


def test_verbose_prints_the_clients_log_lines_through_logging() -> None:
    argv = ["--verbose", "offsets", "--group", "g", "--bootstrap", UNREACHABLE, "--timeout", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "parallel_consumer.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 1
    logged = [line for line in done.stderr.splitlines() if "parallel_consumer.cli.kafka" in line]
    assert logged, done.stderr
    assert "Connection refused" in logged[0] or UNREACHABLE in logged[0]


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    assert parallel_consumer.__version__ == importlib.metadata.version("parallel-consumer")
    with pytest.raises(SystemExit) as exited:
        main.main(["--version"])
    assert exited.value.code == 0
    assert parallel_consumer.__version__ in capsys.readouterr().out


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def _with_defaults() -> Iterator[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    for top in (main._parser(), bench_cli._parser()):
        for parser in _parsers(top):
            for action in parser._actions:
                default = action.default
                if (
                    action.option_strings
                    and default not in (None, False, [], argparse.SUPPRESS)
                    and not isinstance(action, argparse._VersionAction | argparse._HelpAction)
                ):
                    yield parser.prog, parser, action


@pytest.mark.parametrize(
    ("prog", "parser", "action"),
    list(_with_defaults()),
    ids=[f"{prog} {a.option_strings[-1]}" for prog, _, a in _with_defaults()],
)
def test_help_shows_the_default_of_every_option_that_has_one(
    prog: str, parser: argparse.ArgumentParser, action: argparse.Action
) -> None:
    # Given an option with a default, When its command's --help is printed
    formatter = parser._get_formatter()
    formatter.add_argument(action)
    text = " ".join(formatter.format_help().split())
    # Then its line names the default
    shown = (
        ",".join(map(str, action.default)) if isinstance(action.default, list) else action.default
    )
    assert "default" in text, text
    assert str(shown) in text or "default:" not in text, text


@pytest.mark.parametrize(
    ("error_type", "wanted", "found"),
    [
        ("builtins.ValueError", "ValueError", True),
        ("builtins.ValueError", "builtins.ValueError", True),
        ("myapp.errors.ValueError", "ValueError", True),
        ("builtins.ValueError", "Error", False),
        ("builtins.ValueError", "KeyError", False),
        ("builtins.ValueError", "other.ValueError", False),
    ],
)
def test_an_error_type_filter_matches_the_bare_class_name_too(
    error_type: str, wanted: str, found: bool
) -> None:
    headers = [(dl.ERROR_TYPE, error_type.encode()), (dl.REASON, b"dead-letter")]
    assert matches(headers, [header_filter(f"error.type={wanted}")]) is found
    assert matches(headers, [header_filter(f"error.type={wanted}"), ("pc.dlq.reason", "x")]) is (
        False
    )
