"""Committed offsets with their exact metadata bytes, read through librdkafka with ctypes.

confluent-kafka hands committed metadata to Python as a C string: librdkafka's
``rd_kafka_committed()`` fills each ``rd_kafka_topic_partition_t`` with a ``metadata`` buffer of
exactly ``metadata_size`` bytes and no terminating NUL, and the binding copies it with
``strdup()``. A map the Java Parallel Consumer committed therefore comes back followed by stray
bytes, and a plain RunLength map can then only be decoded conservatively (see
``docs/offset-metadata.md``). This module calls ``rd_kafka_committed()`` itself, on the very
librdkafka confluent-kafka loaded, and reads ``metadata_size`` bytes: exactly what was committed.

It is an optimisation with a safe fallback: :meth:`CommittedReader.read` returns None whenever it
cannot answer (library or symbol missing, a librdkafka version whose struct layout was not
verified, a configuration it cannot reproduce, any error), and the caller then reads the offsets
through confluent-kafka as before.

The struct layouts below are the public ones of ``rdkafka.h``; they are identical in every release
from v1.0.0 to v2.15.0 and on master as of July 2026, and librdkafka keeps its ABI (soname
``librdkafka.so.1``). 2.16.x, the version bundled with confluent-kafka 2.16.1, is accepted on the
strength of that ABI promise, the probe :func:`_check_layout` runs on the loaded library, and the
broker round trip in ``tests/integration/test_committed_reader.py``; newer versions are refused
until checked the same way (raise :data:`VERIFIED_BELOW` then).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from parallel_consumer.work.item import TopicPartition

__all__ = ["VERIFIED_BELOW", "VERIFIED_FROM", "CommittedReader", "ExactReaderUnavailable"]

log = logging.getLogger("parallel_consumer")

#: librdkafka versions (``rd_kafka_version()``, 0xMMmmrrxx) whose layout of
#: ``rd_kafka_topic_partition_t`` and ``rd_kafka_topic_partition_list_t`` was checked.
VERIFIED_FROM = 0x01000000  # 1.0.0
VERIFIED_BELOW = 0x02110000  # up to 2.16.x

_RD_KAFKA_CONSUMER = 1
_RD_KAFKA_CONF_OK = 0
_RD_KAFKA_OFFSET_INVALID = -1001

#: Configuration keys confluent-kafka handles in Python, never passed to librdkafka.
_PYTHON_ONLY = frozenset(
    {"error_cb", "throttle_cb", "stats_cb", "logger", "oauth_cb", "on_commit", "on_delivery"}
)
#: Settings of the reader's own handle, whatever the user's configuration says: it never joins
#: the group, commits nothing, and has nobody to hand statistics to.
_OVERRIDES = {"enable.auto.commit": "false", "statistics.interval.ms": "0"}
#: Settings only a group member needs; a second handle with the same static id must not exist.
_DROPPED = frozenset({"group.instance.id"})


class _Partition(ctypes.Structure):
    """``rd_kafka_topic_partition_t`` (rdkafka.h)."""

    _fields_ = (
        ("topic", ctypes.c_char_p),
        ("partition", ctypes.c_int32),
        ("offset", ctypes.c_int64),
        ("metadata", ctypes.c_void_p),
        ("metadata_size", ctypes.c_size_t),
        ("opaque", ctypes.c_void_p),
        ("err", ctypes.c_int),
        ("_private", ctypes.c_void_p),
    )


class _PartitionList(ctypes.Structure):
    """``rd_kafka_topic_partition_list_t`` (rdkafka.h)."""

    _fields_ = (
        ("cnt", ctypes.c_int),
        ("size", ctypes.c_int),
        ("elems", ctypes.POINTER(_Partition)),
    )


_ListPointer = ctypes.POINTER(_PartitionList)
_PartitionPointer = ctypes.POINTER(_Partition)
_LOG_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p)


class ExactReaderUnavailable(Exception):
    """The exact reader cannot work in this process or with this configuration (permanent)."""


class _ReadFailed(Exception):
    """One read failed (transient: the next assignment tries again)."""


# -- the library --------------------------------------------------------------------------------


def _candidates() -> Iterator[str]:
    """Where confluent-kafka's librdkafka may be, best first.

    Its extension module first: a ``dlsym`` on it also searches the libraries it links, so this
    finds exactly the librdkafka confluent-kafka uses, already loaded, whatever its file name
    (wheels rename it, e.g. ``confluent_kafka.libs/librdkafka-0cb94173.so.1``). Then the
    libraries bundled next to the package, then a system one (looked up last: that is slow).
    """
    import confluent_kafka

    cimpl = getattr(getattr(confluent_kafka, "cimpl", None), "__file__", None)
    if cimpl:
        yield cimpl
    package = os.path.dirname(confluent_kafka.__file__)
    for pattern in (
        os.path.join(package + ".libs", "librdkafka*"),
        os.path.join(package, ".libs", "librdkafka*"),
        os.path.join(package, ".dylibs", "librdkafka*"),
    ):
        yield from sorted(glob.glob(pattern))
    system = ctypes.util.find_library("rdkafka")
    if system:
        yield system


class _Library:
    """librdkafka's functions, typed, once the version and layout are known to be right."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.cdll = lib
        version = lib.rd_kafka_version
        version.argtypes = []
        version.restype = ctypes.c_int
        self.version = int(version())
        if not VERIFIED_FROM <= self.version < VERIFIED_BELOW:
            raise ExactReaderUnavailable(
                f"librdkafka {_version_str(self.version)} is outside the versions whose struct "
                f"layout was verified ({_version_str(VERIFIED_FROM)} to before "
                f"{_version_str(VERIFIED_BELOW)})"
            )

        def function(name: str, restype: Any, *argtypes: Any) -> Any:
            f = getattr(lib, name)
            f.argtypes = list(argtypes)
            f.restype = restype
            return f

        c_char_p, c_void_p, c_int, c_size_t = (
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_size_t,
        )
        self.conf_new = function("rd_kafka_conf_new", c_void_p)
        self.conf_destroy = function("rd_kafka_conf_destroy", None, c_void_p)
        self.conf_set = function(
            "rd_kafka_conf_set", c_int, c_void_p, c_char_p, c_char_p, c_char_p, c_size_t
        )
        self.conf_set_log_cb = function("rd_kafka_conf_set_log_cb", None, c_void_p, _LOG_CB)
        self.new = function("rd_kafka_new", c_void_p, c_int, c_void_p, c_char_p, c_size_t)
        self.consumer_close = function("rd_kafka_consumer_close", c_int, c_void_p)
        self.destroy = function("rd_kafka_destroy", None, c_void_p)
        self.list_new = function("rd_kafka_topic_partition_list_new", _ListPointer, c_int)
        self.list_add = function(
            "rd_kafka_topic_partition_list_add",
            _PartitionPointer,
            _ListPointer,
            c_char_p,
            ctypes.c_int32,
        )
        self.list_set_offset = function(
            "rd_kafka_topic_partition_list_set_offset",
            c_int,
            _ListPointer,
            c_char_p,
            ctypes.c_int32,
            ctypes.c_int64,
        )
        self.list_destroy = function("rd_kafka_topic_partition_list_destroy", None, _ListPointer)
        self.committed = function("rd_kafka_committed", c_int, c_void_p, _ListPointer, c_int)
        self.err2str = function("rd_kafka_err2str", c_char_p, c_int)
        _check_layout(self)

    def error(self, code: int) -> str:
        text = self.err2str(code)
        return f"{text.decode('utf-8', 'replace') if text else 'unknown error'} ({code})"


