"""The librdkafka settings of the clients a ParallelConsumer opens: checked once, with the
library's defaults applied (the group consumer's and the output producer's).

The connection settings (:func:`connection_settings`: the brokers, the security protocol, SASL
and TLS) are given once, in the consumer's configuration; every other client the library opens
(the output and dead-letter producer, the transactional producer, the admin client that checks
dead-letter topics, the exact committed-offset reader) inherits them unless its own
configuration sets them. :func:`redacted` and :func:`hide_secrets` keep the secrets among them
out of anything printed or logged."""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Mapping
from typing import Any

from parallel_consumer.errors import ConfigurationError
from parallel_consumer.options import Options

__all__ = [
    "FETCH_QUEUE_BACKOFF_MS",
    "REDACTED",
    "checked_consumer_config",
    "checked_producer_config",
    "connection_settings",
    "hide_secrets",
    "is_secret",
    "redacted",
]

#: Producer settings the library relies on: delivery reports for every output.
_RESERVED_PRODUCER_SETTINGS = ("on_delivery", "delivery.report.only.error", "dr_cb", "dr_msg_cb")

#: The consumer's ``fetch.queue.backoff.ms`` unless ``consumer_config`` sets it (see
#: ``checked_consumer_config``).
FETCH_QUEUE_BACKOFF_MS = 20


#: How a client reaches and authenticates to the brokers: handed from the consumer's
#: configuration to every other client the library opens.
_CONNECTION_SETTINGS = frozenset(
    {
        "bootstrap.servers",
        "security.protocol",
        "broker.address.family",
        "client.dns.lookup",
        "client.rack",
        "enable.ssl.certificate.verification",
        "enable.sasl.oauthbearer.unsecure.jwt",
        "oauth_cb",
        "socket.keepalive.enable",
        "socket.connection.setup.timeout.ms",
    }
)
_CONNECTION_PREFIXES = ("sasl.", "ssl.", "ssl_", "https.")

#: What a secret's value is shown as.
REDACTED = "[redacted]"
#: Parts of a setting's name that mark its value as a secret (passwords, keys, client
#: secrets, JAAS configurations, a Schema Registry's user info).
_SECRET_MARKS = (
    "password",
    "secret",
    "key.pem",
    "ssl_key",
    "jaas",
    "oauthbearer.config",
    "user.info",
)


def connection_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of ``config`` that say how to reach and log in to the brokers."""
    return {
        key: value
        for key, value in config.items()
        if key in _CONNECTION_SETTINGS or key.startswith(_CONNECTION_PREFIXES)
    }


def is_secret(key: str) -> bool:
    """Whether the value of the setting ``key`` must never be shown."""
    name = key.lower()
    return any(mark in name for mark in _SECRET_MARKS)


def redacted(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with the value of every secret setting replaced by ``REDACTED``: for
    anything that prints or logs a configuration."""
    return {key: REDACTED if is_secret(str(key)) else value for key, value in config.items()}


def hide_secrets(text: str, *configs: Mapping[str, Any]) -> str:
    """``text`` (an error message, say) with the value of every secret setting of ``configs``
    replaced by ``REDACTED``, wherever it appears."""
    for config in configs:
        for key, value in config.items():
            if is_secret(str(key)) and isinstance(value, str) and value:
                text = text.replace(value, REDACTED)
    return text


def checked_consumer_config(config: object) -> dict[str, Any]:
    if not isinstance(config, Mapping):
        raise ConfigurationError(
            f"consumer_config must be a dict of librdkafka settings, got {type(config).__name__}"
        )
    result = dict(config)
    group = result.get("group.id")
    if not isinstance(group, str) or not group:
        raise ConfigurationError(
            "consumer_config needs 'group.id': committed offsets and offset maps belong to a "
            "consumer group"
        )
    if not result.get("bootstrap.servers"):
        raise ConfigurationError("consumer_config needs 'bootstrap.servers' (host:port[,...])")
    auto_commit = result.get("enable.auto.commit", False)
    if str(auto_commit).strip().lower() not in ("false", "0"):
        raise ConfigurationError(
            "consumer_config sets 'enable.auto.commit' to true: ParallelConsumer commits offsets "
            "itself (with the map of finished records), so remove it or set it to False"
        )
    if "on_commit" in result:
        raise ConfigurationError(
            "consumer_config sets 'on_commit': ParallelConsumer needs that callback to know "
            "when commits are acknowledged; read commit counts from statistics() instead"
        )
    result["enable.auto.commit"] = False
    # The engine stops reading while its buffer is full (back-pressure). librdkafka then finds
    # its prefetch queue over its thresholds and by default waits a whole second before it
    # fetches again (fetch.queue.backoff.ms=1000): the records stop for up to a second each
    # time the buffer fills. A short backoff keeps them coming; a user's setting wins.
    result.setdefault("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS)
    return result


def checked_producer_config(
    config: Mapping[str, Any] | None, consumer_config: Mapping[str, Any], options: Options
) -> dict[str, Any]:
    """The producer's settings: the connection settings (brokers, security) from the
    consumer's unless given, idempotence on unless turned off, and, in the transactional
    mode, a ``transactional.id`` derived per instance from the given prefix."""
    result = dict(config or {})
    for name in _RESERVED_PRODUCER_SETTINGS:
        if name in result:
            raise ConfigurationError(
                f"producer_config sets {name!r}: the library needs a delivery report for every "
                "output; use poll_and_produce(on_produced=...) to see them"
            )
    for key, value in connection_settings(consumer_config).items():
        result.setdefault(key, value)
    result.setdefault("enable.idempotence", True)
    prefix = result.get("transactional.id")
    if options.transactional:
        if not isinstance(prefix, str) or not prefix:
            raise ConfigurationError(
                "CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER needs producer_config="
                "{'transactional.id': '<prefix>'}: each instance derives its own id from it "
                "(see docs/exactly-once.md)"
            )
        result["transactional.id"] = _transactional_id(prefix, consumer_config)
        # A transaction stays open for commit_interval; if its instance dies, the broker
        # aborts it after this long (read_committed readers wait for it until then).
        result.setdefault("transaction.timeout.ms", 10_000)
    elif prefix is not None:
        raise ConfigurationError(
            "producer_config sets 'transactional.id', which only "
            "CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER uses; remove it or choose that mode"
        )
    return result


def _transactional_id(prefix: str, consumer_config: Mapping[str, Any]) -> str:
    """``<prefix>-<group.instance.id>`` when the consumer has a static identity: stable across
    restarts, so a restarted instance aborts its predecessor's open transaction at once.
    Otherwise ``<prefix>-<host>-<pid>-<n>``: unique, and zombies are still fenced through the
    consumer group's generation (KIP-447)."""
    instance = consumer_config.get("group.instance.id")
    if isinstance(instance, str) and instance:
        return f"{prefix}-{instance}"
    return f"{prefix}-{socket.gethostname()}-{os.getpid()}-{next(_transactional_ids)}"


_transactional_ids = itertools.count(1)
