"""``run()`` with ``runner="process"``, stopped by a signal to the whole process group (Ctrl-C
in a terminal, systemd's default stop): the app closes gracefully, exits 0 without a
traceback, and commits only records that finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "process_runner_app.py"


def _run_and_signal_group(signum: int, *args: str) -> tuple[int, list[str]]:
    lines: list[str] = []
    process = subprocess.Popen(
        [sys.executable, str(APP), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,  # its own process group: the signal reaches only the app
    )

    def read() -> None:
        assert process.stdout is not None
        lines.extend(line.rstrip() for line in process.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 30
        while sum(line.startswith("done ") for line in lines) < 10:
            assert time.monotonic() < deadline, f"the app did not start: {lines}"
            assert process.poll() is None, f"the app ended early: {lines}"
            time.sleep(0.02)
        os.killpg(process.pid, signum)
        code = process.wait(30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        reader.join(5)
        assert process.stdout is not None
        process.stdout.close()
    return code, lines


@pytest.mark.timeout(90)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_process_group_closes_the_process_runner_app_gracefully(signum):
    code, lines = _run_and_signal_group(signum)
    text = "\n".join(lines)
    # Then the app closed as after a signal to itself alone
    assert code == 0, text
    assert "closed" in lines, text
    assert "Traceback" not in text, text
    # And the commit covers only records that finished
    done = {int(line.split()[1]) for line in lines if line.startswith("done ")}
    [committed] = [int(line.split()[1]) for line in lines if line.startswith("committed ")]
    assert set(range(committed)) <= done, text


@pytest.mark.timeout(90)
def test_records_at_workers_killed_by_a_group_sigterm_are_not_dead_lettered():
    # Given no retries and a dead-letter topic (a record that fails once is dead-lettered)
    # When systemd stops the service: SIGTERM to the app and its worker processes alike
    code, lines = _run_and_signal_group(signal.SIGTERM, "--dead-letter")
    text = "\n".join(lines)
    assert code == 0, text
    # Then no record was dead-lettered: none failed, the stop killed the workers under them
    assert "dead-lettered 0" in lines, text
    # And the commit covers only records that finished
    done = {int(line.split()[1]) for line in lines if line.startswith("done ")}
    [committed] = [int(line.split()[1]) for line in lines if line.startswith("committed ")]
    assert set(range(committed)) <= done, text
