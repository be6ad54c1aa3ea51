"""The broker watchdog, with a stand-in broker (a sleeping process in its own session)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
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


def _sleeping_broker(
    folder: Path, cleanup_dir: Path
) -> tuple[BrokerProcess, subprocess.Popen[bytes]]:
    """A BrokerProcess around a sleeping stand-in, and its armed watchdog."""
    process = BrokerProcess(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        log_path=folder / "broker.log",
        cwd=folder,
        cleanup_dir=cleanup_dir,
    )
    watchdog = process._watchdog
    assert watchdog is not None
    assert watchdog.stdin is not None
    return process, watchdog


def test_broker_process_stop_disarms_its_watchdog(tmp_path: Path) -> None:
    process, watchdog = _sleeping_broker(tmp_path, tmp_path)

    process.stop(timeout=5)

    assert process.exit_code() is not None
    assert watchdog.poll() == 0  # reaped, exited without acting
    assert tmp_path.exists()  # the owner, not the watchdog, decides about the files


def test_it_kills_a_broker_that_ignores_sigterm(tmp_path: Path) -> None:
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert stubborn.stdout is not None
        assert stubborn.stdout.readline() == b"ready\n"  # SIGTERM is ignored from here on

        _watchdog.stop_orphan(stubborn.pid, str(tmp_path), grace=0.5)

        assert stubborn.wait(5) == -signal.SIGKILL
        assert not tmp_path.exists()
    finally:
        stubborn.kill()
        stubborn.wait()
        if stubborn.stdout is not None:
            stubborn.stdout.close()


def test_a_broker_that_exits_by_itself_disarms_the_watchdog_once_reaped(tmp_path: Path) -> None:
    process = BrokerProcess(
        [sys.executable, "-c", "pass"], log_path=tmp_path / "broker.log", cwd=tmp_path
    )
    watchdog = process._watchdog
    assert watchdog is not None

    assert _wait(lambda: process.exit_code() is not None)

    # Its pid is free for reuse now: a watchdog still armed could later kill a stranger.
    assert process._watchdog is None
    assert watchdog.poll() == 0
    process.stop(timeout=5)


def test_a_forked_child_leaves_the_broker_and_its_watchdog_to_the_owner(tmp_path: Path) -> None:
    directory = tmp_path / "broker"
    directory.mkdir()
    process, watchdog = _sleeping_broker(tmp_path, directory)
    assert watchdog.stdin is not None
    report_read, report_write = os.pipe()
    release_read, release_write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads, Python 3.12+
        child = os.fork()
    if child == 0:
        try:
            os.close(report_read)
            os.close(release_write)  # else the read below never sees end of file
            # Not the owner here: the broker is not this process's to watch or to stop.
            ok = not process.owned and process.exit_code() is None
            os.write(report_write, b"1" if ok else b"0")
            os.read(release_read, 1)  # stay alive (holding whatever fds it holds) until released
            process.stop(timeout=1)
        finally:
            os._exit(0)
    os.close(report_write)
    os.close(release_read)
    try:
        assert os.read(report_read, 1) == b"1"
        assert process.exit_code() is None

        # The owner "dies" (its end of the pipe closes) while the child still runs: the child
        # dropped its inherited copy at the fork, so the watchdog sees end of file and acts.
        watchdog.stdin.close()
        assert watchdog.wait(30) == 0
        assert _wait(lambda: process.exit_code() is not None)
        assert not directory.exists()
    finally:
        os.close(release_write)
        os.close(report_read)
        os.waitpid(child, 0)
        process.stop(timeout=5)
