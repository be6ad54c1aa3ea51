"""The Kafka client's own voice, routed: librdkafka's log lines and errors go to the
``parallel_consumer`` logger (none to stderr), and "all brokers down" is said once.

librdkafka retries an unreachable broker for ever and, left alone, writes every failed attempt
to stderr (over a thousand lines a minute for one unreachable bootstrap server), while nothing
reaches ``logging``. A :class:`ClientLog` takes the client's ``logger`` and ``error_cb``
settings (:meth:`ClientLog.configure`) and says instead:

- one WARNING when librdkafka reports every broker down (``_ALL_BROKERS_DOWN``), and one INFO
  when a broker answers again; :attr:`ClientLog.down_since` meanwhile, which ``health()`` turns
  into an unhealthy report after ``health.BROKERS_DOWN_UNHEALTHY_AFTER`` (docs/health.md);
- its log lines on the ``parallel_consumer.librdkafka`` logger: failed connections (facility
  ``FAIL``, which the WARNING above sums up) and everything below warning at DEBUG; other
  warnings and errors at their level, each facility at most once every ``REPEAT_AFTER``
  seconds (the repeats at DEBUG);
- its errors: broker transport and name-resolution errors at DEBUG (per attempt), fatal ones
  at ERROR, others at WARNING once every ``REPEAT_AFTER`` seconds per error code;
- the brokers refusing access (a failed login, a missing ACL: ``kafka/access.py``) at ERROR
  once, with what to check or grant, kept in :attr:`ClientLog.refusals` (``health()`` is
  unhealthy while one is in force) until a broker answers again.

librdkafka reports when every broker is down, never when one is back: the owner calls
:meth:`ClientLog.reachable` when the client shows a broker answered (records arrived, a
rebalance) and :meth:`ClientLog.probe` on every turn, which, while everything is down, asks
for metadata once every ``PROBE_EVERY`` seconds.

A ``logger`` of the user's configuration is kept (theirs gets the log lines); an ``error_cb``
of theirs is called after this one. The callbacks run where the client serves them (for the
consumer: inside ``consume()``, on the poller thread, which owns this object).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from parallel_consumer.kafka.access import is_refusal, what_to_grant
from parallel_consumer.work.refusals import Refusals

__all__ = ["PROBE_EVERY", "PROBE_TIMEOUT", "REPEAT_AFTER", "ClientLog"]

log = logging.getLogger("parallel_consumer")
librdkafka_log = logging.getLogger("parallel_consumer.librdkafka")

#: Seconds between metadata requests while every broker is down (see ClientLog.probe).
PROBE_EVERY = 1.0
#: How long one such request may block its caller.
PROBE_TIMEOUT = 0.2
#: A warning or error of the client that repeats is logged at its level once in this many
#: seconds, at DEBUG in between.
REPEAT_AFTER = 60.0

#: Errors of one connection attempt, repeated on every retry: what "all brokers down" sums up.
_CONNECTION_ERRORS = frozenset({KafkaError._TRANSPORT, KafkaError._RESOLVE})


class ClientLog:
    """Where one client's log lines and errors go, and whether all its brokers are down."""

    def __init__(
        self,
        client: str,
        servers: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        reports_health: bool = True,
    ) -> None:
        #: The client whose outage health() reports (the group consumer) says it at WARNING;
        #: the others (the output producer, an admin client) at INFO: one WARNING an outage.
        self._reports_health = reports_health
        self._client = client
        self._servers = servers
        self._clock = clock
        self._user_error_cb: Callable[[Any], object] | None = None
        #: Since when every broker is down (None while one answers).
        self._down_since: float | None = None
        self._next_probe = 0.0
        #: When a facility's (or an error code's) line was last logged at its own level.
        self._said: dict[object, float] = {}
        #: The brokers' refusals of this client in force (texts readable from any thread).
        self.refusals = Refusals()

    @property
    def down_since(self) -> float | None:
        """When librdkafka reported every broker down (None while one answers); on this
        object's clock."""
        return self._down_since

    def configure(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` with this object as the client's ``logger`` (unless it has one) and
        ``error_cb`` (a user's own is called after it)."""
        result = dict(config)
        result.setdefault("logger", self)
        user = result.get("error_cb")
        self._user_error_cb = user if callable(user) else None
        result["error_cb"] = self.error
        return result

    # -- the client's callbacks ---------------------------------------------------------------

    def log(self, level: int, message: str, *args: Any) -> None:
        """The ``logger`` interface confluent-kafka calls: ``(level, "%s [%s] %s", facility,
        client name, text)``."""
        facility = args[0] if args else None
        if level < logging.WARNING or facility == "FAIL" or not self._first_in_a_while(facility):
            level = logging.DEBUG
        librdkafka_log.log(level, message, *args)

    def error(self, error: KafkaError) -> None:
        """The ``error_cb`` confluent-kafka calls."""
        code = error.code()
        if code == KafkaError._ALL_BROKERS_DOWN:
            self._all_down(error)
        elif is_refusal(code):
            self.refused(error, "READ")
        elif error.fatal():
            log.error("%s: Kafka client error: %s", self._client, error.str())
        elif code in _CONNECTION_ERRORS or not self._first_in_a_while(code):
            librdkafka_log.debug("%s: %s", self._client, error.str())
        else:
            log.warning("%s: Kafka client error: %s", self._client, error.str())
        if self._user_error_cb is not None:
            try:
                self._user_error_cb(error)
            except Exception:
                log.error("user error_cb %r failed", self._user_error_cb, exc_info=True)

    # -- what the owner tells ---------------------------------------------------------------

    def refused(self, error: KafkaError, operation: str, name: str | None = None) -> None:
        """The brokers refused this client (``error``, of a code ``access.is_refusal`` knows):
        said at ERROR once, with what to check or grant, and kept until a broker answers."""
        code = error.code()
        text = f"{self._client}: {error.str()} ({what_to_grant(code, operation, name)})"
        if self.refusals.refused(code, text):
            log.error("Kafka refused access: %s", text)
        else:
            librdkafka_log.debug("%s", text)

    def reachable(self) -> None:
        """A broker answered: an outage (if any) is over, and so are the refusals."""
        self.refusals.clear()
        down_since = self._down_since
        if down_since is None:
            return
        self._down_since = None
        log.info(
            "%s: a broker answers again (bootstrap.servers=%s), after %.1fs with every broker down",
            self._client,
            self._servers,
            self._clock() - down_since,
        )

    def probe(self, client: Any, topic: str | None = None) -> None:
        """While every broker is down, ask ``client`` for metadata (of ``topic`` only, if
        given) once every PROBE_EVERY seconds; an answer ends the outage."""
        if self._down_since is None:
            return
        now = self._clock()
        if now < self._next_probe:
            return
        self._next_probe = now + PROBE_EVERY
        try:
            client.list_topics(topic=topic, timeout=PROBE_TIMEOUT)
        except KafkaException:
            return
        self.reachable()

    # -- internals ----------------------------------------------------------------------------

    def _all_down(self, error: KafkaError) -> None:
        if self._down_since is not None:
            return
        now = self._clock()
        self._down_since = now
        self._next_probe = now + PROBE_EVERY
        log.log(
            logging.WARNING if self._reports_health else logging.INFO,
            "%s: every Kafka broker is down or unreachable (bootstrap.servers=%s: %s); the "
            "client keeps retrying%s",
            self._client,
            self._servers,
            error.str(),
            ", health() reports it" if self._reports_health else "",
        )

    def _first_in_a_while(self, key: object) -> bool:
        now = self._clock()
        last = self._said.get(key)
        if last is not None and now - last < REPEAT_AFTER:
            return False
        self._said[key] = now
        return True

    def __repr__(self) -> str:
        down = "" if self._down_since is None else " all-brokers-down"
        return f"<ClientLog {self._client} {self._servers}{down}>"
