"""Which subscribed topics the cluster does not have (pure: the poller asks the client).

A subscription to a topic that does not exist consumes nothing and raises nothing: librdkafka
waits for the topic to appear. A typo then looks like an idle consumer. While any subscribed
name (or ``^regex``) matches no topic, the poller reads the cluster's topic list every
:data:`CHECK_EVERY` seconds and hands the names to :meth:`MissingTopics.observe`; once every
subscription matches, it stops asking. ``health()`` reports a subscription that matches no topic
at all after ``health.MISSING_TOPICS_UNHEALTHY_AFTER``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["CHECK_EVERY", "MissingTopics"]

log = logging.getLogger("parallel_consumer")

#: Seconds between two reads of the cluster's topics while a subscription matches none.
CHECK_EVERY = 5.0
#: Longest a read of the topic list may block the poller.
LIST_TIMEOUT = 0.5


class MissingTopics:
    """The subscriptions (names or ``^regex``) that match no topic of the cluster, and since
    when. Owned by the poller thread; :attr:`missing` and :attr:`since` may be read anywhere."""

    def __init__(self, subscriptions: Sequence[str]) -> None:
        self._subscriptions = tuple(subscriptions)
        self._next_check = 0.0
        self._warned: set[str] = set()
        #: Subscriptions that matched no topic at the last check.
        self.missing: tuple[str, ...] = ()
        #: When every subscription started to match nothing (None: something matches).
        self.since: float | None = None
        self._done = not self._subscriptions

    def due(self, now: float) -> bool:
        return not self._done and now >= self._next_check

    def check(self, client: Any, now: float) -> None:
        """When due, read the topic list through ``client`` and observe it (a client that
        cannot answer is asked again later: an outage is ClientLog's to report)."""
        if not self.due(now):
            return
        try:
            metadata = client.list_topics(timeout=LIST_TIMEOUT)
        except Exception:  # KafkaException while the brokers are down, or a test double's
            self._next_check = now + CHECK_EVERY
            return
        self.observe(metadata.topics, now)

    def observe(self, topics: Iterable[str], now: float) -> None:
        """The cluster's topic names at ``now``."""
        names = set(topics)
        missing = tuple(s for s in self._subscriptions if not _matched(s, names))
        for subscription in missing:
            if subscription not in self._warned:
                self._warned.add(subscription)
                log.warning(
                    "subscribed topic %r %s: nothing is consumed from it until it exists (a "
                    "typo, or a topic not created yet?)",
                    subscription,
                    "matches no topic" if subscription.startswith("^") else "does not exist",
                )
        for subscription in self._warned - set(missing):
            log.info("subscribed topic %r exists now", subscription)
        self._warned &= set(missing)
        self.missing = missing
        if len(missing) == len(self._subscriptions):
            if self.since is None:
                self.since = now
        else:
            self.since = None
        self._done = not missing
        self._next_check = now + CHECK_EVERY


def _matched(subscription: str, names: set[str]) -> bool:
    if not subscription.startswith("^"):
        return subscription in names
    try:
        pattern = re.compile(subscription)
    except re.error:
        return True  # left to the client, which reports what it cannot parse
    return any(pattern.search(name) for name in names)
