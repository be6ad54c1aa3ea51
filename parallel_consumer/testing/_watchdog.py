"""Stop a local broker whose owner died without stopping it (``kill -9``, a crash, an OOM kill).

Run as a script, not imported by the package (so it starts in milliseconds and loads nothing):
``python _watchdog.py PID [DIRECTORY]``. It blocks reading one byte from stdin, a pipe whose
write end only the owning process holds:

* a byte means the owner is stopping the broker itself: exit and do nothing;
* end of file means the owner is gone: SIGTERM the broker's process group, SIGKILL it if it is
  still there after the grace period, then delete ``DIRECTORY`` (the broker's files).

The broker was started in its own session, so its process group id is its pid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time

GRACE_SECONDS = 10.0
KILL_WAIT_SECONDS = 5.0


def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (dead, not yet reaped by its new parent) counts as ended."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # "pid (comm) state ...": comm may contain spaces and parentheses, the state follows
            # the last ")".
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no procfs: trust kill(0)


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def stop_orphan(pid: int, directory: str | None, *, grace: float = GRACE_SECONDS) -> None:
    """Stop the broker ``pid`` (its whole process group) and delete ``directory``."""
    _signal_group(pid, signal.SIGTERM)
    if not _wait_gone(pid, grace):
        _signal_group(pid, signal.SIGKILL)
        _wait_gone(pid, KILL_WAIT_SECONDS)
    if directory:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: _watchdog.py PID [DIRECTORY]", file=sys.stderr)
        return 2
    pid = int(argv[1])
    directory = argv[2] if len(argv) == 3 else None
    if sys.stdin.buffer.read(1):
        return 0  # disarmed: the owner stops the broker
    stop_orphan(pid, directory)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
