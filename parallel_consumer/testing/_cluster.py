"""A three-node (or n-node) Apache Kafka cluster on this machine, for broker-failure tests.

Each node is a KRaft combined broker+controller JVM on its own loopback ports; the nodes form
one controller quorum (static ``controller.quorum.voters``), so any minority of them may be down.
Three JVMs instead of a separate controller plus three brokers: one process fewer on a small
machine, and a killed node also exercises a controller failover. Topics get replication factor
``n`` (at most 3) and ``min.insync.replicas=2`` by default, as production clusters do.

:class:`~parallel_consumer.testing.local_kafka.LocalKafka` with ``brokers=3`` owns one
:class:`LocalCluster` and hands it its lifecycle calls; this module does not know LocalKafka.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parallel_consumer.testing import _apache_kafka as apache
from parallel_consumer.testing._broker_process import (
    BrokerProcess,
    LocalKafkaError,
    free_port,
    log_tail,
    wait_until_answering,
)

__all__ = ["CLUSTER_HEAP", "LocalCluster", "cluster_properties", "java_string_hash"]

#: Heap of each node: three of them and a test session fit in a few GiB.
CLUSTER_HEAP = "384m"
#: Three JVMs start side by side on a small machine (and again after each kill): the client
#: compiler only and the serial collector start them faster and leave cores to the tests.
CLUSTER_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
#: Partitions of ``__transaction_state`` (as the single node uses; see _apache_kafka).
TRANSACTION_STATE_PARTITIONS = 5


def cluster_properties(
    *,
    node_id: int,
    port: int,
    controller_port: int,
    voters: str,
    replicas: int,
    data_dir: Path,
    overrides: Mapping[str, str],
) -> dict[str, str]:
    """server.properties of one node; ``overrides`` (the user's ``broker_config``) win."""
    # broker.session.timeout.ms stays Kafka's 9 s: a killed node's partitions and coordinators
    # move after that long, as in production (a shorter one would hide failovers that outlast
    # a transaction's timeout).
    min_isr = str(min(2, replicas))
    cluster = {
        "node.id": str(node_id),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "default.replication.factor": str(replicas),
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": min_isr,
    }
    return apache.server_properties(
        port=port,
        controller_port=controller_port,
        data_dir=data_dir,
        overrides={**cluster, **overrides},
    )


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()`` of ``text`` (UTF-16 code units), as a signed 32-bit int."""
    value = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        value = (31 * value + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


@dataclass
class _Node:
    index: int
    port: int
    controller_port: int
    workdir: Path
    process: BrokerProcess | None = None

    @property
    def node_id(self) -> int:
        return self.index + 1

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "broker.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.exit_code() is None


class LocalCluster:
    """``count`` KRaft nodes this process starts, kills, restarts and stops.

    Brokers are numbered from 0; broker ``i`` has ``node.id`` ``i + 1``.
    """

    def __init__(
        self,
        count: int,
        *,
        version: str,
        broker_config: Mapping[str, str],
        start_timeout: float,
        stop_timeout: float,
        heap: str,
    ) -> None:
        if count < 2:
            raise LocalKafkaError(f"a cluster needs at least 2 brokers, not {count}")
        self._count = count
        self._version = version
        self._broker_config = dict(broker_config)
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._heap = heap
        self._root: Path | None = None
        self._nodes: list[_Node] = []

    # -- what it is -------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return bool(self._nodes)

    @property
    def size(self) -> int:
        return self._count

    @property
    def bootstrap_servers(self) -> str:
        """Every broker's address, comma-separated (clients find the live ones)."""
        return ",".join(node.address for node in self._nodes)

    def address(self, broker: int) -> str:
        return self._node(broker).address

    def log_path(self, broker: int) -> Path:
        return self._node(broker).log_path

    @property
    def root(self) -> Path | None:
        return self._root

    def running(self, broker: int) -> bool:
        return self._node(broker).running

    def any_running(self) -> bool:
        return any(node.running for node in self._nodes)

    def pids(self) -> list[int | None]:
        return [None if n.process is None else n.process.pid for n in self._nodes]

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Format every node's log directory and start them all; return when each answers and
        the cluster's metadata lists every broker."""
        java = apache.require_java()
        apache.resolve_jars(self._version)
        self._root = root = Path(tempfile.mkdtemp(prefix="pc-kafka-cluster-"))
        ports = [(free_port(), free_port()) for _ in range(self._count)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{cport}" for i, (_, cport) in enumerate(ports))
        replicas = min(3, self._count)
        self._nodes = [
            _Node(i, port, cport, root / f"broker-{i}") for i, (port, cport) in enumerate(ports)
        ]
        cluster_id = apache.new_cluster_id()
        formatters = []
        for node in self._nodes:
            node.workdir.mkdir()
            props = cluster_properties(
                node_id=node.node_id,
                port=node.port,
                controller_port=node.controller_port,
                voters=voters,
                replicas=replicas,
                data_dir=node.workdir / "data",
                overrides=self._broker_config,
            )
            (node.workdir / "server.properties").write_text(apache.render_properties(props))
            (node.workdir / "log4j2.properties").write_text(apache.log4j2_config(node.log_path))
            argv = apache.format_command(
                java,
                apache.jar_dir(self._version),
                node.workdir / "log4j2.properties",
                node.workdir / "server.properties",
                cluster_id,
            )
            formatters.append((node, BrokerProcess(argv, log_path=node.log_path, cwd=node.workdir)))
        for node, formatter in formatters:
            code = formatter.wait(timeout=self._start_timeout)
            if code != 0:
                raise self._failed(
                    node, f"formatting broker {node.index}'s log directory failed (exit {code})"
                )
        # All at once: a node's controller waits for a majority of the quorum.
        for node in self._nodes:
            self._launch(node)
        for node in self._nodes:
            self._wait_answering(node)
        self.wait_for_brokers(self._count, timeout=self._start_timeout)

    def kill_broker(self, broker: int) -> None:
        """SIGKILL broker ``broker``: no controlled shutdown, no flush (a crash)."""
        node = self._node(broker)
        if node.process is None:
            raise LocalKafkaError(f"broker {broker} is not running")
        node.process.kill()
        node.process = None

    def stop_broker(self, broker: int) -> None:
        """Stop broker ``broker`` cleanly (SIGTERM: controlled shutdown, leaders moved away)."""
        node = self._node(broker)
        if node.process is None:
            raise LocalKafkaError(f"broker {broker} is not running")
        node.process.stop(self._stop_timeout)
        node.process = None

    def start_broker(self, *brokers: int) -> float:
        """Start stopped or killed brokers again on their ports with their data, side by side
        (a whole cluster that was down needs a majority of its quorum at once); return the
        seconds until each answered and the cluster's metadata listed it."""
        nodes = [self._node(broker) for broker in brokers]
        for node in nodes:
            if node.process is not None:
                raise LocalKafkaError(f"broker {node.index} is already running")
        began = time.monotonic()
        for node in nodes:
            self._launch(node)
        for node in nodes:
            self._wait_answering(node)
        for node in nodes:
            self._wait_registered(node)
        return time.monotonic() - began

    def stop(self) -> None:
        """Stop every node (SIGTERM, SIGKILL after ``stop_timeout``) and delete the files."""
        nodes, root = self._nodes, self._root
        self._nodes, self._root = [], None
        owned = True
        # SIGTERM to all first, so they shut down side by side instead of one after another
        for node in nodes:
            if node.process is not None and node.process.owned:
                node.process.signal(signal.SIGTERM)
        for node in nodes:
            if node.process is not None:
                owned = owned and node.process.owned
                node.process.stop(self._stop_timeout)
                node.process = None
        if root is not None and owned:
            shutil.rmtree(root, ignore_errors=True)

    # -- metadata ---------------------------------------------------------------------------

    def leader_of(self, topic: str, partition: int, *, timeout: float = 30.0) -> int:
        """The broker leading ``topic[partition]`` now (waits while it has none)."""
        if not self._nodes:
            raise LocalKafkaError("the cluster is not started")
        deadline = time.monotonic() + timeout
        admin = self._admin()
        while True:
            try:
                found = admin.list_topics(topic, timeout=1.0).topics.get(topic)
            except Exception:  # KafkaException or a timeout: every broker busy or down
                found = None
            if found is not None and found.error is None and partition in found.partitions:
                leader = found.partitions[partition].leader
                if leader > 0:
                    return int(leader) - 1
            if time.monotonic() > deadline:
                raise LocalKafkaError(f"{topic}[{partition}] has no leader after {timeout} s")
            time.sleep(0.1)

    def transaction_coordinator_of(self, transactional_id: str, *, timeout: float = 30.0) -> int:
        """The broker coordinating ``transactional_id``'s transactions: the leader of its
        partition of ``__transaction_state`` (Kafka's ``abs(hashCode) % partitions``)."""
        partitions = int(
            self._broker_config.get(
                "transaction.state.log.num.partitions", TRANSACTION_STATE_PARTITIONS
            )
        )
        code = java_string_hash(transactional_id)
        partition = 0 if code == -(1 << 31) else abs(code) % partitions
        return self.leader_of("__transaction_state", partition, timeout=timeout)

    def wait_for_brokers(self, count: int, *, timeout: float) -> None:
        """Wait until the cluster's metadata lists ``count`` brokers."""
        deadline = time.monotonic() + timeout
        listed = 0
        while time.monotonic() < deadline:
            try:
                listed = len(self._admin().list_topics(timeout=1.0).brokers)
            except Exception:  # KafkaException or a timeout: not yet
                listed = 0
            if listed >= count:
                return
            time.sleep(0.1)
        raise LocalKafkaError(f"the cluster lists {listed} of {count} brokers after {timeout} s")

    # -- internals --------------------------------------------------------------------------

    def _node(self, broker: int) -> _Node:
        if not self._nodes:
            raise LocalKafkaError("the cluster is not started")
        if not 0 <= broker < len(self._nodes):
            raise LocalKafkaError(f"no broker {broker}: brokers are 0..{len(self._nodes) - 1}")
        return self._nodes[broker]

    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})

    def _launch(self, node: _Node) -> None:
        argv = apache.broker_command(
            apache.require_java(),
            apache.jar_dir(self._version),
            node.workdir / "log4j2.properties",
            node.workdir / "server.properties",
            heap=self._heap,
            jvm_options=CLUSTER_JVM_OPTIONS,
        )
        node.process = BrokerProcess(
            argv, log_path=node.log_path, cwd=node.workdir, cleanup_dir=self._root
        )

    def _wait_answering(self, node: _Node) -> None:
        process = node.process
        assert process is not None
        wait_until_answering(
            node.address,
            alive=process.exit_code,
            timeout=self._start_timeout,
            on_death=lambda code: self._failed(node, f"broker {node.index} exited (exit {code})"),
            on_timeout=lambda: self._failed(
                node, f"broker {node.index} did not answer within {self._start_timeout:.0f} s"
            ),
        )

    def _wait_registered(self, node: _Node) -> None:
        """Wait until a metadata answer from another broker lists ``node`` (it registered with
        the controller and is unfenced)."""
        deadline = time.monotonic() + self._start_timeout
        while time.monotonic() < deadline:
            try:
                brokers = self._admin().list_topics(timeout=1.0).brokers
            except Exception:  # not yet
                brokers = {}
            if node.node_id in brokers:
                return
            time.sleep(0.1)
        raise self._failed(node, f"broker {node.index} was not listed by the cluster in time")

    def _failed(self, node: _Node, what: str) -> LocalKafkaError:
        """Stop every node, keep the logs, and describe the failure."""
        log = node.log_path
        root = self._root
        nodes, self._nodes = self._nodes, []
        for other in nodes:
            if other.process is not None:
                other.process.stop(self._stop_timeout)
                other.process = None
        self._root = None
        if root is not None:
            for other in nodes:
                shutil.rmtree(other.workdir / "data", ignore_errors=True)
        return LocalKafkaError(
            f"LocalKafka cluster (apache {self._version}): {what}. The logs are kept in {root}; "
            f"broker {node.index}'s last lines:\n{log_tail(log)}"
        )
