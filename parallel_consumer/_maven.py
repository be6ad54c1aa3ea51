"""Jars resolved from Maven Central into a cache folder, once: the Kafka broker's classpath
(``testing/_apache_kafka.py``) and Spark's Kafka connector (``spark/jars.py``)."""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["RESOLVED_MARKER", "MavenFailed", "copy_dependencies", "locked"]

DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
#: A file written last into a jar folder: without it the folder is a partial one.
RESOLVED_MARKER = ".resolved"


class MavenFailed(Exception):
    """Maven did not resolve the dependencies: ``timed_out``, or its exit code and the last
    lines of its output in ``tail``."""

    def __init__(self, *, timed_out: bool = False, returncode: int = 0, tail: str = "") -> None:
        super().__init__(tail)
        self.timed_out = timed_out
        self.returncode = returncode
        self.tail = tail


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``: two processes resolving at once (pytest-xdist
    workers, a benchmark) must not race on one folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def copy_dependencies(
    target: Path, pom: str, *, mvn: str, expect: str, marker: str, timeout: float
) -> None:
    """Resolve the runtime dependencies of the ``pom`` text into ``target`` (replaced whole,
    ``RESOLVED_MARKER`` holding ``marker`` written last). ``expect`` is a glob one of the jars
    must match. Raises :class:`MavenFailed`. Call it under :func:`locked`."""
    with tempfile.TemporaryDirectory(prefix=".resolve-", dir=target.parent) as work:
        pom_file = Path(work) / "pom.xml"
        pom_file.write_text(pom)
        out_dir = Path(work) / "lib"
        argv = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom_file),
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={out_dir}",
            "-DincludeScope=runtime",
        ]
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise MavenFailed(timed_out=True) from exc
        if done.returncode != 0 or not any(out_dir.glob(expect)):
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
            raise MavenFailed(returncode=done.returncode, tail=tail)
        (out_dir / RESOLVED_MARKER).write_text(marker)
        if target.exists():  # a partial folder from an interrupted run
            shutil.rmtree(target)
        out_dir.rename(target)
