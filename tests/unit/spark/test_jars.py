"""Choosing and caching Spark's Kafka connector jars, without Maven or the network."""

from __future__ import annotations

from pathlib import Path

import pytest

from parallel_consumer import ConfigurationError
from parallel_consumer.spark import jars


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PC_KAFKA_CACHE", str(tmp_path))
    monkeypatch.delenv("PC_SPARK_KAFKA_VERSION", raising=False)
    return tmp_path


def _resolved(version: str) -> None:
    lib = jars.jar_dir(version)
    lib.mkdir(parents=True)
    (lib / ".resolved").write_text(version)


def test_artifact_names_drop_their_versions() -> None:
    assert jars._artifact("lz4-java-1.10.1.jar") == "lz4-java"
    assert jars._artifact("spark-sql-kafka-0-10_2.13-4.2.0.jar") == "spark-sql-kafka-0-10_2.13"
    assert jars._artifact("zstd-jni-1.5.7-7.jar") == "zstd-jni"
    assert jars._artifact("hadoop-client-runtime-3.5.0.jar") == "hadoop-client-runtime"
    assert jars._artifact("scala-parallel-collections_2.13-1.2.0.jar") == (
        "scala-parallel-collections_2.13"
    )


def test_the_exact_version_is_used_when_central_has_it(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jars, "_central_versions", lambda: ["4.1.0", "4.2.0", "4.3.0"])
    assert jars.connector_version("4.3.0") == "4.3.0"


def test_a_missing_version_falls_back_to_the_newest_release_below_it_once(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given Central without 4.3.0 (previews and other majors do not count)
    monkeypatch.setattr(
        jars, "_central_versions", lambda: ["3.5.9", "4.1.3", "4.2.0", "4.2.0-preview5", "5.0.0"]
    )
    # When the connector for pyspark 4.3.0 is chosen, and its jars are resolved
    assert jars.connector_version("4.3.0") == "4.2.0"
    _resolved("4.2.0")

    # Then the choice is reused without asking Central again
    def offline() -> list[str]:
        raise OSError("no network")

    monkeypatch.setattr(jars, "_central_versions", offline)
    assert jars.connector_version("4.3.0") == "4.2.0"


def test_no_usable_version_or_no_network_says_what_to_set(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jars, "_central_versions", lambda: ["3.5.9"])
    with pytest.raises(ConfigurationError, match="PC_SPARK_KAFKA_VERSION"):
        jars.connector_version("4.3.0")

    def offline() -> list[str]:
        raise OSError("no network")

    monkeypatch.setattr(jars, "_central_versions", offline)
    with pytest.raises(ConfigurationError, match="PC_SPARK_KAFKA_VERSION"):
        jars.connector_version("4.3.0")


def test_the_environment_variable_wins(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PC_SPARK_KAFKA_VERSION", "4.1.3")
    assert jars.connector_version("4.3.0") == "4.1.3"
