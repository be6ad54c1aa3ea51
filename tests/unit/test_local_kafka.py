"""LocalKafka's decisions and error messages, without starting a broker."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from parallel_consumer.errors import ParallelConsumerError
from parallel_consumer.testing import Capabilities, LocalKafka, LocalKafkaError
from parallel_consumer.testing import _apache_kafka as apache
from parallel_consumer.testing._capabilities import APACHE_CAPABILITIES, TANSU_CAPABILITIES
from parallel_consumer.testing.local_kafka import choose_backend


def _script(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def bare_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH holds only an empty folder (add fake tools to it); the jar cache is empty."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("PC_KAFKA_CACHE", str(tmp_path / "cache"))
    return bin_dir


def test_error_is_a_library_error() -> None:
    assert issubclass(LocalKafkaError, ParallelConsumerError)


def test_without_java_the_apache_backend_says_what_to_install(bare_path: Path) -> None:
    with pytest.raises(LocalKafkaError, match=r"Java was not found.*openjdk-17.*tansu"):
        LocalKafka(backend="apache").start()


def test_without_maven_and_no_cached_jars_it_says_what_to_install(bare_path: Path) -> None:
    _script(bare_path, "java", "exit 0")
    with pytest.raises(
        LocalKafkaError, match=r"Maven \(mvn\) was not found.*apt-get install maven"
    ):
        LocalKafka(backend="apache").start()


def test_maven_failure_quotes_the_tail_of_its_output(bare_path: Path) -> None:
    _script(bare_path, "java", "exit 0")
    _script(bare_path, "mvn", "echo 'resolving...'; echo '[ERROR] Could not find artifact'; exit 1")

    with pytest.raises(LocalKafkaError) as raised:
        apache.resolve_jars("0.0.0-missing")

    message = str(raised.value)
    assert "kafka_2.13:0.0.0-missing" in message
    assert "[ERROR] Could not find artifact" in message
    assert not apache.is_resolved("0.0.0-missing")


def test_auto_falls_back_to_tansu_without_java(bare_path: Path) -> None:
    assert choose_backend("auto") == "tansu"


def test_auto_uses_apache_when_java_and_cached_jars_exist(bare_path: Path) -> None:
    _script(bare_path, "java", "exit 0")
    lib = apache.jar_dir(apache.DEFAULT_KAFKA_VERSION)
    lib.mkdir(parents=True)
    (lib / ".resolved").write_text("cached")

    assert choose_backend("auto") == "apache"


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(LocalKafkaError, match="unknown backend 'kraft'"):
        choose_backend("kraft")


def test_tansu_takes_no_broker_config() -> None:
    with pytest.raises(LocalKafkaError, match="broker_config is not supported by the tansu"):
        LocalKafka(backend="tansu", broker_config={"offset.metadata.max.bytes": "8192"})


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("backend", ["apache", "tansu"])
def test_a_requested_port_in_use_is_reported_before_anything_starts(
    busy_port: int, backend: str
) -> None:
    kafka = LocalKafka(backend=backend, port=busy_port)  # type: ignore[arg-type]
    with pytest.raises(LocalKafkaError, match=f"127.0.0.1:{busy_port} is already in use"):
        kafka.start()
    assert not kafka.running


def test_a_missing_tansu_binary_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PC_TANSU_BIN", "/nonexistent/tansu")
    with pytest.raises(LocalKafkaError, match="PC_TANSU_BIN='/nonexistent/tansu' is not"):
        LocalKafka(backend="tansu").start()


def test_bootstrap_servers_before_start_is_an_error() -> None:
    with pytest.raises(LocalKafkaError, match="not started"):
        _ = LocalKafka(backend="tansu").bootstrap_servers


def test_stop_before_start_is_harmless() -> None:
    kafka = LocalKafka(backend="tansu")
    kafka.stop()
    kafka.stop()
    assert repr(kafka) == "<LocalKafka tansu tansu-0.6 stopped>"


def test_cache_folder_follows_pc_kafka_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PC_KAFKA_CACHE", "/srv/jars")
    assert apache.jar_dir("4.3.1") == Path("/srv/jars/kafka-4.3.1/lib")
    monkeypatch.delenv("PC_KAFKA_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert apache.jar_dir("4.3.1") == Path("/xdg/parallel-consumer/kafka-4.3.1/lib")


def test_server_properties_are_a_fast_single_node_and_overrides_win() -> None:
    props = apache.server_properties(
        port=1000,
        controller_port=1001,
        data_dir=Path("/d"),
        overrides={"offset.metadata.max.bytes": "8192", "num.partitions": "3"},
    )
    assert props["controller.quorum.voters"] == "1@127.0.0.1:1001"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:1000"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["auto.create.topics.enable"] == "false"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert props["share.coordinator.state.topic.replication.factor"] == "1"
    assert props["offset.metadata.max.bytes"] == "8192"
    assert props["num.partitions"] == "3"


def test_properties_rendering_escapes_what_java_would_misread() -> None:
    text = apache.render_properties({"a.b": "x", "odd key": "c:\\dir\nnext"})
    assert text == "a.b=x\nodd\\ key=c:\\\\dir\\nnext\n"


def test_cluster_ids_are_22_url_safe_characters_fresh_and_never_look_like_options() -> None:
    ids = [apache.new_cluster_id() for _ in range(500)]
    assert len(set(ids)) == len(ids)
    alphabet = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    for cluster_id in ids:
        assert len(cluster_id) == 22
        assert set(cluster_id) <= alphabet
        assert not cluster_id.startswith("-")


def test_pom_template_is_shipped_with_the_version_placeholder() -> None:
    import importlib.resources

    pom = importlib.resources.files("parallel_consumer.testing").joinpath("kafka", "pom.xml")
    assert "@KAFKA_VERSION@" in pom.read_text()


def test_capabilities_name_what_is_missing_and_why() -> None:
    assert APACHE_CAPABILITIES.missing("commit_metadata", "transactions") == ()
    assert TANSU_CAPABILITIES.missing("commit_metadata", "restart") == ("commit_metadata",)
    assert "drops" in TANSU_CAPABILITIES.reason("commit_metadata")
    assert "restart" in Capabilities.names()
    with pytest.raises(ValueError, match="unknown capability"):
        APACHE_CAPABILITIES.missing("teleport")


def test_no_instance_dir_is_left_by_a_failed_start(
    bare_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.makedirs(tmp_path / "tmp")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with pytest.raises(LocalKafkaError):
        LocalKafka(backend="apache").start()
    assert os.listdir(tmp_path / "tmp") == []
