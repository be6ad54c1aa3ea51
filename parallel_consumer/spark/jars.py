"""The Kafka connector of Spark (``spark-sql-kafka-0-10``) and its runtime jars, from Maven
Central into the same per-user cache as LocalKafka's broker jars.

Resolved once per connector version into ``<cache>/spark-kafka-<version>/lib`` (``<cache>`` as in
:func:`parallel_consumer.testing._apache_kafka.cache_root`), then reused. Jars that pyspark
already ships (lz4-java, slf4j, snappy, the Hadoop client, the Scala library, ...) are left out,
so that one copy of each class is on the classpath: pyspark's.

The connector's version is pyspark's own. When Maven Central does not have that version (a
new pyspark can reach PyPI before its connector reaches Central), the newest released connector
of the same major version below it is taken, with a warning; ``PC_SPARK_KAFKA_VERSION`` picks
one by hand.
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import re
import shutil
import urllib.request
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from parallel_consumer._maven import RESOLVED_MARKER, MavenFailed, copy_dependencies, locked
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.testing._apache_kafka import cache_root

__all__ = ["connector_jars", "connector_version", "jar_dir", "pyspark_jars", "resolve_jars"]

log = logging.getLogger("parallel_consumer.spark")

_GROUP_PATH = "org/apache/spark/spark-sql-kafka-0-10_2.13"
_CENTRAL = "https://repo.maven.apache.org/maven2"
_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


def jar_dir(version: str) -> Path:
    """Where the connector jars of Spark ``version`` live once resolved."""
    return cache_root() / f"spark-kafka-{version}" / "lib"


def pyspark_jars() -> Path:
    """The jar folder of the installed pyspark."""
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def _release(version: str) -> tuple[int, int, int] | None:
    match = _RELEASE.match(version)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def _central_versions(timeout: float = 30.0) -> list[str]:
    url = f"{os.environ.get('PC_MAVEN_REPOSITORY', _CENTRAL)}/{_GROUP_PATH}/maven-metadata.xml"
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        root = ElementTree.fromstring(answer.read())
    return [node.text for node in root.iter("version") if node.text]


def connector_version(spark_version: str | None = None) -> str:
    """The connector version to use with pyspark ``spark_version`` (default: the installed one):
    ``PC_SPARK_KAFKA_VERSION`` if set; else that version when cached or on Maven Central; else
    the newest release of the same major version below it that Central has."""
    override = os.environ.get("PC_SPARK_KAFKA_VERSION")
    if override:
        return override
    wanted = spark_version or _pyspark_version()
    if (jar_dir(wanted) / RESOLVED_MARKER).is_file():
        return wanted
    # A fallback chosen earlier is reused without asking Central again.
    choice = cache_root() / f"spark-kafka-for-{wanted}"
    if choice.is_file():
        chosen = choice.read_text().strip()
        if (jar_dir(chosen) / RESOLVED_MARKER).is_file():
            return chosen
    target = _release(wanted)
    try:
        available = _central_versions()
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read the Spark Kafka connector's versions from Maven Central ({exc}); "
            "set PC_SPARK_KAFKA_VERSION, or pass spark.jars yourself"
        ) from exc
    if wanted in available:
        return wanted
    candidates = [v for v in available if _fits(v, target)]
    if not candidates:
        raise ConfigurationError(
            f"Maven Central has no spark-sql-kafka-0-10_2.13 for pyspark {wanted} (nor an "
            "earlier release of its major version); set PC_SPARK_KAFKA_VERSION"
        )
    chosen = max(candidates, key=lambda v: _release(v) or (0, 0, 0))
    log.warning(
        "Maven Central has no spark-sql-kafka-0-10_2.13:%s; using %s, the newest release of "
        "Spark %s below it (set PC_SPARK_KAFKA_VERSION to choose)",
        wanted,
        chosen,
        wanted.split(".")[0],
    )
    choice.parent.mkdir(parents=True, exist_ok=True)
    choice.write_text(chosen + "\n")
    return chosen


def _fits(version: str, target: tuple[int, int, int] | None) -> bool:
    found = _release(version)
    return found is not None and target is not None and found[0] == target[0] and found <= target


def _artifact(jar: str) -> str:
    """``lz4-java-1.10.1.jar`` -> ``lz4-java``: the name without its version."""
    # The version is the first "-<digits>.<digits>..." from the left that runs to ".jar"
    # (``-0-10_2.13`` in spark-sql-kafka-0-10_2.13 is part of the name).
    return re.sub(r"-\d+(\.\d+)+([.-][A-Za-z0-9]+)*\.jar$", "", jar)


def resolve_jars(version: str | None = None, *, timeout: float = 900.0) -> Path:
    """Resolve the connector's runtime jars with Maven (once), returning their folder."""
    version = version or connector_version()
    target = jar_dir(version)
    if (target / RESOLVED_MARKER).is_file():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigurationError(
            f"Maven (mvn) was not found on PATH, and the Spark Kafka connector {version} is not "
            f"cached in {target}. Install Maven so it can be resolved from Maven Central once, "
            "or pass spark.jars / spark.jars.packages yourself."
        )
    with locked(target.parent / ".resolve.lock"):
        if (target / RESOLVED_MARKER).is_file():
            return target
        pom = importlib.resources.files(__package__).joinpath("maven-pom.xml").read_text()
        try:
            copy_dependencies(
                target,
                pom.replace("@SPARK_VERSION@", version),
                mvn=mvn,
                expect="spark-sql-kafka-*.jar",
                marker=version + "\n",
                timeout=timeout,
            )
        except MavenFailed as exc:
            if exc.timed_out:
                raise ConfigurationError(
                    f"Maven did not resolve the Spark Kafka connector {version} within "
                    f"{timeout:.0f} s; check network access to Maven Central."
                ) from exc
            raise ConfigurationError(
                f"Maven could not resolve org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"
                f" (exit {exc.returncode}). Last lines of mvn output:\n{exc.tail}"
            ) from exc
    return target


def connector_jars(version: str | None = None) -> list[Path]:
    """The connector's jars to put on ``spark.jars``: resolved (once), minus the artifacts the
    installed pyspark already ships."""
    shipped = {_artifact(jar.name) for jar in pyspark_jars().glob("*.jar")}
    return sorted(
        jar for jar in resolve_jars(version).glob("*.jar") if _artifact(jar.name) not in shipped
    )
