"""confluent-kafka's own librdkafka, called through ctypes where the binding loses bytes.

confluent-kafka passes commit metadata as a C string both ways (see ``docs/offset-metadata.md``):
reading, a map committed without a NUL comes back followed by stray bytes; writing, every map is
stored with a NUL after it, which the Java Parallel Consumer cannot decode. The exact reader
(``committed_reader.py``) and the exact committer (``exact_commits.py``) call librdkafka
themselves, with ``metadata_size`` exact; this module is what they share: the library, found and
checked once per process, its structures, and the handle inside a confluent-kafka client.

The struct layouts below are the public ones of ``rdkafka.h``; they are identical in every release
from v1.0.0 to v2.15.0 and on master as of July 2026, and librdkafka keeps its ABI (soname
``librdkafka.so.1``). 2.16.x, the version bundled with confluent-kafka 2.16.1, is accepted on the
strength of that ABI promise, the probe :func:`_check_layout` runs on the loaded library, and the
broker round trips of ``tests/integration/test_committed_reader.py`` and
``test_exact_commits.py``; newer versions are refused until checked the same way (raise
:data:`VERIFIED_BELOW` then). Anything unexpected raises :class:`Unavailable`, and the callers
fall back to confluent-kafka's own calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading
from collections.abc import Iterator
from typing import Any

__all__ = [
    "COMMIT_CB",
    "LOG_CB",
    "RD_KAFKA_CONSUMER",
    "RD_KAFKA_PRODUCER",
    "VERIFIED_BELOW",
    "VERIFIED_FROM",
    "ClientClosed",
    "Library",
    "ListPointer",
    "Partition",
    "PartitionList",
    "PartitionPointer",
    "Unavailable",
    "Writing",
    "client_handle",
    "load",
    "member_id",
    "set_metadata",
    "version_str",
]

#: librdkafka versions (``rd_kafka_version()``, 0xMMmmrrxx) whose layout of
#: ``rd_kafka_topic_partition_t`` and ``rd_kafka_topic_partition_list_t`` was checked.
VERIFIED_FROM = 0x01000000  # 1.0.0
VERIFIED_BELOW = 0x02110000  # up to 2.16.x

RD_KAFKA_PRODUCER = 0
RD_KAFKA_CONSUMER = 1
_RD_KAFKA_OFFSET_INVALID = -1001


class Partition(ctypes.Structure):
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


class PartitionList(ctypes.Structure):
    """``rd_kafka_topic_partition_list_t`` (rdkafka.h)."""

    _fields_ = (
        ("cnt", ctypes.c_int),
        ("size", ctypes.c_int),
        ("elems", ctypes.POINTER(Partition)),
    )


ListPointer = ctypes.POINTER(PartitionList)
PartitionPointer = ctypes.POINTER(Partition)
LOG_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p)
#: ``offset_commit_cb`` of ``rd_kafka_commit_queue()``: (rk, err, offsets, opaque).
COMMIT_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ListPointer, ctypes.c_void_p)


class Unavailable(Exception):
    """librdkafka cannot be called directly in this process, or not for this (permanent)."""


class ClientClosed(Unavailable):
    """The confluent-kafka client is closed: it has no handle any more."""


# -- the library --------------------------------------------------------------------------------


def candidates() -> Iterator[str]:
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


def _bind(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> Any:
    f = getattr(lib, name)
    f.argtypes = list(argtypes)
    f.restype = restype
    return f


class Library:
    """librdkafka's functions, typed, once the version and layout are known to be right."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.cdll = lib
        self.version = int(_bind(lib, "rd_kafka_version", ctypes.c_int)())
        if not VERIFIED_FROM <= self.version < VERIFIED_BELOW:
            raise Unavailable(
                f"librdkafka {version_str(self.version)} is outside the versions whose struct "
                f"layout was verified ({version_str(VERIFIED_FROM)} to before "
                f"{version_str(VERIFIED_BELOW)})"
            )
        c_char_p, c_void_p, c_int, c_size_t = (
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_size_t,
        )
        self.conf_new = _bind(lib, "rd_kafka_conf_new", c_void_p)
        self.conf_destroy = _bind(lib, "rd_kafka_conf_destroy", None, c_void_p)
        self.conf_set = _bind(
            lib, "rd_kafka_conf_set", c_int, c_void_p, c_char_p, c_char_p, c_char_p, c_size_t
        )
        self.conf_set_log_cb = _bind(lib, "rd_kafka_conf_set_log_cb", None, c_void_p, LOG_CB)
        self.new = _bind(lib, "rd_kafka_new", c_void_p, c_int, c_void_p, c_char_p, c_size_t)
        self.consumer_close = _bind(lib, "rd_kafka_consumer_close", c_int, c_void_p)
        self.destroy = _bind(lib, "rd_kafka_destroy", None, c_void_p)
        self.list_new = _bind(lib, "rd_kafka_topic_partition_list_new", ListPointer, c_int)
        self.list_add = _bind(
            lib,
            "rd_kafka_topic_partition_list_add",
            PartitionPointer,
            ListPointer,
            c_char_p,
            ctypes.c_int32,
        )
        self.list_set_offset = _bind(
            lib,
            "rd_kafka_topic_partition_list_set_offset",
            c_int,
            ListPointer,
            c_char_p,
            ctypes.c_int32,
            ctypes.c_int64,
        )
        self.list_copy = _bind(lib, "rd_kafka_topic_partition_list_copy", ListPointer, ListPointer)
        self.list_destroy = _bind(lib, "rd_kafka_topic_partition_list_destroy", None, ListPointer)
        self.committed = _bind(lib, "rd_kafka_committed", c_int, c_void_p, ListPointer, c_int)
        self.err2str = _bind(lib, "rd_kafka_err2str", c_char_p, c_int)
        self._writing: Writing | Unavailable | None = None
        _check_layout(self)

    def error(self, code: int) -> str:
        text = self.err2str(code)
        return f"{text.decode('utf-8', 'replace') if text else 'unknown error'} ({code})"

    def writing(self) -> Writing:
        """The functions a commit needs (bound on first use; raises Unavailable)."""
        if self._writing is None:
            try:
                self._writing = Writing(self.cdll)
                _check_copy(self, self._writing)
            except AttributeError as exc:  # a symbol is missing
                self._writing = Unavailable(f"librdkafka lacks a function: {exc}")
            except Unavailable as exc:
                self._writing = exc
        if isinstance(self._writing, Unavailable):
            raise self._writing
        return self._writing


