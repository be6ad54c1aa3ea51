"""The poller a consumer group or a share group needs: the one place that picks between
:class:`~parallel_consumer.kafka.poller.Poller` (a consumer group: offsets, maps, the side topic
of maps over the limit) and :class:`~parallel_consumer.kafka.share.poller.SharePoller` (a share
group: acknowledgements, nothing committed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer

from parallel_consumer._events import ControllerEvent
from parallel_consumer.kafka.poller import Poller
from parallel_consumer.kafka.share.poller import SharePoller
from parallel_consumer.kafka.spill_store import spill_store_for
from parallel_consumer.options import Options

__all__ = ["make_poller"]

Factory = Callable[[dict[str, Any]], Any]


def _share_consumer(config: dict[str, Any]) -> Any:
    from confluent_kafka import ShareConsumer

    return ShareConsumer(config)


def make_poller(
    options: Options,
    config: dict[str, Any],
    *,
    post: Callable[[ControllerEvent], None],
    name: str,
    consumer_factory: Factory | None,
    producer_factory: Factory,
    admin_factory: Factory,
) -> Poller | SharePoller:
    """The poller of ``options.group_protocol``, its clients made by ``consumer_factory``
    (confluent-kafka's ``Consumer`` or ``ShareConsumer`` when None)."""
    if options.share_group:
        return SharePoller(
            consumer_factory or _share_consumer,
            config,
            post=post,
            limit=options.buffer_limit,
            fetch_batch=options.fetch_batch_size,
            name=name,
        )
    return Poller(
        consumer_factory or Consumer,
        config,
        post=post,
        limit=options.buffer_limit,
        fetch_batch=options.fetch_batch_size,
        name=name,
        spill=spill_store_for(
            options,
            config,
            producer_factory=producer_factory,
            consumer_factory=consumer_factory or Consumer,
            admin_factory=admin_factory,
            name=name,
        ),
    )
