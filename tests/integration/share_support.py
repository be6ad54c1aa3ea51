"""Helpers of the share-group tests: a share group that starts at the earliest offset."""

from __future__ import annotations

from typing import Any

from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)


def share_config(bootstrap: str, group: str, **group_configs: str) -> dict[str, Any]:
    """consumer_config of a share group reading from the earliest offset (a new share group
    starts at the latest one unless its group config says otherwise), with ``group_configs``
    (``share.record.lock.duration.ms`` ...) set on the group."""
    settings = {"share.auto.offset.reset": "earliest", **group_configs}
    entries = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in settings.items()
    ]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    return {"bootstrap.servers": bootstrap, "group.id": group}
