"""benchmarks/spark_bench.py's CPU accounting: which process used how much, read from /proc."""

from __future__ import annotations

import importlib.util
import os
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


def test_a_process_is_put_in_its_role_by_its_command_line_and_counts_whole(bench, tmp_path):
    # A stand-in whose command line carries the broker's mark and whose name holds spaces and
    # a parenthesis (the stat file's name field): it burns 0.3 s of CPU, says so, then waits.
    done, stop = tmp_path / "done", tmp_path / "stop"
    code = (
        "import pathlib, sys, time\n"
        "pathlib.Path('/proc/self/comm').write_text('a) b (c')\n"
        "end = time.process_time() + 0.3\n"
        "while time.process_time() < end:\n"
        "    pass\n"
        "pathlib.Path(sys.argv[1]).touch()\n"
        "while not pathlib.Path(sys.argv[2]).exists():\n"
        "    time.sleep(0.01)\n"
    )
    before = bench.cpu_snapshot()
    child = subprocess.Popen([sys.executable, "-c", code, str(done), str(stop), "kafka.Kafka"])
    try:
        deadline = time.monotonic() + 30
        while not done.exists():
            assert time.monotonic() < deadline, "the stand-in did not burn its CPU"
            time.sleep(0.01)
        after = bench.cpu_snapshot()
    finally:
        stop.touch()
        child.wait(10)
    role, seconds = after["pids"][child.pid]
    assert role == "broker"
    # Born between the snapshots, it counts whole (interpreter start-up included).
    assert child.pid not in before["pids"]
    assert seconds >= 0.28
    assert bench.cpu_used(before, after)["broker"] >= seconds


def test_jvm_threads_are_summed_by_name_without_their_numbers(bench):
    assert bench.thread_kind("Executor task launch worker for task 12") == (
        "Executor task launch worker for task"
    )
    assert bench.thread_kind("GC Thread#3") == "GC Thread"
    # The quick and the optimising compiler stay apart.
    assert bench.thread_kind("C1 CompilerThre") == "C1 CompilerThre"
    assert bench.thread_kind("C2 CompilerThre") == "C2 CompilerThre"


def test_jvm_threads_are_differenced_one_by_one_and_ended_ones_are_kept_apart(bench):
    def snapshot(jvm: float, threads: dict[int, tuple[str, float]]) -> dict[str, object]:
        return {
            "pids": {7: ("spark_jvm", jvm)},
            "jvm_threads": threads,
            "busy_s": 0.0,
            "steal_s": 0.0,
        }

    before = snapshot(5.0, {1: ("worker", 1.0), 2: ("worker", 2.0), 3: ("gone", 1.0)})
    # Thread 3 ended after using 0.5 s more; thread 4 is new.
    after = snapshot(7.0, {1: ("worker", 1.5), 2: ("worker", 2.5), 4: ("worker", 0.5)})
    used = bench.cpu_used(before, after)
    assert used["spark_jvm"] == 2.0
    assert used["jvm/worker"] == 1.5
    assert used["jvm/(ended threads)"] == 0.5


def test_no_snapshot_means_nothing_reported(bench):
    assert bench.cpu_used(None, bench.cpu_snapshot()) == {}
    assert bench.cpu_summary([{"wall_s": 1.0, "cpu_s": {}}]) == ""


def test_the_summary_sets_the_machine_beside_the_wall_only_when_there_is_one(bench):
    cpu = {"spark_jvm": 1.0, "python_workers": 0.5, "machine_busy": 2.0, "machine_steal": 0.0}
    with_wall = bench.cpu_summary([{"wall_s": 1.5, "cpu_s": cpu}])
    assert "spark_jvm 1.00, python_workers 0.50" in with_wall
    assert f"busy 2.00 of {1.5 * (os.cpu_count() or 1):.2f}" in with_wall
    without = bench.cpu_summary([{"cpu_s": cpu}], "over the window")
    assert "CPU over the window" in without
    assert " of " not in without.split("busy")[1]


def test_the_jvm_flags_shown_leave_out_the_one_pyspark_always_adds(bench):
    assert bench.jvm_flags("-Dx=1 -XX:+IgnoreUnrecognizedVMOptions --add-opens=a") == "-"
    assert bench.jvm_flags("-XX:+IgnoreUnrecognizedVMOptions -XX:TieredStopAtLevel=1") == (
        "-XX:TieredStopAtLevel=1"
    )
