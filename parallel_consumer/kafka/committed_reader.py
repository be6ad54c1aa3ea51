"""Committed offsets with their exact metadata bytes, read through librdkafka with ctypes.

confluent-kafka hands committed metadata to Python as a C string: librdkafka's
``rd_kafka_committed()`` fills each ``rd_kafka_topic_partition_t`` with a ``metadata`` buffer of
exactly ``metadata_size`` bytes and no terminating NUL, and the binding copies it with
``strdup()``. A map the Java Parallel Consumer committed therefore comes back followed by stray
bytes, and a plain RunLength map can then only be decoded conservatively (see
``docs/offset-metadata.md``). This module calls ``rd_kafka_committed()`` itself, on the very
librdkafka confluent-kafka loaded (``librdkafka.py``: which versions and layouts it accepts),
and reads ``metadata_size`` bytes: exactly what was committed.

It is an optimisation with a safe fallback: :meth:`CommittedReader.read` returns None whenever it
cannot answer (library or symbol missing, a librdkafka version whose struct layout was not
verified, a configuration it cannot reproduce, any error), and the caller then reads the offsets
through confluent-kafka as before.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from parallel_consumer.kafka import librdkafka
from parallel_consumer.kafka.librdkafka import LOG_CB, RD_KAFKA_CONSUMER, Library, Unavailable
from parallel_consumer.work.item import TopicPartition

__all__ = ["CommittedReader", "librdkafka_settings"]

log = logging.getLogger("parallel_consumer")

_RD_KAFKA_CONF_OK = 0

#: Configuration keys confluent-kafka handles in Python, never passed to librdkafka.
_PYTHON_ONLY = frozenset(
    {"error_cb", "throttle_cb", "stats_cb", "logger", "oauth_cb", "on_commit", "on_delivery"}
)
#: Settings of the reader's own handle, whatever the user's configuration says: it never joins
#: the group, commits nothing, and has nobody to hand statistics to.
_OVERRIDES = {"enable.auto.commit": "false", "statistics.interval.ms": "0"}
#: Settings only a group member needs; a second handle with the same static id must not exist.
_DROPPED = frozenset({"group.instance.id"})


class _ReadFailed(Exception):
    """One read failed (transient: the next assignment tries again)."""


# -- the configuration --------------------------------------------------------------------------


def librdkafka_settings(config: Mapping[str, Any]) -> dict[str, str]:
    """The librdkafka properties of a confluent-kafka consumer configuration, as strings.

    As confluent-kafka does: ``default.topic.config`` is merged in, callbacks and the other
    Python-only keys are left out, booleans become ``true``/``false``. Values of other types
    are left out too. Raises Unavailable for a configuration a handle without Python
    callbacks cannot reproduce (OAUTHBEARER tokens from ``oauth_cb``).
    """
    merged = dict(config)
    topic_config = merged.pop("default.topic.config", None)
    if isinstance(topic_config, Mapping):
        merged.update(topic_config)
    if merged.get("oauth_cb") is not None or (
        merged.get("sasl.oauthbearer.metadata.authentication.type") == "aws_iam"
    ):
        raise Unavailable(
            "the configuration gets OAUTHBEARER tokens from a Python callback (oauth_cb)"
        )
    settings: dict[str, str] = {}
    for key, value in merged.items():
        if not isinstance(key, str) or key in _PYTHON_ONLY or key in _DROPPED:
            continue
        if isinstance(value, bool):
            settings[key] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            settings[key] = str(value)
    paths = settings.get("plugin.library.paths")
    if paths:
        import confluent_kafka

        resolve = getattr(confluent_kafka, "_resolve_plugins", None)
        if resolve is not None:  # plugins bundled in the wheel, as confluent-kafka finds them
            settings["plugin.library.paths"] = str(resolve(paths))
    settings.update(_OVERRIDES)
    # As confluent-kafka does: debug contexts first, then the plugins, whose own properties
    # can only be set once they are loaded.
    first = [k for k in ("debug", "plugin.library.paths") if k in settings]
    return {**{k: settings[k] for k in first}, **settings}


# -- the reader ---------------------------------------------------------------------------------


class CommittedReader:
    """Reads committed offsets and their exact metadata with a consumer handle of its own.

    The handle uses the consumer's configuration and ``group.id`` but never subscribes: fetching
    committed offsets (OffsetFetch) needs no group membership. It is created on the first
    :meth:`read` and kept until :meth:`close` (creating one costs a connection and a coordinator
    lookup; see ``docs/offset-metadata.md``). Not thread-safe: one thread (the poller's) uses it.
    """

    def __init__(self, config: Mapping[str, Any], *, name: str = "pc") -> None:
        self._config = dict(config)
        self._name = name
        self._lib: Library | None = None
        self._rk: int | None = None
        #: Set once the reader can never work here; it then answers None at once, silently.
        self._unavailable: str | None = None

    @property
    def unavailable(self) -> str | None:
        """Why the reader gave up for good, or None while it may still work."""
        return self._unavailable

    def read(
        self, tps: Iterable[TopicPartition], timeout: float
    ) -> dict[TopicPartition, tuple[int, str | None]] | None:
        """The committed offset and exact metadata of every partition that has a committed
        offset (the others are left out, as confluent-kafka's ``committed()`` answers them with
        no offset); metadata None where none was committed. None when it cannot answer, for
        any reason: the caller then reads them another way. Never raises (logs why instead).

        The metadata is exactly the committed bytes, decoded as UTF-8 (a map is ASCII; anything
        else shows up as U+FFFD and fails to decode as a map). Note that a map confluent-kafka
        committed ends with the NUL byte it stores after every metadata string.
        """
        if self._unavailable is not None:
            return None
        tps = list(tps)
        if not tps:
            return {}  # an empty OffsetFetch would ask for every partition of the group
        try:
            return self._read(tps, timeout)
        except Unavailable as exc:
            self._give_up(str(exc))
        except _ReadFailed as exc:
            log.info(
                "reading the exact committed metadata failed (%s); reading it through "
                "confluent-kafka instead",
                exc,
            )
        except Exception as exc:  # a bug here must never take the poller down
            log.warning("the exact committed-metadata reader failed", exc_info=True)
            self._give_up(f"unexpected error {exc!r}")
        return None

    def close(self) -> None:
        """Destroy the handle, if one was created (idempotent)."""
        rk, self._rk = self._rk, None
        if rk is not None and self._lib is not None:
            try:
                self._lib.consumer_close(rk)
            finally:
                self._lib.destroy(rk)

    def _give_up(self, reason: str) -> None:
        self._unavailable = reason
        self.close()
        log.info(
            "exact committed metadata unavailable (%s); reading it through confluent-kafka, "
            "which cuts a plain RunLength map the Java Parallel Consumer committed conservatively "
            "(some records it finished run again)",
            reason,
        )

    def _read(
        self, tps: list[TopicPartition], timeout: float
    ) -> dict[TopicPartition, tuple[int, str | None]]:
        lib = self._lib or librdkafka.load()
        self._lib = lib
        rk = self._handle(lib)
        plist = lib.list_new(max(1, len(tps)))
        if not plist:
            raise _ReadFailed("rd_kafka_topic_partition_list_new returned NULL")
        try:
            for topic, partition in tps:
                if not lib.list_add(plist, topic.encode("utf-8"), partition):
                    raise _ReadFailed("rd_kafka_topic_partition_list_add returned NULL")
            err = lib.committed(rk, plist, max(0, int(timeout * 1000)))
            if err:
                raise _ReadFailed(f"rd_kafka_committed: {lib.error(err)}")
            answer: dict[TopicPartition, tuple[int, str | None]] = {}
            header = plist.contents
            for i in range(header.cnt):
                element = header.elems[i]
                tp = ((element.topic or b"").decode("utf-8"), int(element.partition))
                if element.err:
                    raise _ReadFailed(f"{tp[0]}[{tp[1]}]: {lib.error(element.err)}")
                if element.offset < 0:
                    continue  # nothing committed
                metadata = None
                if element.metadata and element.metadata_size:
                    raw = ctypes.string_at(element.metadata, element.metadata_size)
                    metadata = raw.decode("utf-8", "replace")
                answer[tp] = (int(element.offset), metadata)
            return answer
        finally:
            lib.list_destroy(plist)

    def _handle(self, lib: Library) -> int:
        if self._rk is not None:
            return self._rk
        settings = librdkafka_settings(self._config)
        if "group.id" not in settings:
            raise Unavailable("the configuration has no group.id")
        conf = lib.conf_new()
        if not conf:
            raise Unavailable("rd_kafka_conf_new returned NULL")
        errstr = ctypes.create_string_buffer(512)
        try:
            for key, value in settings.items():
                ok = lib.conf_set(
                    conf, key.encode("utf-8"), value.encode("utf-8"), errstr, len(errstr)
                )
                if ok != _RD_KAFKA_CONF_OK:
                    message = errstr.value.decode("utf-8", "replace")
                    raise Unavailable(f"the setting {key!r} is refused: {message}")
            # No logging from this handle: its failures are reported by read() instead, and
            # librdkafka's default logger would write to stderr.
            lib.conf_set_log_cb(conf, LOG_CB())
        except BaseException:
            lib.conf_destroy(conf)
            raise
        started = time.monotonic()
        rk = lib.new(RD_KAFKA_CONSUMER, conf, errstr, len(errstr))  # takes conf on success
        if not rk:
            lib.conf_destroy(conf)
            message = errstr.value.decode("utf-8", "replace")
            raise Unavailable(f"rd_kafka_new failed: {message}")
        self._rk = int(rk)
        log.debug(
            "%s: exact committed-metadata reader created in %.1f ms",
            self._name,
            (time.monotonic() - started) * 1000,
        )
        return self._rk