class Writing:
    """The functions of a commit on a client's handle, and of the checks of that handle."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        c_void_p, c_int, c_size_t = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        self.type = _bind(lib, "rd_kafka_type", c_int, c_void_p)
        self.opaque = _bind(lib, "rd_kafka_opaque", c_void_p, c_void_p)
        self.memberid = _bind(lib, "rd_kafka_memberid", c_void_p, c_void_p)
        self.mem_malloc = _bind(lib, "rd_kafka_mem_malloc", c_void_p, c_void_p, c_size_t)
        self.mem_free = _bind(lib, "rd_kafka_mem_free", None, c_void_p, c_void_p)
        self.commit = _bind(lib, "rd_kafka_commit", c_int, c_void_p, ListPointer, c_int)
        self.commit_queue = _bind(
            lib, "rd_kafka_commit_queue", c_int, c_void_p, ListPointer, c_void_p, COMMIT_CB,
            c_void_p,
        )  # fmt: skip
        self.group_metadata = _bind(lib, "rd_kafka_consumer_group_metadata", c_void_p, c_void_p)
        self.group_metadata_destroy = _bind(
            lib, "rd_kafka_consumer_group_metadata_destroy", None, c_void_p
        )
        self.send_offsets_to_transaction = _bind(
            lib, "rd_kafka_send_offsets_to_transaction", c_void_p, c_void_p, ListPointer,
            c_void_p, c_int,
        )  # fmt: skip
        self.error_code = _bind(lib, "rd_kafka_error_code", c_int, c_void_p)
        self.error_string = _bind(lib, "rd_kafka_error_string", ctypes.c_char_p, c_void_p)
        self.error_is_fatal = _bind(lib, "rd_kafka_error_is_fatal", c_int, c_void_p)
        self.error_is_retriable = _bind(lib, "rd_kafka_error_is_retriable", c_int, c_void_p)
        self.error_txn_requires_abort = _bind(
            lib, "rd_kafka_error_txn_requires_abort", c_int, c_void_p
        )
        self.error_destroy = _bind(lib, "rd_kafka_error_destroy", None, c_void_p)


def _check_layout(lib: Library) -> None:
    """Probe the loaded library: a list it builds must look as the structures above say.

    Checks the element size (the distance between two elements), the address of the element
    array, and the topic, partition, offset, metadata and error fields of fresh elements and of
    one whose offset librdkafka set. A mismatch raises Unavailable.
    """
    plist = lib.list_new(2)
    if not plist:
        raise Unavailable("rd_kafka_topic_partition_list_new returned NULL")
    try:
        first = lib.list_add(plist, b"pc-layout-probe-a", 7)
        second = lib.list_add(plist, b"pc-layout-probe-b", 1 << 20)
        if lib.list_set_offset(plist, b"pc-layout-probe-b", 1 << 20, 0x1122334455) != 0:
            raise Unavailable("rd_kafka_topic_partition_list_set_offset failed")
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
                    address(second.contents) - address(first.contents) == ctypes.sizeof(Partition),
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
            raise Unavailable(
                f"librdkafka {version_str(lib.version)}'s rd_kafka_topic_partition_t does not "
                f"have the expected layout ({', '.join(problems)} differ)"
            )
    finally:
        lib.list_destroy(plist)


def _check_copy(lib: Library, writing: Writing) -> None:
    """Probe what a commit relies on: metadata written into an element (a buffer of librdkafka's
    allocator, ``metadata_size`` bytes, with a NUL inside and none at the end) is what
    librdkafka's own copy of the list holds, byte for byte (commits copy the list they are
    given). A mismatch raises Unavailable."""
    probe = b"pc\x00probe-metadata"
    plist = lib.list_new(1)
    if not plist:
        raise Unavailable("rd_kafka_topic_partition_list_new returned NULL")
    copy = None
    try:
        element = lib.list_add(plist, b"pc-layout-probe", 3).contents
        set_metadata(writing, element, probe)
        copy = lib.list_copy(plist)
        if not copy:
            raise Unavailable("rd_kafka_topic_partition_list_copy returned NULL")
        copied = copy.contents.elems[0]
        ok = (
            copy.contents.cnt == 1
            and copied.partition == 3
            and copied.metadata_size == len(probe)
            and bool(copied.metadata)
            and ctypes.string_at(copied.metadata, copied.metadata_size) == probe
        )
        if not ok:
            raise Unavailable(
                f"librdkafka {version_str(lib.version)} does not copy commit metadata as "
                "rd_kafka_topic_partition_t says"
            )
    finally:
        if copy:
            lib.list_destroy(copy)
        lib.list_destroy(plist)


def set_metadata(writing: Writing, element: Partition, metadata: bytes) -> None:
    """Give ``element`` exactly ``metadata`` (no NUL added), in a buffer of librdkafka's
    allocator: the list owns it from then on (``rd_kafka_topic_partition_list_destroy`` frees
    it). Empty ``metadata``: none at all."""
    if not metadata:
        return
    buffer = writing.mem_malloc(None, len(metadata))
    if not buffer:
        raise MemoryError("rd_kafka_mem_malloc returned NULL")
    ctypes.memmove(buffer, metadata, len(metadata))
    element.metadata = buffer
    element.metadata_size = len(metadata)


_loaded: Library | Unavailable | None = None
_load_lock = threading.Lock()


def load() -> Library:
    """confluent-kafka's librdkafka, loaded once per process (raises Unavailable)."""
    global _loaded
    with _load_lock:
        if _loaded is None:
            _loaded = _find_library()
        if isinstance(_loaded, Unavailable):
            raise _loaded
        return _loaded


