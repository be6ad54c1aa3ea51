"""The standalone cluster helper's parts that need no JVM: its refusals, and finding every
process under a Worker (what ``kill_worker`` and ``stop`` kill). The cluster itself runs in
``tests/spark/test_standalone_cluster.py``."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from parallel_consumer.testing.spark_cluster import (
    SparkCluster,
    SparkClusterError,
    _descendants,
    _kill,
)


def test_a_cluster_without_workers_or_cores_is_refused() -> None:
    with pytest.raises(ValueError, match="workers and cores must be >= 1"):
        SparkCluster(workers=0)
    with pytest.raises(ValueError, match="workers and cores must be >= 1"):
        SparkCluster(cores=0)


def test_the_master_url_of_a_cluster_not_started_says_so() -> None:
    with pytest.raises(SparkClusterError, match="not started"):
        _ = SparkCluster().master_url


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_every_process_under_a_worker_is_found_and_killed() -> None:
    # Given a process whose child has a child of its own (a Worker, its executor, a Python worker)
    sleeper = f"{sys.executable} -c 'import time; time.sleep(60)'"
    tree = subprocess.Popen(["/bin/sh", "-c", f'/bin/sh -c "{sleeper}; true" & wait'])
    try:
        deadline = time.monotonic() + 30
        while len(under := _descendants(tree.pid)) < 2:
            assert time.monotonic() < deadline, "the child did not start"
            time.sleep(0.05)
        # When they are killed
        _kill(under)
        # Then the parent sees its child gone at once
        assert tree.wait(10) is not None
        assert _descendants(tree.pid) == []
    finally:
        tree.kill()
        tree.wait()
