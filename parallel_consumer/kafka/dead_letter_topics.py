"""The dead-letter topics, prepared when processing starts: which topic each subscribed topic's
dead letters go to (:func:`dead_letter_topics`), and checking or creating them through an admin
client (:func:`prepare_topics`). Used by the consumer when it starts and by the Spark runner when
a query starts; the records written there carry the headers of :mod:`parallel_consumer.dead_letter`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.cimpl import NewTopic

from parallel_consumer.client_config import hide_secrets
from parallel_consumer.dead_letter import default_topic
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.kafka.client_log import ClientLog
from parallel_consumer.options import Options

__all__ = ["ADMIN_TIMEOUT", "admin_config", "dead_letter_topics", "prepare_topics"]

log = logging.getLogger("parallel_consumer")

#: Seconds allowed for reading topic metadata and creating a topic at start.
ADMIN_TIMEOUT = 15.0
#: Producer settings an admin client must not inherit.
_PRODUCER_ONLY = ("transactional.id", "transaction.timeout.ms", "enable.idempotence")


def dead_letter_topics(options: Options, topics: Iterable[str]) -> dict[str, str]:
    """Input topic -> its dead-letter topic, for the subscribed names. A ``^regex``
    subscription needs ``Options.dead_letter_topic``: the topics it will match are unknown."""
    out: dict[str, str] = {}
    for topic in topics:
        if options.dead_letter_topic is not None:
            out[topic] = options.dead_letter_topic
        elif topic.startswith("^"):
            raise ConfigurationError(
                f"dead-lettering is on and the subscription {topic!r} is a regex: set "
                "Options.dead_letter_topic (the '<topic>.dlq' default needs topic names, so that "
                "the dead-letter topics can be checked or created at start)"
            )
        else:
            out[topic] = default_topic(topic)
    looping = sorted(t for t in out.values() if t in out)
    if looping:
        raise ConfigurationError(
            f"the dead-letter topic {looping[0]!r} is also subscribed: its dead letters would be "
            "consumed (and could be dead-lettered) again; set Options.dead_letter_topic to a "
            "topic this consumer does not read"
        )
    for pattern in (t for t in out if t.startswith("^")):
        matched = sorted(t for t in set(out.values()) if _matches(pattern, t))
        if matched:
            raise ConfigurationError(
                f"the dead-letter topic {matched[0]!r} is also subscribed (the subscription "
                f"{pattern!r} matches it): its dead letters would be consumed (and could be "
                "dead-lettered) again; set Options.dead_letter_topic to a topic the regex does "
                "not match, or narrow the regex"
            )
    return out


def _matches(pattern: str, topic: str) -> bool:
    """Whether the ``^regex`` subscription ``pattern`` matches ``topic``, as the client's regex
    (unanchored at the end, like POSIX ``regexec``) would; a pattern Python cannot compile is
    left to the client."""
    try:
        return re.search(pattern, topic) is not None
    except re.error:
        return False


def admin_config(producer_config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in producer_config.items() if k not in _PRODUCER_ONLY}


def _list_topics(admin: Any, said: ClientLog) -> Any:
    """The cluster's topics, asked for in short waits up to ``ADMIN_TIMEOUT``: between them
    the admin client's queued errors are served, so that a refused login ends the wait at
    once (it would only time out) and says why."""
    deadline = time.monotonic() + ADMIN_TIMEOUT
    while True:
        try:
            return admin.list_topics(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
        except KafkaException:
            with contextlib.suppress(Exception):
                admin.poll(0)  # (error_cb: a refusal lands in said.refusals)
            if said.refusals or time.monotonic() >= deadline:
                raise


def prepare_topics(
    admin_factory: Callable[[dict[str, Any]], Any],
    config: Mapping[str, Any],
    topics: Mapping[str, str],
) -> None:
    """Make sure every dead-letter topic exists: create the missing ones with as many
    partitions as their input topic (and the broker's default replication). Raises a
    ConfigurationError naming the topic when one is missing and cannot be created."""
    settings = admin_config(config)
    servers = str(settings.get("bootstrap.servers"))
    said = ClientLog("dead-letter admin", servers, reports_health=False)
    try:
        admin = admin_factory(said.configure(settings))
        metadata = _list_topics(admin, said)
    except Exception as exc:
        why = "; ".join(said.refusals.texts) or str(exc)
        raise ConfigurationError(
            hide_secrets(
                f"could not read the topics of the cluster to check the dead-letter topics "
                f"({', '.join(sorted(set(topics.values())))}): {why}",
                settings,
            )
        ) from exc
    known = {name: t for name, t in metadata.topics.items() if t.error is None}
    missing: dict[str, int] = {}
    for source, target in topics.items():
        if target in known or target in missing:
            continue
        source_meta = known.get(source)
        if source_meta is None and not source.startswith("^") and target == default_topic(source):
            # A subscribed topic that does not exist (a typo?): its '<topic>.dlq' is not
            # created, so a misspelled name leaves nothing behind in the cluster.
            log.warning(
                "subscribed topic %r does not exist: its dead-letter topic %r is not created "
                "(a record of it that is dead-lettered waits until %r exists)",
                source,
                target,
                target,
            )
            continue
        missing[target] = len(source_meta.partitions) if source_meta is not None else 1
    if not missing:
        return
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=count) for name, count in missing.items()],
        request_timeout=ADMIN_TIMEOUT,
    )
    for name, future in futures.items():
        try:
            future.result(ADMIN_TIMEOUT)
        except Exception as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise ConfigurationError(
                f"the dead-letter topic {name!r} does not exist and could not be created "
                f"({exc}); create it, or set Options.dead_letter_topic to a topic that exists "
                "(see docs/dead-letters.md)"
            ) from exc
        log.info("created the dead-letter topic %s (%d partitions)", name, missing[name])
