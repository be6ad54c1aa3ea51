"""WorkItem: one record's processing state (the Java library's WorkContainer)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

__all__ = ["TopicPartition", "WorkItem"]

#: (topic, partition): the engine's hashable partition key.
TopicPartition = tuple[str, int]


class WorkItem:
    """A polled record and what happened to it so far.

    Owned by the controller thread. ``epoch`` is the assignment epoch the record was polled in;
    a result whose item epoch differs from its partition's current epoch is stale and dropped.
    """

    __slots__ = (
        "attempts",
        "epoch",
        "first_failure_at",
        "in_flight",
        "last_failure",
        "last_failure_at",
        "message",
        "offset",
        "shard_key",
        "tp",
    )

    def __init__(self, message: Any, tp: TopicPartition, shard_key: object, epoch: int) -> None:
        self.message = message
        self.tp = tp
        self.offset: int = message.offset()
        self.shard_key = shard_key
        self.epoch = epoch
        #: Failed attempts so far.
        self.attempts = 0
        self.last_failure: BaseException | None = None
        self.last_failure_at: datetime | None = None
        #: When the first failed attempt ended (UTC); for the dead letter's headers.
        self.first_failure_at: datetime | None = None
        self.in_flight = False

    def __repr__(self) -> str:
        state = "in-flight" if self.in_flight else "waiting"
        return (
            f"<WorkItem {self.tp[0]}[{self.tp[1]}]@{self.offset} epoch={self.epoch} "
            f"attempts={self.attempts} {state}>"
        )
