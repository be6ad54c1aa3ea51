"""A share group's settings, read once at start through an admin client: the acquisition lock
(a call may not outlive it) and the broker's delivery limit (a record delivered that often is
archived by the broker, never dead-lettered by us). Also where a broker without share groups is
told apart from a slow one: a clear error at start, not an idle consumer."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from parallel_consumer.errors import ConfigurationError
from parallel_consumer.kafka.client_log import ClientLog
from parallel_consumer.options import Options

__all__ = ["LOCK_DURATION_DEFAULT", "ShareGroupSettings", "check_share_group", "read_settings"]

log = logging.getLogger("parallel_consumer")

#: ``group.share.record.lock.duration.ms``'s default, in seconds.
LOCK_DURATION_DEFAULT = 30.0
#: ``group.share.delivery.count.limit``'s default.
DELIVERY_LIMIT_DEFAULT = 5
#: Seconds allowed for reading the group's configuration at start.
ADMIN_TIMEOUT = 15.0
#: Settings of the consumer_config an admin client must not get.
_CONSUMER_ONLY = ("group.id", "enable.auto.commit", "auto.offset.reset", "fetch.queue.backoff.ms")


@dataclass(frozen=True, slots=True)
class ShareGroupSettings:
    #: How long the broker keeps a delivered record locked to its member (seconds).
    lock_duration: float
    #: Deliveries after which the broker archives a record instead of delivering it again.
    delivery_limit: int
    #: ``share.auto.offset.reset`` of the group (``latest`` unless set).
    auto_offset_reset: str


def read_settings(
    admin_factory: Callable[[dict[str, Any]], Any], consumer_config: Mapping[str, Any]
) -> ShareGroupSettings:
    """The group's share settings (its own configuration, which falls back to the broker's)."""
    from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

    group = str(consumer_config["group.id"])
    settings = {k: v for k, v in consumer_config.items() if k not in _CONSUMER_ONLY}
    said = ClientLog("share-group admin", str(settings.get("bootstrap.servers")))
    admin = admin_factory(said.configure(settings))
    resource = ConfigResource(ResourceType.GROUP, group)
    try:
        entries = admin.describe_configs([resource], request_timeout=ADMIN_TIMEOUT)[resource]
        configs = entries.result(timeout=ADMIN_TIMEOUT)
    except Exception as exc:
        raise ConfigurationError(
            f"could not read the configuration of share group {group!r} ({exc}); share groups "
            "need Apache Kafka 4.2 or later with share groups enabled"
        ) from exc
    if "share.record.lock.duration.ms" not in configs:
        raise ConfigurationError(
            f"the broker has no share groups (group {group!r} has no share.* settings): "
            "share groups (KIP-932) need Apache Kafka 4.2 or later, with share.version enabled"
        )

    def value(name: str, default: str) -> str:
        entry = configs.get(name)
        return default if entry is None or entry.value is None else str(entry.value)

    return ShareGroupSettings(
        lock_duration=int(value("share.record.lock.duration.ms", "30000")) / 1000.0,
        delivery_limit=int(value("share.delivery.count.limit", str(DELIVERY_LIMIT_DEFAULT))),
        auto_offset_reset=value("share.auto.offset.reset", "latest"),
    )


def check_share_group(options: Options, settings: ShareGroupSettings) -> None:
    """Refuse what the group cannot do: a deadline beyond the acquisition lock, more attempts
    than the broker delivers a record."""
    timeout = options.processing_timeout
    if timeout is not None and timeout > settings.lock_duration:
        raise ConfigurationError(
            f"Options.processing_timeout={timeout:g}s is above the share group's acquisition "
            f"lock ({settings.lock_duration:g}s, share.record.lock.duration.ms): the broker would "
            "hand the record to another member while its call still runs. Lower the deadline, "
            "or raise the group's share.record.lock.duration.ms (at most "
            "group.share.max.record.lock.duration.ms)"
        )
    limit = settings.delivery_limit
    if options.max_retries is not None and options.max_retries + 1 > limit:
        raise ConfigurationError(
            f"Options.max_retries={options.max_retries} needs {options.max_retries + 1} "
            f"deliveries, but the share group delivers a record at most {limit} times "
            "(share.delivery.count.limit) and then archives it without a dead letter: set "
            f"max_retries <= {limit - 1} or raise the group's share.delivery.count.limit"
        )
    if options.max_retries is None:
        log.warning(
            "share group: max_retries is None but the broker delivers a record at most %d times "
            "(share.delivery.count.limit) and then archives it, without a dead letter; set "
            "max_retries <= %d to dead-letter it instead",
            limit,
            limit - 1,
        )
    if settings.auto_offset_reset == "latest":
        log.info(
            "share group: share.auto.offset.reset is 'latest': a new group starts at the end of "
            "the topic (set it to 'earliest' in the group's configuration to read from the start)"
        )
