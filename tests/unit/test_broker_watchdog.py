"""The broker watchdog, with a stand-in broker (a sleeping process in its own session)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from parallel_consumer.testing import _watchdog
from parallel_consumer.testing._broker_process import BrokerProcess


def _wait(condition: object, seconds: float = 10.0) -> bool:
    assert callable(condition)
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A 'broker' that ignores nothing and sleeps until signalled."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    yield process
    process.kill()
    process.wait()


def _watchdog_for(pid: int, directory: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-I", _watchdog.__file__, str(pid), str(directory)],
        stdin=subprocess.PIPE,
    )


def test_end_of_input_stops_the_broker_and_deletes_its_directory(
    stand_in: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    directory = tmp_path / "broker"
    (directory / "data").mkdir(parents=True)
    watchdog = _watchdog_for(stand_in.pid, directory)
    assert watchdog.stdin is not None

    watchdog.stdin.close()  # what the kernel does when the owner dies

    assert watchdog.wait(15) == 0
    assert stand_in.wait(5) is not None
    assert not directory.exists()


def test_a_byte_disarms_it(stand_in: subprocess.Popen[bytes], tmp_path: Path) -> None:
    watchdog = _watchdog_for(stand_in.pid, tmp_path)
    assert watchdog.stdin is not None

    watchdog.stdin.write(b"x")
    watchdog.stdin.close()

    assert watchdog.wait(5) == 0
    assert stand_in.poll() is None
    assert tmp_path.exists()


def test_alive_treats_a_zombie_as_ended() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert _wait(lambda: not _watchdog.alive(child.pid))  # exited, not yet reaped
    child.wait()
    assert not _watchdog.alive(child.pid)


def test_broker_process_stop_disarms_its_watchdog(tmp_path: Path) -> None:
    process = BrokerProcess(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        log_path=tmp_path / "broker.log",
        cwd=tmp_path,
        cleanup_dir=tmp_path,
    )
    watchdog = process._watchdog
    assert watchdog is not None

    process.stop(timeout=5)

    assert process.exit_code() is not None
    assert watchdog.poll() == 0  # reaped, exited without acting
    assert tmp_path.exists()  # the owner, not the watchdog, decides about the files