def _check_layout(lib: _Library) -> None:
    """Probe the loaded library: a list it builds must look as the structures above say.

    Checks the element size (the distance between two elements), the address of the element
    array, and the topic, partition, offset, metadata and error fields of fresh elements and of
    one whose offset librdkafka set. A mismatch raises ExactReaderUnavailable.
    """
    plist = lib.list_new(2)
    if not plist:
        raise ExactReaderUnavailable("rd_kafka_topic_partition_list_new returned NULL")
    try:
        first = lib.list_add(plist, b"pc-layout-probe-a", 7)
        second = lib.list_add(plist, b"pc-layout-probe-b", 1 << 20)
        if lib.list_set_offset(plist, b"pc-layout-probe-b", 1 << 20, 0x1122334455) != 0:
            raise ExactReaderUnavailable("rd_kafka_topic_partition_list_set_offset failed")
        header = plist.contents
        elems = header.elems
        a, b = elems[0], elems[1]
        address = ctypes.addressof
        problems = [
            what
            for what, ok in (
                ("count", header.cnt == 2 and header.size >= 2),
                ("element array", address(elems.contents) == address(first.contents)),
                (
                    "element size",
                    address(second.contents) - address(first.contents) == ctypes.sizeof(_Partition),
                ),
                ("topic", a.topic == b"pc-layout-probe-a" and b.topic == b"pc-layout-probe-b"),
                ("partition", a.partition == 7 and b.partition == 1 << 20),
                ("offset", a.offset == _RD_KAFKA_OFFSET_INVALID and b.offset == 0x1122334455),
                ("metadata", not a.metadata and a.metadata_size == 0 and not b.metadata),
                ("error", a.err == 0 and b.err == 0),
            )
            if not ok
        ]
        if problems:
            raise ExactReaderUnavailable(
                f"librdkafka {_version_str(lib.version)}'s rd_kafka_topic_partition_t does not "
                f"have the expected layout ({', '.join(problems)} differ)"
            )
    finally:
        lib.list_destroy(plist)


