"""The Spark runner on a real Spark standalone cluster started from the installed pyspark (a
Master and two Workers of one core each, their own JVMs, executors and Python workers, on
loopback; :class:`~parallel_consumer.testing.spark_cluster.SparkCluster`), against the real
broker: a backfill, then a streaming query whose node is SIGKILLed mid-micro-batch.

The driver runs in its own process (``cluster_driver.py``): one SparkContext per process, and
this one may hold the ``local[2]`` session. The handler's module is shipped with ``addPyFile``.
The tests run in file order: the second one leaves the cluster one Worker short.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import spark_pipeline
from pipeline_checks import (
    Stored,
    check_dead_letters,
    check_key_order,
    first_of_each,
    produce_inputs,
    read_all,
)
from spark_pipeline import (
    CLIENT_HEADER,
    MODULE_HEADER,
    NODE_HEADER,
    PAUSE_HEADER,
    is_flaky,
    is_poison,
)

from parallel_consumer.spark import SOURCE_ID

if TYPE_CHECKING:
    from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory
    from parallel_consumer.testing.spark_cluster import SparkCluster

DRIVER = Path(__file__).with_name("cluster_driver.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spark_cluster() -> Iterator[SparkCluster]:
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")
    from parallel_consumer.testing.spark_cluster import SparkCluster

    began = time.monotonic()
    with SparkCluster(workers=2, cores=1) as cluster:
        print(f"\nstandalone cluster up in {time.monotonic() - began:.1f} s: {cluster.master_url}")
        yield cluster


#: Short jobs on few cores: the JVMs' quick compiler only (docs/spark.md, settings worth knowing).
QUICK_JIT = {
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
}


def start_driver(mode: str, settings: dict[str, Any], log: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(DRIVER.parent)])}
    with log.open("w") as stderr:
        return subprocess.Popen(
            [sys.executable, str(DRIVER), mode, json.dumps(settings)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )


def finish(driver: subprocess.Popen[str], log: Path, timeout: float = 240) -> dict[str, Any]:
    try:
        out, _ = driver.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        driver.kill()
        driver.communicate()
        raise AssertionError(f"the driver did not finish; its log:\n{tail(log)}") from None
    assert driver.returncode == 0, f"the driver failed ({driver.returncode}):\n{tail(log)}"
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-40:])


def worker_of(cluster: SparkCluster, output: Stored) -> int:
    """The pid of the Worker whose executor made ``output`` (see ``ancestor_groups``)."""
    groups = {int(g) for g in (output.headers[NODE_HEADER] or b"").split(b",")}
    (worker,) = groups & set(cluster.worker_pids)
    return worker


@pytest.mark.timeout(300)
def test_backfill_on_a_standalone_cluster_ships_the_handler_and_spreads_over_workers(
    spark_cluster: SparkCluster, kafka: KafkaBroker, topic: TopicFactory, tmp_path: Path
) -> None:
    # Given 3,000 records of 30 keys in 4 partitions, 3 % transient failures, 0.5 % poison
    source, output = topic(4), topic(4)
    dlq = f"{source}.dead"
    produce_inputs(kafka.bootstrap_servers, source, output, 0, 3_000, 30)
    values = [f"{i}".encode() for i in range(3_000)]
    poison = {v for v in values if is_poison(v)}
    # When a driver on the cluster backfills the topic
    began = time.monotonic()
    log = tmp_path / "driver.log"
    settings = {
        "conf": {**spark_cluster.session_conf(), **QUICK_JIT},
        "bootstrap": kafka.bootstrap_servers,
        "source": source,
        "dlq": dlq,
    }
    driver = start_driver("backfill", settings, log)
    result = finish(driver, log)
    print(f"backfill of 3,000 records on the cluster: {time.monotonic() - began:.1f} s {result}")
    # Then every good record has its output, in key order, and the poison is dead-lettered
    assert result["inputs"] == 3_000
    assert (result["outputs"], result["dead_letters"]) == (3_000 - len(poison), len(poison))
    assert result["retries"] >= sum(map(is_flaky, values))
    outputs = read_all(kafka.bootstrap_servers, output)
    assert sorted(int(r.value or b"") for r in outputs) == sorted(
        int(v) for v in values if v not in poison
    )
    check_key_order(outputs)
    assert len({r.headers[SOURCE_ID] for r in outputs}) == len(outputs)
    check_dead_letters(read_all(kafka.bootstrap_servers, dlq), source, output, poison)
    # And the handler ran on both Workers, from the shipped copy of its module, with one client
    # made lazily per Python worker process
    assert {worker_of(spark_cluster, r) for r in outputs} == set(spark_cluster.worker_pids)
    shipped = {r.headers[MODULE_HEADER] for r in outputs}
    assert os.path.abspath(spark_pipeline.__file__).encode() not in shipped
    # (an executor's copy lives in its Worker's work folder)
    assert all((path or b"").startswith(str(spark_cluster.directory).encode()) for path in shipped)
    clients: dict[bytes, set[bytes]] = {}
    for record in outputs:
        name = record.headers[CLIENT_HEADER] or b""
        clients.setdefault(name.split(b"-")[0], set()).add(name)
    assert all(len(names) == 1 for names in clients.values()), clients
    assert str(driver.pid).encode() not in clients


@pytest.mark.timeout(300)
def test_stream_on_a_standalone_cluster_survives_a_worker_killed_mid_micro_batch(
    spark_cluster: SparkCluster, kafka: KafkaBroker, topic: TopicFactory, tmp_path: Path
) -> None:
    # Given 6,000 records (3 micro-batches of 2,000), one of the second micro-batch stopping its
    # task the first time it is handled; When the Worker running that task is SIGKILLed; Then
    # nothing is lost (see stream_with_workers_killed)
    stream_with_workers_killed(spark_cluster, kafka, topic, tmp_path, 6_000, [3_500])


@pytest.mark.stress
@pytest.mark.timeout(900)
def test_a_long_stream_on_a_standalone_cluster_survives_workers_killed_and_replaced(
    kafka: KafkaBroker, topic: TopicFactory, tmp_path: Path
) -> None:
    # Given 60,000 records (30 micro-batches), a cluster of its own, and three records that stop
    # their tasks; When each one's Worker is SIGKILLed and a new Worker joins after each kill;
    # Then nothing is lost
    from parallel_consumer.testing.spark_cluster import SparkCluster

    with SparkCluster(workers=2, cores=1) as cluster:
        stream_with_workers_killed(
            cluster, kafka, topic, tmp_path, 60_000, [12_000, 30_000, 48_000], replace=True
        )


def stream_with_workers_killed(
    cluster: SparkCluster,
    kafka: KafkaBroker,
    topic: TopicFactory,
    tmp_path: Path,
    records: int,
    pauses: list[int],
    *,
    replace: bool = False,
) -> None:
    """``records`` records of 100 keys in 4 partitions, 3 % transient failures, 0.5 % poison,
    through a streaming query of 2,000-record micro-batches on ``cluster``. The first good
    record at or after each of ``pauses`` stops its task the first time it is handled; the
    Worker running that task is then SIGKILLed with its executor and Python workers (and, with
    ``replace``, a new Worker started). Checked: every good record's output, once each after
    dropping repeated ``pc.source.id`` values (what a killed task wrote before it died), in
    per-key order; the poison dead-lettered; each paused record's output made by another
    Worker than the one killed while it waited."""
    source, output = topic(4), topic(4)
    dlq = f"{source}.dead"
    good = (i for i in range(records) if not (is_poison(b"%d" % i) or is_flaky(b"%d" % i)))
    paused: dict[int, Path] = {}
    for index, at in enumerate(pauses):
        paused[next(i for i in good if i >= at)] = tmp_path / f"paused-{index}"
    produce_inputs(
        kafka.bootstrap_servers,
        source,
        output,
        0,
        records,
        100,
        extra_headers={i: [(PAUSE_HEADER, str(marker).encode())] for i, marker in paused.items()},
    )
    values = [f"{i}".encode() for i in range(records)]
    poison = {v for v in values if is_poison(v)}
    log = tmp_path / "driver.log"
    settings = {
        "conf": {**cluster.session_conf(), **QUICK_JIT},
        "bootstrap": kafka.bootstrap_servers,
        "source": source,
        "dlq": dlq,
        "checkpoint": str(tmp_path / "checkpoint"),
        "max_offsets": 2_000,
    }
    began = time.monotonic()
    driver = start_driver("stream", settings, log)
    killed: dict[int, int] = {}  # paused record -> the Worker killed while it waited
    for record, marker in paused.items():
        deadline = time.monotonic() + 180
        while not (marker.exists() and marker.read_text().endswith("\n")):
            assert driver.poll() is None, f"the driver ended before the pause:\n{tail(log)}"
            assert time.monotonic() < deadline, f"the paused record was not reached:\n{tail(log)}"
            time.sleep(0.1)
        groups = {int(g) for g in marker.read_text().split(",")}
        (victim,) = [i for i, pid in enumerate(cluster.worker_pids) if pid in groups]
        killed[record] = cluster.worker_pids[victim]
        cluster.kill_worker(victim)
        if replace:
            cluster.add_worker(wait=False)
    result = finish(driver, log, timeout=180 + records / 100)
    elapsed = time.monotonic() - began
    outputs = read_all(kafka.bootstrap_servers, output)
    unique = first_of_each(outputs, SOURCE_ID)
    assert sorted(int(r.value or b"") for r in unique) == sorted(
        int(v) for v in values if v not in poison
    )
    check_key_order(unique)
    letters = first_of_each(read_all(kafka.bootstrap_servers, dlq), SOURCE_ID)
    check_dead_letters(letters, source, output, poison)
    for record, victim_pid in killed.items():
        (redone,) = [r for r in outputs if r.value == b"%d" % record]
        assert worker_of(cluster, redone) != victim_pid
    print(
        f"{records:,} records, {len(killed)} worker(s) killed mid-micro-batch: {elapsed:.1f} s; "
        f"{len(outputs) - len(unique)} repeated outputs; {result}"
    )
