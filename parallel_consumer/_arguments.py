"""What every command line of this package shares: the parser whose ``--help`` shows each
option's default, and the argument types (``key=value`` pairs, a properties file, whole
numbers, seconds)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

__all__ = [
    "Parser",
    "config_pair",
    "non_negative",
    "parse_properties",
    "positive",
    "properties_file",
    "seconds",
]


class _DefaultsFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help, unless the help already names its default
    or there is none worth showing (None, False, an empty list: the option is simply off)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or not action.option_strings
            or default is None
            or default is False
            or default == []
            or default is argparse.SUPPRESS
        ):
            return text
        shown = ",".join(str(d) for d in default) if isinstance(default, list) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})".lstrip()


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose help shows defaults; its subcommands' parsers are too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)


def config_pair(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (a librdkafka or broker setting) as a pair."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def properties_file(path: str) -> list[tuple[str, str]]:
    """The settings of a Java ``.properties`` file (the Kafka tools' ``--command-config``)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path!r}: {exc.strerror}") from None
    return parse_properties(text)


#: The separator of a properties line: the first unescaped '=' or ':', or whitespace.
_SEPARATOR = re.compile(r"(?<!\\)(?:\s*[=:]\s*|\s+)")
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str) -> list[tuple[str, str]]:
    """``key=value`` (or ``key: value``, ``key value``) lines in the order given; ``#`` and
    ``!`` comments, a trailing backslash continuing a line, and backslash escapes as Java's
    ``Properties.load`` reads them."""
    pairs: list[tuple[str, str]] = []
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip() if logical else raw.strip()
        if not logical and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:  # an odd number of backslashes: the line goes on
            logical += line[:-1]
            continue
        logical += line
        match = _SEPARATOR.search(logical)
        key, value = (logical[: match.start()], logical[match.end() :]) if match else (logical, "")
        pairs.append((_unescape(key), _unescape(value)))
        logical = ""
    if logical:
        match = _SEPARATOR.search(logical)
        key, value = (logical[: match.start()], logical[match.end() :]) if match else (logical, "")
        pairs.append((_unescape(key), _unescape(value)))
    return pairs


def _unescape(text: str) -> str:
    return re.sub(
        r"\\(u[0-9a-fA-F]{4}|.)",
        lambda m: chr(int(m[1][1:], 16)) if len(m[1]) == 5 else _ESCAPES.get(m[1], m[1]),
        text,
    )


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 up, got {text}")
    return value


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 up, got {text}")
    return value


def seconds(text: str) -> float:
    """A timeout: seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {text}")
    return value
