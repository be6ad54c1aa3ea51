"""The Apache Kafka backend: broker jars from Maven Central, configuration, command lines.

Jars are resolved once per version into ``<cache>/kafka-<version>/lib`` (``<cache>`` is
``$PC_KAFKA_CACHE``, else ``$XDG_CACHE_HOME/parallel-consumer``, else
``~/.cache/parallel-consumer``) and reused by every later instance.
"""

from __future__ import annotations

import base64
import importlib.resources
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from parallel_consumer._maven import RESOLVED_MARKER, MavenFailed, copy_dependencies, locked
from parallel_consumer.testing._broker_process import LocalKafkaError

__all__ = [
    "DEFAULT_KAFKA_VERSION",
    "broker_command",
    "cache_root",
    "format_command",
    "is_resolved",
    "jar_dir",
    "log4j2_config",
    "new_cluster_id",
    "render_properties",
    "require_java",
    "resolve_jars",
    "server_properties",
]

DEFAULT_KAFKA_VERSION = "4.3.1"

_INSTALL_JAVA = (
    "Install a Java 17+ runtime (e.g. `apt-get install openjdk-17-jre-headless`), "
    "or use backend='tansu' (pip install -e '.[tansu]' in a clone)."
)


def cache_root() -> Path:
    """The per-user folder holding resolved broker classpaths."""
    override = os.environ.get("PC_KAFKA_CACHE")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "parallel-consumer"


def jar_dir(version: str) -> Path:
    """Where the jars of Kafka ``version`` live once resolved."""
    return cache_root() / f"kafka-{version}" / "lib"


def is_resolved(version: str) -> bool:
    """Whether a complete classpath for ``version`` is in the cache."""
    return (jar_dir(version) / RESOLVED_MARKER).is_file()


def require_java() -> str:
    """The ``java`` executable, or a :class:`LocalKafkaError` saying what to install."""
    java = shutil.which("java")
    if java is None:
        raise LocalKafkaError(
            f"Java was not found on PATH: the apache backend needs it. {_INSTALL_JAVA}"
        )
    return java


def resolve_jars(version: str = DEFAULT_KAFKA_VERSION, *, timeout: float = 900.0) -> Path:
    """Resolve the broker's runtime classpath with Maven (once), returning the jar folder."""
    target = jar_dir(version)
    if is_resolved(version):
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LocalKafkaError(
            f"Maven (mvn) was not found on PATH, and Kafka {version}'s jars are not cached in "
            f"{target}. Install Maven (e.g. `apt-get install maven`) so LocalKafka can resolve "
            "them from Maven Central once, or use backend='tansu' "
            "(pip install -e '.[tansu]' in a clone)."
        )
    with locked(target.parent / ".resolve.lock"):
        if is_resolved(version):
            return target
        pom = importlib.resources.files(__package__).joinpath("kafka", "pom.xml").read_text()
        try:
            copy_dependencies(
                target,
                pom.replace("@KAFKA_VERSION@", version),
                mvn=mvn,
                expect="kafka_2.13-*.jar",
                marker=version + "\n",
                timeout=timeout,
            )
        except MavenFailed as exc:
            if exc.timed_out:
                raise LocalKafkaError(
                    f"Maven did not resolve Kafka {version} within {timeout:.0f} s; "
                    "check network access to Maven Central."
                ) from exc
            raise LocalKafkaError(
                f"Maven could not resolve org.apache.kafka:kafka_2.13:{version} "
                f"(exit {exc.returncode}). Is the version on Maven Central, and is Central "
                f"reachable? Last lines of mvn output:\n{exc.tail}"
            ) from exc
    return target


def new_cluster_id() -> str:
    """A random KRaft cluster id (22 characters of url-safe base64, like kafka-storage makes)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        # Like Kafka's Uuid.randomUuid(): a leading "-" would be read as a command-line option.
        if not cluster_id.startswith("-"):
            return cluster_id


def server_properties(
    *, port: int, controller_port: int, data_dir: Path, overrides: Mapping[str, str]
) -> dict[str, str]:
    """Settings of a fast single-node KRaft broker+controller; ``overrides`` win."""
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        # One node: every internal topic has one replica, or it can never be created.
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "min.insync.replicas": "1",
        # Fewer internal-topic partitions than the default 50: created on the first group or
        # transaction of each broker, and that creation is on every test session's critical path.
        "offsets.topic.num.partitions": "5",
        "transaction.state.log.num.partitions": "5",
        "share.coordinator.state.topic.num.partitions": "5",
        # Otherwise every first join of a group waits 3 s for more members.
        "group.initial.rebalance.delay.ms": "0",
        # A share-group member heartbeats every 5 s by default and its first assignment waits
        # for a heartbeat: seconds of every share-group test's start-up.
        "group.share.min.heartbeat.interval.ms": "500",
        "group.share.heartbeat.interval.ms": "500",
    }
    props.update(overrides)
    return props


def render_properties(props: Mapping[str, str]) -> str:
    """``props`` as a Java .properties file (values escaped where the format needs it)."""

    def escape_key(text: str) -> str:
        return escape_value(text).replace("=", "\\=").replace(":", "\\:").replace(" ", "\\ ")

    def escape_value(text: str) -> str:
        return text.replace("\\", "\\\\").replace("\n", "\\n")

    return "".join(f"{escape_key(k)}={escape_value(v)}\n" for k, v in props.items())


def log4j2_config(log_path: Path) -> str:
    """A log4j2 configuration sending every broker log line to ``log_path``."""
    return (
        "status = warn\n"
        "appender.file.type = File\n"
        "appender.file.name = FILE\n"
        f"appender.file.fileName = {log_path}\n"
        "appender.file.append = true\n"
        "appender.file.layout.type = PatternLayout\n"
        "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
        "rootLogger.level = INFO\n"
        "rootLogger.appenderRef.file.ref = FILE\n"
        # The request logger and the state-change logger are noisy at INFO and never the cause.
        "logger.request.name = kafka.request.logger\n"
        "logger.request.level = WARN\n"
        "logger.state.name = state.change.logger\n"
        "logger.state.level = WARN\n"
    )


def _java_argv(java: str, lib: Path, log4j: Path, heap: str, main: str) -> list[str]:
    return [
        java,
        f"-Xmx{heap}",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        str(lib / "*"),
        main,
    ]


def format_command(
    java: str,
    lib: Path,
    log4j: Path,
    config: Path,
    cluster_id: str,
    extra: Sequence[str] = (),
) -> list[str]:
    """Format a fresh log directory for the static single-voter quorum in ``config``
    (``extra``: more ``format`` arguments, e.g. ``--add-scram``)."""
    # A short-lived tool: C1 only and a small heap start it noticeably faster on 2 cores.
    argv = _java_argv(java, lib, log4j, "256m", "kafka.tools.StorageTool")
    argv[1:1] = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
    return [*argv, "format", "-t", cluster_id, "-c", str(config), *extra]


def broker_command(
    java: str,
    lib: Path,
    log4j: Path,
    config: Path,
    *,
    heap: str = "512m",
    jvm_options: Sequence[str] = (),
) -> list[str]:
    """Run the broker (``kafka.Kafka``) with ``config``; ``jvm_options`` go before the class."""
    argv = _java_argv(java, lib, log4j, heap, "kafka.Kafka")
    argv[1:1] = jvm_options
    return [*argv, str(config)]
