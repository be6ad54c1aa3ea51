"""LocalKafka(brokers=3) without starting it: its nodes' settings, the coordinator's partition,
and refusals of what a cluster or a single broker cannot do."""

from __future__ import annotations

from pathlib import Path

import pytest

from parallel_consumer.testing import LocalKafka, LocalKafkaError
from parallel_consumer.testing._cluster import cluster_properties, java_string_hash


def test_java_string_hash_matches_javas_string_hashcode() -> None:
    # Values of Java's "...".hashCode()
    assert java_string_hash("") == 0
    assert java_string_hash("abc") == 96354
    assert java_string_hash("hello world") == 1794106052
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert java_string_hash("é€") == 233 * 31 + 8364


def test_each_node_replicates_three_times_with_two_in_sync_and_user_settings_win() -> None:
    props = cluster_properties(
        node_id=2,
        port=9092,
        controller_port=9093,
        voters="1@127.0.0.1:1,2@127.0.0.1:9093,3@127.0.0.1:3",
        replicas=3,
        data_dir=Path("/tmp/x"),
        overrides={"min.insync.replicas": "1"},
    )
    assert props["node.id"] == "2"
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"].count("@") == 3
    assert props["default.replication.factor"] == "3"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["transaction.state.log.replication.factor"] == "3"
    assert props["transaction.state.log.min.isr"] == "2"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["min.insync.replicas"] == "1"  # the user's override


def test_a_cluster_needs_the_apache_backend_and_free_ports() -> None:
    with pytest.raises(LocalKafkaError, match="backend='apache'"):
        LocalKafka(brokers=3, backend="tansu")
    with pytest.raises(LocalKafkaError, match="port=None"):
        LocalKafka(brokers=3, port=9092)


def test_broker_faults_need_a_cluster_and_a_cluster_has_no_restart() -> None:
    single = LocalKafka()
    with pytest.raises(LocalKafkaError, match="brokers=3"):
        single.kill_broker(0)
    cluster = LocalKafka(brokers=3)
    assert cluster.brokers == 3
    assert not cluster.running
    assert cluster.log_path is None
    with pytest.raises(LocalKafkaError, match="not started"):
        cluster.leader_of("t", 0)
    with pytest.raises(LocalKafkaError, match="start_broker"):
        cluster.restart()
