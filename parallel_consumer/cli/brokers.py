"""How a ``pc`` command talks to Kafka: the options every such command takes (``--bootstrap``,
``--config``, ``--command-config``, ``--timeout``), the clients' settings, and the one-line
error it ends with.

Security settings are given once, with ``--config KEY=VALUE`` or in a ``--command-config`` file
in the Kafka tools' properties format, and every client of the command gets them. A Java
client's ``sasl.jaas.config`` (PLAIN or SCRAM) becomes librdkafka's ``sasl.username`` and
``sasl.password``; secrets never appear in the command's output (see ``client_config.redacted``).

librdkafka's own log goes to the ``parallel_consumer.cli.kafka`` logger (the ``logger``
setting), not to stderr: an unreachable broker would otherwise print a line per reconnect
attempt. The logger keeps its last warning, which the command's error quotes; ``pc --verbose``
prints all of it.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from parallel_consumer._arguments import config_pair, properties_file, seconds
from parallel_consumer.client_config import hide_secrets

__all__ = [
    "DEFAULT_TIMEOUT",
    "LOG",
    "CommandError",
    "add_connection_arguments",
    "client_config",
    "describe_failure",
    "given_settings",
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
        help="a librdkafka client setting for every client (security, ...; repeatable; wins "
        "over --command-config)",
    )
    parser.add_argument(
        "--command-config",
        type=properties_file,
        default=[],
        metavar="FILE",
        help="client settings in a properties file, as the Kafka tools take it (a Java "
        "client's sasl.jaas.config with a username and password is understood)",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="how long to wait for the brokers' answer to any one request",
    )


def client_config(args: argparse.Namespace, **settings: Any) -> dict[str, Any]:
    """The settings of a client of ``args.bootstrap``: ``settings``, then the given ones."""
    return {"bootstrap.servers": args.bootstrap, "logger": LOG, **settings, **given_settings(args)}


#: ``username="..."`` / ``password="..."`` in a JAAS configuration (PLAIN, SCRAM).
_JAAS_OPTION = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


def given_settings(args: argparse.Namespace) -> dict[str, str]:
    """``--command-config``'s settings, then ``--config``'s; a ``sasl.jaas.config`` turned
    into ``sasl.username``/``sasl.password`` (librdkafka has no JAAS)."""
    settings = dict(getattr(args, "command_config", []) or [])
    settings.update(dict(args.config))
    jaas = settings.pop("sasl.jaas.config", None)
    if jaas is not None:
        options = {name: value.replace('\\"', '"') for name, value in _JAAS_OPTION.findall(jaas)}
        if not options:
            raise CommandError(
                'sasl.jaas.config has no username="..." password="..." (only PLAIN and '
                "SCRAM logins are understood); give sasl.username and sasl.password instead"
            )
        settings.setdefault("sasl.username", options.get("username", ""))
        settings.setdefault("sasl.password", options.get("password", ""))
    for key in [k for k in settings if k.startswith("ssl.truststore.")]:
        if key == "ssl.truststore.location":
            raise CommandError(
                "ssl.truststore.location is a Java client's setting: librdkafka reads the CA "
                "certificates from a PEM file, give it with ssl.ca.location"
            )
        del settings[key]  # its password or type: meaningless without the location
    return settings


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
        raise CommandError(
            hide_secrets(describe_failure(exc, bootstrap, timeout), settings)
        ) from exc


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
