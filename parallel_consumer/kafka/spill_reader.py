"""The reading side of the side topic of offset maps (``kafka/spill_store.py``): the one record a
committed reference names, fetched by an assign-only consumer; and the settings the side topic's
clients take from the consumer's. Owned by the poller thread, through the store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from parallel_consumer.kafka.client_log import ClientLog
from parallel_consumer.offsets import OffsetDecodeError
from parallel_consumer.offsets.spill import SpillReference

__all__ = ["READ_TIMEOUT", "SideReader", "client_log", "side_client_config"]

#: How long the restore of one partition waits for its side record before it replays instead.
READ_TIMEOUT = 5.0

#: Consumer settings a producer or an assign-only reader must not get (librdkafka would log
#: one warning per ignored property, or the reader would join the group).
_CONSUMER_ONLY = frozenset(
    {
        "group.instance.id",
        "partition.assignment.strategy",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "group.protocol",
        "group.protocol.type",
        "group.remote.assignor",
        "coordinator.query.interval.ms",
        "max.poll.interval.ms",
        "enable.auto.commit",
        "auto.commit.interval.ms",
        "enable.auto.offset.store",
        "queued.min.messages",
        "queued.max.messages.kbytes",
        "fetch.wait.max.ms",
        "fetch.queue.backoff.ms",
        "fetch.message.max.bytes",
        "max.partition.fetch.bytes",
        "fetch.max.bytes",
        "fetch.min.bytes",
        "fetch.error.backoff.ms",
        "isolation.level",
        "enable.partition.eof",
        "check.crcs",
        "auto.offset.reset",
        "on_commit",
        "group.id",
    }
)


def side_client_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of the side topic's producer and admin client: the consumer's connection
    and security settings, without what only a group member uses."""
    return {k: v for k, v in config.items() if k not in _CONSUMER_ONLY}


def client_log(client: str, settings: Mapping[str, Any]) -> ClientLog:
    servers = str(settings.get("bootstrap.servers"))
    return ClientLog(client, servers, reports_health=False)


class SideReader:
    """Reads single records of side topics for group ``group`` (a consumer made on first use
    from ``config`` by ``consumer_factory``, never joining the group)."""

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        group: str,
        consumer_factory: Callable[[dict[str, Any]], Any],
        name: str = "pc",
    ) -> None:
        self._config = dict(config)
        self._group = group
        self._consumer_factory = consumer_factory
        self._name = name
        self._reader: Any = None
        #: Side topics the reader found to exist.
        self._readable: set[str] = set()

    def read(self, ref: SpillReference) -> tuple[bytes | None, bytes | None]:
        """The key and value of the record at ``ref`` (read uncommitted, see _own_reader); raises
        OffsetDecodeError (the record cannot be had) or KafkaException."""
        reader = self._own_reader()
        if ref.topic not in self._readable:
            # A deleted side topic answers at once here, rather than after READ_TIMEOUT below.
            found = reader.list_topics(ref.topic, timeout=READ_TIMEOUT).topics.get(ref.topic)
            if found is None or found.error is not None or ref.partition not in found.partitions:
                raise OffsetDecodeError(f"{ref}: the side topic or partition does not exist")
            self._readable.add(ref.topic)
        reader.assign([KafkaTopicPartition(ref.topic, ref.partition, ref.offset)])
        try:
            deadline = time.monotonic() + READ_TIMEOUT
            while time.monotonic() < deadline:
                message = reader.poll(0.2)
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        raise OffsetDecodeError(f"{ref} is past the end of the side topic")
                    raise KafkaException(error)
                if message.offset() != ref.offset:
                    raise OffsetDecodeError(
                        f"{ref} is gone (compacted, aborted or deleted): the next record is at "
                        f"{message.offset()}"
                    )
                return message.key(), message.value()
            raise OffsetDecodeError(f"{ref} could not be read within {READ_TIMEOUT:.0f}s")
        finally:
            reader.unassign()

    def _own_reader(self) -> Any:
        if self._reader is None:
            settings = side_client_config(self._config)
            settings.update(
                {
                    "group.id": f"{self._group}.pc-offsets-reader",
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    # Not read_committed: that stops at the last stable offset of the one side
                    # partition, which another member's open (or killed) transaction holds
                    # back. A committed reference names a record whose transaction committed
                    # (the offsets commit with it), and the checksum proves it is that record.
                    "isolation.level": "read_uncommitted",
                    # A reference past the log's start or end is an error, never a reset.
                    "auto.offset.reset": "error",
                    # Each restore reads one record: a fetch the broker holds at the log's end
                    # (500 ms by default) would hold the next partition's restore as long.
                    "fetch.wait.max.ms": 10,
                }
            )
            said = client_log(f"{self._name} offset-map reader", settings)
            self._reader = self._consumer_factory(said.configure(settings))
        return self._reader

    def close(self) -> None:
        """Close the reader's client (on the poller thread, as it stops)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
