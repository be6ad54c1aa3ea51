"""benchmarks/spark_bench.py's CPU accounting: which process used how much, read from /proc."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc (Linux)")

SCRIPT = Path(__file__).parents[3] / "benchmarks" / "spark_bench.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spark_bench_under_test", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_this_process_counts_as_the_bench_and_its_cpu_is_attributed(bench):
    before = bench.cpu_snapshot()
    _burn(0.3)
    used = bench.cpu_used(before, bench.cpu_snapshot())
    assert used["bench"] >= 0.25
    # The machine was at least as busy as this process (with some ticks of slack).
    assert used["machine_busy"] >= used["bench"] - 0.05
    assert used["machine_steal"] >= 0


def test_a_process_is_put_in_its_role_by_its_command_line(bench, tmp_path):
    # A stand-in whose command line carries the broker's mark, burning CPU until told to end.
    stop = tmp_path / "stop"
    code = (
        "import pathlib, sys, time\n"
        "stop = pathlib.Path(sys.argv[1])\n"
        "while not stop.exists():\n"
        "    pass\n"
    )
    before = bench.cpu_snapshot()
    child = subprocess.Popen([sys.executable, "-c", code, str(stop), "kafka.Kafka"])
    try:
        time.sleep(0.5)
        after = bench.cpu_snapshot()
    finally:
        stop.touch()
        child.wait(10)
    assert after["pids"][child.pid][0] == "broker"
    used = bench.cpu_used(before, after)
    # Born between the snapshots: it counts whole.
    assert used["broker"] >= 0.2


def test_no_snapshot_means_nothing_reported(bench):
    assert bench.cpu_used(None, bench.cpu_snapshot()) == {}
    assert bench.cpu_summary([{"wall_s": 1.0, "cpu_s": {}}]) == ""
