"""The Spark tests: one local[2] SparkSession for the whole session, with the Kafka connector.

Skipped (with the reason) only when pyspark or Java is missing; `scripts/setup` installs the
`spark` extra, so on a development machine and in CI they run.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/spark/" in item.nodeid:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")
    if shutil.which("java") is None:
        pytest.skip("Java is not on PATH: Spark needs a JVM")
    from pyspark.java_gateway import ensure_callback_server_started

    from parallel_consumer.spark import local_session

    session = local_session("local[2]", app_name="pc-tests")
    # foreachBatch calls back into Python through py4j's callback server: start it (and its
    # threads) here, once, rather than inside the first test that uses it.
    ensure_callback_server_started(session.sparkContext._gateway)  # type: ignore[attr-defined]
    try:
        yield session
    finally:
        session.stop()
