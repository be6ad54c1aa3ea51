"""Running one broker process: ports, spawning, waiting until it answers, stopping it.

Backend-neutral; :mod:`parallel_consumer.testing.local_kafka` owns the instances and decides what
to run, this module only does it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from parallel_consumer.errors import ParallelConsumerError

__all__ = [
    "BrokerProcess",
    "LocalKafkaError",
    "check_port_free",
    "free_port",
    "log_tail",
    "wait_until_answering",
]


class LocalKafkaError(ParallelConsumerError):
    """A local test broker could not be prepared, started or stopped.

    The message says what is missing or what failed, where the broker's log is, and what to do.
    """


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def check_port_free(port: int, *, what: str) -> None:
    """Raise :class:`LocalKafkaError` if ``port`` on 127.0.0.1 cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR as the broker will set it: a port in TIME_WAIT after our own restart is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise LocalKafkaError(
                f"{what} 127.0.0.1:{port} is already in use ({exc.strerror}). "
                "Stop whatever listens there, pick another port, or pass port=None "
                "to let LocalKafka choose a free one."
            ) from exc


_ERROR_LINE = re.compile(r"\b(ERROR|FATAL)\b|Exception|error:", re.IGNORECASE)


def log_tail(path: Path, lines: int = 25) -> str:
    """The first error line and the last ``lines`` lines of a log, indented, for error messages.

    The first error is usually the cause; the tail is often a stack trace or the shutdown after it.
    """
    try:
        text = path.read_bytes()[-256 * 1024 :].decode("utf-8", errors="replace")
    except OSError:
        return "    (no log written)"
    all_lines = text.splitlines()
    if not all_lines:
        return "    (log is empty)"
    tail = all_lines[-lines:]
    first = next((i for i, line in enumerate(all_lines) if _ERROR_LINE.search(line)), None)
    head = []
    if first is not None and first < len(all_lines) - lines:
        # The error line and the two after it: usually the exception and its message.
        cause = all_lines[first : min(first + 3, len(all_lines) - lines)]
        head = ["    first error:", *("    " + line for line in cause), "    ..."]
    return "\n".join(head + ["    " + line for line in tail])


class BrokerProcess:
    """One spawned broker process whose output goes to ``log_path``.

    Owned by the :class:`LocalKafka` that spawned it; ``stop()`` may be called more than once.
    A watchdog process (``_watchdog.py``) stops the broker and deletes ``cleanup_dir`` if this
    process dies without stopping it, even by SIGKILL. A process forked from the owner inherits
    this object but not the broker: there ``stop()`` does nothing.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path,
        cwd: Path,
        cleanup_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.log_path = log_path
        self._owner = os.getpid()
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watchdog_lock = threading.Lock()
        with log_path.open("ab") as log:
            # A new session keeps Ctrl-C in the user's terminal away from the broker: the owner
            # stops it in order (terminate, wait, kill) instead of it dying mid-write.
            self._popen = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=None if env is None else dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._watchdog = subprocess.Popen(
                [
                    sys.executable,
                    "-I",  # isolated: no site-packages or PYTHON* variables, it needs neither
                    str(Path(__file__).with_name("_watchdog.py")),
                    str(self._popen.pid),
                    *([str(cleanup_dir)] if cleanup_dir is not None else []),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            self.stop(timeout=10.0)
            raise
        _WATCHED.add(self)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def owned(self) -> bool:
        """False in a process forked from the owner: the broker is not this process's child."""
        return os.getpid() == self._owner

    def exit_code(self) -> int | None:
        """The exit code if the process has ended, else ``None``."""
        if not self.owned:
            return None
        code = self._popen.poll()
        if code is not None:
            self._disarm()  # reaped: its pid may be reused, so the watchdog must not act on it
        return code

    def wait(self, timeout: float) -> int:
        """Wait for the process to end by itself (killing it after ``timeout``); its exit code."""
        try:
            code = self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            code = self._popen.wait()
        self._disarm()
        return code

    def stop(self, timeout: float) -> None:
        """Ask the broker to shut down (SIGTERM); kill it if it has not ended in ``timeout``.

        The watchdog stays armed until the broker is reaped, so an owner killed while waiting
        here still leaves no broker behind.
        """
        if not self.owned:
            self._forget_watchdog()
            return
        if self._popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._popen.send_signal(signal.SIGTERM)
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self._popen.kill()
                self._popen.wait()
        else:
            self._popen.wait()
        self._disarm()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the broker if it still runs (no wait)."""
        if self.owned and self._popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._popen.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL the broker at once (a crash: no shutdown of its own) and reap it."""
        if not self.owned:
            self._forget_watchdog()
            return
        self.signal(signal.SIGKILL)
        self._popen.wait()
        self._disarm()

    def _disarm(self) -> None:
        """Tell the watchdog that the broker is stopped by its owner, and reap the watchdog."""
        with self._watchdog_lock:
            watchdog, self._watchdog = self._watchdog, None
        if watchdog is None:
            return
        assert watchdog.stdin is not None
        # BrokenPipeError if it already exited, ValueError if the pipe was closed already
        with contextlib.suppress(OSError, ValueError):
            watchdog.stdin.write(b"x")
            watchdog.stdin.flush()
        with contextlib.suppress(OSError):
            watchdog.stdin.close()
        try:
            watchdog.wait(30.0)
        except subprocess.TimeoutExpired:
            watchdog.kill()
            watchdog.wait()

    def _forget_watchdog(self) -> None:
        """In a forked child: close the inherited pipe end without writing (the owner's
        watchdog must still see end of file when the owner dies) and never wait for it."""
        with self._watchdog_lock:
            watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog.stdin is not None:
            with contextlib.suppress(OSError):
                watchdog.stdin.close()
            watchdog.returncode = 0  # not our child here: keep Popen from waiting or warning


# Brokers with an armed watchdog, so that a forked child can drop its copies of their pipes.
_WATCHED: weakref.WeakSet[BrokerProcess] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # No locks here: one held by another thread at the fork would never be released.
    for process in tuple(_WATCHED):
        process._watchdog_lock = threading.Lock()
        process._forget_watchdog()
    _WATCHED.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def wait_until_answering(
    bootstrap_servers: str,
    *,
    alive: Callable[[], int | None],
    timeout: float,
    on_death: Callable[[int], LocalKafkaError],
    on_timeout: Callable[[], LocalKafkaError],
    config: Mapping[str, Any] | None = None,
) -> float:
    """Poll until a broker at ``bootstrap_servers`` answers a metadata request.

    ``alive()`` returns the process exit code (``None`` while it runs); a death raises
    ``on_death(code)`` at once instead of waiting out ``timeout``. ``config``: more client
    settings (a secured listener's credentials). Returns the seconds waited.
    """
    # Imported here: only starting a broker needs the client library loaded.
    from confluent_kafka.admin import AdminClient

    started = time.monotonic()
    deadline = started + timeout
    # log_level 0: while the broker boots, librdkafka would print "connection refused" on stderr.
    admin = AdminClient({**(config or {}), "bootstrap.servers": bootstrap_servers, "log_level": 0})
    while True:
        code = alive()
        if code is not None:
            raise on_death(code)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise on_timeout()
        try:
            metadata = admin.list_topics(timeout=min(1.0, remaining))
        except Exception:  # KafkaException or a timeout: not up yet, try again
            time.sleep(0.05)
            continue
        if metadata.brokers:
            return time.monotonic() - started
