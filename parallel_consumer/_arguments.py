"""What every command line of this package shares: the parser whose ``--help`` shows each
option's default, and the argument types (``key=value`` pairs, whole numbers, seconds)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["Parser", "config_pair", "non_negative", "positive", "seconds"]


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