def _find_library() -> Library | Unavailable:
    reasons = []
    try:
        import confluent_kafka

        wanted = int(confluent_kafka.libversion()[1])
        for path in candidates():
            try:
                lib = ctypes.CDLL(path)
                found = int(_bind(lib, "rd_kafka_version", ctypes.c_int)())
                if found != wanted:  # another librdkafka than confluent-kafka's
                    reasons.append(
                        f"{path} is librdkafka {version_str(found)}, confluent-kafka uses "
                        f"{version_str(wanted)}"
                    )
                    continue
                return Library(lib)
            except (OSError, AttributeError) as exc:  # not loadable, or a symbol is missing
                reasons.append(f"{path}: {exc}")
    except Unavailable as exc:
        return exc
    except Exception as exc:
        reasons.append(repr(exc))
    return Unavailable(
        "confluent-kafka's librdkafka cannot be loaded: "
        + ("; ".join(reasons) or "no candidate library")
    )


def version_str(version: int) -> str:
    return f"{version >> 24 & 0xFF}.{version >> 16 & 0xFF}.{version >> 8 & 0xFF}"


# -- a confluent-kafka client's handle ----------------------------------------------------------


def client_handle(client: Any, lib: Library, kind: int) -> int:
    """The ``rd_kafka_t *`` of a live ``confluent_kafka.Consumer`` (``kind`` RD_KAFKA_CONSUMER)
    or ``Producer`` (RD_KAFKA_PRODUCER), checked to be that client's; raises Unavailable.

    confluent-kafka keeps it as the first field after the object header of its ``Handle`` struct
    (``PyObject_HEAD rd_kafka_t *rk;`` in ``confluent_kafka.h``, unchanged from 1.x to 2.15 and
    on master as of July 2026) and sets the handle's opaque to that object
    (``rd_kafka_conf_set_opaque(conf, h)``). So the pointer read there must give back the
    object's own address through ``rd_kafka_opaque()``, and ``rd_kafka_type()`` the kind asked
    for; callers check more (the consumer's member id). NULL (a closed client) raises too.
    """
    from confluent_kafka import cimpl

    expected = cimpl.Consumer if kind == RD_KAFKA_CONSUMER else cimpl.Producer
    if not isinstance(client, expected):
        raise Unavailable(f"{type(client).__name__} is not a confluent_kafka {expected.__name__}")
    header = object.__basicsize__  # PyObject_HEAD, whatever the build (free-threaded: larger)
    if type(client).__basicsize__ < header + ctypes.sizeof(ctypes.c_void_p):
        raise Unavailable(f"{type(client).__name__} objects are too small to hold a handle")
    rk = ctypes.c_void_p.from_address(id(client) + header).value
    if not rk:
        raise ClientClosed("the client is closed (no handle)")
    writing = lib.writing()
    if writing.opaque(rk) != id(client):
        raise Unavailable("the handle read from the client does not point back to it (opaque)")
    found = writing.type(rk)
    if found != kind:
        raise Unavailable(f"the client's handle has type {found}, expected {kind}")
    return int(rk)


def member_id(lib: Library, rk: int) -> str | None:
    """``rd_kafka_memberid()`` of ``rk`` (None: not in a group yet), as confluent-kafka's
    ``Consumer.memberid()`` reports it."""
    writing = lib.writing()
    raw = writing.memberid(rk)
    if not raw:
        return None
    try:
        text = ctypes.string_at(raw).decode("utf-8", "replace")
    finally:
        writing.mem_free(rk, raw)
    return text or None
