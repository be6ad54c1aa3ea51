"""A Spark driver on the standalone cluster, run as its own process by
``test_standalone_cluster.py`` (one SparkContext per process: the test process may hold the
``local[2]`` session already). Prints one JSON line of what it did.

``python cluster_driver.py backfill|stream SETTINGS_JSON``: SETTINGS holds ``conf`` (Spark
settings: the cluster's, see :meth:`SparkCluster.session_conf`), ``bootstrap``, ``source``,
``dlq``, and for ``stream`` ``checkpoint`` and ``max_offsets``.

The handler's module is shipped as docs/spark.md says (``addPyFile``); the executors' Python
path is this checkout's root only, so they could not import it otherwise. A streaming query
that fails is started again from its checkpoint, as a supervisor would, up to 3 times.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import spark_pipeline
from pipeline_checks import pipeline_options

from parallel_consumer.spark import backfill, local_session, run_stream

ROOT = Path(__file__).resolve().parents[2]


def main(mode: str, settings: dict[str, Any]) -> dict[str, Any]:
    began = time.monotonic()
    conf = {**settings["conf"], "spark.executorEnv.PYTHONPATH": str(ROOT)}
    spark = local_session(conf.pop("spark.master"), app_name=f"pc-cluster-{mode}", **conf)
    timings = {"session_s": round(time.monotonic() - began, 1)}
    try:
        spark.sparkContext.addPyFile(spark_pipeline.__file__)
        options = pipeline_options(settings["dlq"])
        if mode == "backfill":
            result = backfill(
                spark,
                spark_pipeline.pipeline,
                bootstrap_servers=settings["bootstrap"],
                topic=settings["source"],
                options=options,
            )
            return {
                **timings,
                "run_s": round(time.monotonic() - began - timings["session_s"], 1),
                "inputs": result.inputs,
                "outputs": result.outputs,
                "dead_letters": result.dead_letters,
                "retries": result.retries,
            }
        restarts: list[str] = []
        rows = 0
        while True:
            query = run_stream(
                spark,
                spark_pipeline.pipeline,
                bootstrap_servers=settings["bootstrap"],
                topic=settings["source"],
                checkpoint=settings["checkpoint"],
                options=options,
                source_options={"maxOffsetsPerTrigger": settings["max_offsets"]},
                trigger={"availableNow": True},
            )
            try:
                query.awaitTermination(300)
                failure = query.exception()
                rows += sum(p["numInputRows"] for p in query.recentProgress)
            finally:
                query.stop()
            if failure is None:
                run_s = round(time.monotonic() - began - timings["session_s"], 1)
                return {**timings, "run_s": run_s, "rows": rows, "restarts": restarts}
            restarts.append(str(failure).splitlines()[0][:300])
            if len(restarts) > 3:
                raise RuntimeError(f"the query failed {len(restarts)} times: {restarts}")
    finally:
        spark.stop()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2]))), flush=True)
