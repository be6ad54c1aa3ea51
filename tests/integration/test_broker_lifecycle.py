"""LocalKafka starts, restarts and stops cleanly, and a broker that dies says where its log is.

Each test starts its own broker of the session's backend; start times are printed (run with
``-s`` or see the ``start_seconds`` user property), never asserted: speed is measured in benchmarks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from parallel_consumer.testing import LocalKafka, LocalKafkaError, running_instances
from parallel_consumer.testing._broker_process import free_port
from parallel_consumer.testing.local_kafka import choose_backend

pytestmark = pytest.mark.kafka

BACKEND = choose_backend(os.environ.get("PC_TEST_KAFKA_BACKEND", "auto"))
needs_apache = pytest.mark.skipif(
    BACKEND != "apache", reason=f"needs the apache backend (this run uses {BACKEND})"
)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it holds no ports or files, but it must have been reaped.
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "zombie" not in status.read_text()


def test_stop_leaves_no_process_and_no_directory(record_property: pytest.RecordProperty) -> None:
    kafka = LocalKafka(backend=BACKEND).start()
    record_property("start_seconds", kafka.start_seconds)
    print(f"\n{kafka.backend} {kafka.version} started in {kafka.start_seconds:.2f} s")
    assert kafka.running
    assert kafka in running_instances()
    process = kafka._process
    assert process is not None
    pid = process.pid
    log_path = kafka.log_path
    assert log_path is not None
    workdir = log_path.parent

    kafka.stop()

    assert not _process_exists(pid)
    assert not workdir.exists()
    assert kafka not in running_instances()
    kafka.stop()  # idempotent


def test_a_killed_owner_leaves_no_broker_and_no_directory_behind() -> None:
    # The owner starts a broker, reports it, and dies by SIGKILL: no atexit, no finally. The
    # watchdog must stop the broker and delete its files.
    owner = (
        "import os, signal\n"
        "from parallel_consumer.testing import LocalKafka\n"
        f"kafka = LocalKafka(backend={BACKEND!r}).start()\n"
        "print(kafka._process.pid, flush=True)\n"
        "print(kafka.log_path.parent, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", owner], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    pid_line, workdir_line = result.stdout.splitlines()
    pid, workdir = int(pid_line), Path(workdir_line)
    try:
        deadline = time.monotonic() + 30  # the watchdog gives the broker 10 s to shut down
        while (_process_exists(pid) or workdir.exists()) and time.monotonic() < deadline:
            time.sleep(0.2)

        assert not _process_exists(pid)
        assert not workdir.exists()
    finally:  # if the watchdog failed, do its job so no JVM outlives the test
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        shutil.rmtree(workdir, ignore_errors=True)


def test_stop_may_race_from_several_threads() -> None:
    kafka = LocalKafka(backend=BACKEND).start()
    stoppers = [threading.Thread(target=kafka.stop, name=f"stopper-{i}") for i in range(3)]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join(60)
    assert not kafka.running
    assert kafka not in running_instances()


def test_restart_keeps_the_address() -> None:
    with LocalKafka(backend=BACKEND) as kafka:
        before = kafka.bootstrap_servers
        kafka.restart()
        print(f"\nrestart took {kafka.start_seconds:.2f} s")
        assert kafka.running
        assert kafka.bootstrap_servers == before


def _kept_log(error: LocalKafkaError) -> Path:
    return Path(str(error).split("The log is kept at ")[1].split(";")[0])


@needs_apache
def test_an_invalid_setting_fails_the_start_quoting_the_log() -> None:
    kafka = LocalKafka(backend="apache", broker_config={"node.id": "not-a-number"})

    with pytest.raises(LocalKafkaError) as raised:
        kafka.start()

    log_path = _kept_log(raised.value)
    try:
        assert log_path.is_file()
        assert "Invalid value not-a-number" in str(raised.value)  # Kafka's own words, quoted
        assert not (log_path.parent / "data").exists()
        assert not kafka.running
    finally:
        shutil.rmtree(log_path.parent, ignore_errors=True)


@needs_apache
def test_a_broker_dying_during_start_reports_its_log() -> None:
    # The storage formats fine, but the broker cannot bind its listener and exits.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken, controller = busy.getsockname()[1], free_port()
        kafka = LocalKafka(
            backend="apache",
            broker_config={
                "listeners": f"PLAINTEXT://127.0.0.1:{taken},CONTROLLER://127.0.0.1:{controller}",
                "controller.quorum.voters": f"1@127.0.0.1:{controller}",
            },
        )

        with pytest.raises(LocalKafkaError, match="the broker exited during start") as raised:
            kafka.start()

    log_path = _kept_log(raised.value)
    try:
        assert log_path.is_file()
        assert "Address already in use" in str(raised.value)  # the cause is quoted
        assert not kafka.running
    finally:
        shutil.rmtree(log_path.parent, ignore_errors=True)
