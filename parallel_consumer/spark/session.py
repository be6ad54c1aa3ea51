"""A local SparkSession configured for this library: for tests, demos and laptops."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from parallel_consumer.spark.jars import connector_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["local_session"]


def local_session(
    master: str = "local[2]",
    *,
    app_name: str = "parallel-consumer",
    kafka: bool = True,
    log_level: str = "WARN",
    **conf: str,
) -> SparkSession:
    """A SparkSession on this machine (``getOrCreate``: an active session is reused; the
    runtime settings below are applied to it, its JVM's settings stay as they were).

    - Spark's Python workers run this interpreter (``PYSPARK_PYTHON`` and
      ``spark.pyspark.python``) with this process's ``sys.path``, so handlers defined in any
      importable module (a test module, a script's folder) reach them by reference.
    - The driver binds to loopback; the UI is off.
    - ``kafka=True`` puts the Kafka connector on ``spark.jars`` (resolved from Maven Central
      into the per-user cache on first use, see :mod:`parallel_consumer.spark.jars`).

    ``conf`` are further Spark settings by their full names:
    ``local_session(**{"spark.sql.shuffle.partitions": "4"})``.
    """
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Else Spark binds to the first non-loopback interface of a host that resolves to loopback.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    settings = {
        "spark.app.name": app_name,
        "spark.master": master,
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYTHONPATH": path,
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Small local jobs: a few shuffle partitions, not 200.
        "spark.sql.shuffle.partitions": "4",
        # Smaller Arrow batches let a task's lanes start while the JVM still reads its Kafka
        # partitions (benchmarks/spark_bench.py, 20,000 records: 2.7-3.0 s instead of 3.4-5.3 s
        # at 1,000 rather than the default 10,000; then 1.35-1.36 s at 500 against 1.42 s at
        # 1,000, a small difference beside the machine's drift, and no better at 250). The
        # JVM's own options are left alone (docs/spark.md#performance says why).
        "spark.sql.execution.arrow.maxRecordsPerBatch": "500",
    }
    if kafka:
        settings["spark.jars"] = ",".join(str(jar) for jar in connector_jars())
    settings.update(conf)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    return session