_loaded: _Library | ExactReaderUnavailable | None = None
_load_lock = threading.Lock()


def _load() -> _Library:
    """confluent-kafka's librdkafka, loaded once per process (raises ExactReaderUnavailable)."""
    global _loaded
    with _load_lock:
        if _loaded is None:
            _loaded = _find_library()
        if isinstance(_loaded, ExactReaderUnavailable):
            raise _loaded
        return _loaded


def _find_library() -> _Library | ExactReaderUnavailable:
    reasons = []
    try:
        import confluent_kafka

        wanted = int(confluent_kafka.libversion()[1])
        for path in _candidates():
            try:
                lib = ctypes.CDLL(path)
                version = lib.rd_kafka_version
                version.argtypes = []
                version.restype = ctypes.c_int
                found = int(version())
                if found != wanted:  # another librdkafka than confluent-kafka's
                    reasons.append(
                        f"{path} is librdkafka {_version_str(found)}, confluent-kafka uses "
                        f"{_version_str(wanted)}"
                    )
                    continue
                return _Library(lib)
            except (OSError, AttributeError) as exc:  # not loadable, or a symbol is missing
                reasons.append(f"{path}: {exc}")
    except ExactReaderUnavailable as exc:
        return exc
    except Exception as exc:
        reasons.append(repr(exc))
    return ExactReaderUnavailable(
        "confluent-kafka's librdkafka cannot be loaded: "
        + ("; ".join(reasons) or "no candidate library")
    )


def _version_str(version: int) -> str:
    return f"{version >> 24 & 0xFF}.{version >> 16 & 0xFF}.{version >> 8 & 0xFF}"


# -- the configuration --------------------------------------------------------------------------


def librdkafka_settings(config: Mapping[str, Any]) -> dict[str, str]:
    """The librdkafka properties of a confluent-kafka consumer configuration, as strings.

    As confluent-kafka does: ``default.topic.config`` is merged in, callbacks and the other
    Python-only keys are left out, booleans become ``true``/``false``. Values of other types
    are left out too. Raises ExactReaderUnavailable for a configuration a handle without Python
    callbacks cannot reproduce (OAUTHBEARER tokens from ``oauth_cb``).
    """
    merged = dict(config)
    topic_config = merged.pop("default.topic.config", None)
    if isinstance(topic_config, Mapping):
        merged.update(topic_config)
    if merged.get("oauth_cb") is not None or (
        merged.get("sasl.oauthbearer.metadata.authentication.type") == "aws_iam"
    ):
        raise ExactReaderUnavailable(
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
        self._lib: _Library | None = None
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
        except ExactReaderUnavailable as exc:
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
        lib = self._lib or _load()
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

    def _handle(self, lib: _Library) -> int:
        if self._rk is not None:
            return self._rk
        settings = librdkafka_settings(self._config)
        if "group.id" not in settings:
            raise ExactReaderUnavailable("the configuration has no group.id")
        conf = lib.conf_new()
        if not conf:
            raise ExactReaderUnavailable("rd_kafka_conf_new returned NULL")
        errstr = ctypes.create_string_buffer(512)
        try:
            for key, value in settings.items():
                ok = lib.conf_set(
                    conf, key.encode("utf-8"), value.encode("utf-8"), errstr, len(errstr)
                )
                if ok != _RD_KAFKA_CONF_OK:
                    message = errstr.value.decode("utf-8", "replace")
                    raise ExactReaderUnavailable(f"the setting {key!r} is refused: {message}")
            # No logging from this handle: its failures are reported by read() instead, and
            # librdkafka's default logger would write to stderr.
            lib.conf_set_log_cb(conf, _LOG_CB())
        except BaseException:
            lib.conf_destroy(conf)
            raise
        started = time.monotonic()
        rk = lib.new(_RD_KAFKA_CONSUMER, conf, errstr, len(errstr))  # takes conf on success
        if not rk:
            lib.conf_destroy(conf)
            message = errstr.value.decode("utf-8", "replace")
            raise ExactReaderUnavailable(f"rd_kafka_new failed: {message}")
        self._rk = int(rk)
        log.debug(
            "%s: exact committed-metadata reader created in %.1f ms",
            self._name,
            (time.monotonic() - started) * 1000,
        )
        return self._rk
