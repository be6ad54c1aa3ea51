"""How a ``pc`` command talks to Kafka: the options every such command takes (``--bootstrap``,
``--config``, ``--timeout``), the clients' settings, and the one-line error it ends with.

librdkafka's own log goes to the ``parallel_consumer.cli.kafka`` logger (the ``logger``
setting), not to stderr: an unreachable broker would otherwise print a line per reconnect
attempt. The logger keeps its last warning, which the command's error quotes; ``pc --verbose``
prints all of it.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from parallel_consumer._arguments import config_pair, seconds

__all__ = [
    "DEFAULT_TIMEOUT",
    "LOG",
    "CommandError",
    "add_connection_arguments",
    "client_config",
    "describe_failure",
    "reach",
]

#: Seconds a command waits for the brokers' answer to any one request.
DEFAULT_TIMEOUT = 10.0

LOG = logging.getLogger("parallel_consumer.cli.kafka")


class CommandError(Exception):
    """A command cannot go on; the message says why and what to do (printed as one line)."""


class _LastWarning(logging.Handler):
    """Remembers the last warning the clients logged, for the error a command ends with."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        # "FAIL [rdkafka#consumer-1] [thrd:...]: <what happened>": keep what happened.
        self.last = record.getMessage().split("]: ", 1)[-1]


_last = _LastWarning()
LOG.addHandler(_last)
# Quiet unless --verbose: the command's error says what went wrong, once.
LOG.propagate = False


def verbose() -> None:
    """Print every client log line (``pc --verbose``)."""
    LOG.propagate = True
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", required=True, help="the brokers, host:port[,...]")
    parser.add_argument(
        "--config",
        type=config_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka client setting for every client (security, ...; repeatable)",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="how long to wait for the brokers' answer to any one request",
    )


def client_config(args: argparse.Namespace, **settings: Any) -> dict[str, Any]:
    """The settings of a client of ``args.bootstrap``: ``settings``, then ``--config``."""
    return {"bootstrap.servers": args.bootstrap, "logger": LOG, **settings, **dict(args.config)}


def reach(bootstrap: str, timeout: float, config: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`CommandError` unless a broker at ``bootstrap`` answers a metadata request
    within ``timeout`` seconds: before a command starts, so it fails in one line instead of at
    its first wait, with whatever that wait would have thrown."""
    _last.last = None
    settings: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": LOG, **(config or {})}
    admin = AdminClient(settings)
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        admin.poll(0)  # serves the client's queued log lines: the last one is the reason
        raise CommandError(describe_failure(exc, bootstrap, timeout)) from exc


def describe_failure(exc: BaseException, bootstrap: str, timeout: float) -> str:
    """One line for a Kafka error or an unanswered wait, with the clients' last warning."""
    if isinstance(exc, KafkaException) and exc.args and hasattr(exc.args[0], "str"):
        text = f"Kafka at {bootstrap}: {exc.args[0].str()}"
    elif isinstance(exc, KafkaException):
        text = f"Kafka at {bootstrap}: {exc}"
    else:
        text = f"the brokers at {bootstrap} gave no answer within {timeout:g} s"
    if _last.last:
        text += f" (last client warning: {_last.last})"
    return f"{text}; check --bootstrap and --config, or give more --timeout"
