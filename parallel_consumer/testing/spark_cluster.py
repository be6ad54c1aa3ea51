"""A Spark standalone cluster on this machine, from the installed pyspark: one Master and N
Workers, each its own JVM (and, once an application runs, its own executor JVM and Python
workers), on loopback ports, with bounded memory. For the Spark runner's tests, its benchmark
and ``pc spark cluster``; see docs/spark.md#a-standalone-cluster-on-this-machine.

Needs Java and pyspark (the ``spark`` extra): pyspark's package holds Spark's jars and
``bin/spark-class``, which starts the daemons. Nothing here imports pyspark.

Each daemon runs in its own session (process group), so a Worker's group is that Worker, its
executors and their Python workers: :meth:`SparkCluster.kill_worker` SIGKILLs the group, as a
machine that dies would lose them all. The daemons are spawned as :class:`BrokerProcess`\\ es:
a watchdog stops their groups if this process dies without stopping them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from parallel_consumer.errors import ParallelConsumerError
from parallel_consumer.testing._broker_process import BrokerProcess, free_port, log_tail

__all__ = ["SparkCluster", "SparkClusterError", "spark_home"]

_HOST = "127.0.0.1"
#: The daemons (Master, Worker) do little: a small heap, the serial collector, the quick compiler.
_DAEMON_JAVA_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


class SparkClusterError(ParallelConsumerError):
    """The local Spark cluster could not be started (the message says why and where the log is)."""


def spark_home() -> Path:
    """The installed pyspark package: Spark's jars and ``bin/spark-class`` are inside it."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SparkClusterError("pyspark is not installed: pip install -e '.[spark]' in a clone")
    home = Path(spec.origin).parent
    if not (home / "bin" / "spark-class").exists() or not (home / "jars").is_dir():
        raise SparkClusterError(f"{home} has no bin/spark-class or jars/: a pyspark without Spark")
    return home


class SparkCluster:
    """A standalone Master and ``workers`` Workers of ``cores`` cores and ``memory`` each.

    ``start()`` returns once every Worker has registered with the Master; ``stop()`` (or leaving
    the ``with`` block) stops them all and deletes the cluster's folder (its logs and the
    executors' work folders) unless ``directory`` was given. Drivers connect to
    :attr:`master_url` with :meth:`session_conf` (executors of ``executor_memory`` and ``cores``
    cores, one per Worker).
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        cores: int = 1,
        memory: str = "1g",
        executor_memory: str = "512m",
        daemon_memory: str = "256m",
        directory: Path | str | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        if workers < 1 or cores < 1:
            raise ValueError(f"workers and cores must be >= 1, got {workers} and {cores}")
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.executor_memory = executor_memory
        self.daemon_memory = daemon_memory
        self.start_timeout = start_timeout
        self._given_directory = Path(directory) if directory is not None else None
        self.directory: Path | None = None
        self._master: BrokerProcess | None = None
        self._workers: list[BrokerProcess] = []
        self._ports: list[int] = []  # each Worker's, by index
        self._master_port = 0
        self._ui_port = 0

    @property
    def master_url(self) -> str:
        if self._master is None:
            raise SparkClusterError("the cluster is not started")
        return f"spark://{_HOST}:{self._master_port}"

    @property
    def running(self) -> bool:
        """The Master and every Worker run (False once one has exited or been killed)."""
        return self._master is not None and all(
            p.exit_code() is None for p in (self._master, *self._workers)
        )

    @property
    def worker_pids(self) -> list[int]:
        """The Worker JVMs' pids, in start order (also their process groups)."""
        return [worker.pid for worker in self._workers]

    def session_conf(self) -> dict[str, str]:
        """Spark settings for a driver on this machine: the master, one executor per Worker."""
        return {
            "spark.master": self.master_url,
            "spark.executor.memory": self.executor_memory,
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * self.workers),
            # Standalone's default is to start jobs as soon as one executor is there: wait for
            # them all (a minute at most), so that work spreads over every Worker.
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
        }

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _environment(self) -> dict[str, str]:
        assert self.directory is not None
        home = spark_home()
        return {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            "SPARK_DAEMON_JAVA_OPTS": _DAEMON_JAVA_OPTS,
            "SPARK_LOCAL_IP": _HOST,
            "SPARK_LOCAL_DIRS": str(self.directory / "local"),
            # Executors start their Python workers with this interpreter (a driver may also
            # set spark.pyspark.python).
            "PYSPARK_PYTHON": sys.executable,
        }

    def _spawn(self, name: str, main_class: str, *arguments: str) -> BrokerProcess:
        assert self.directory is not None
        argv = [str(spark_home() / "bin" / "spark-class"), main_class, *arguments]
        orphan_cleanup = name == "master" and self._given_directory is None
        return BrokerProcess(
            argv,
            log_path=self.directory / f"{name}.log",
            cwd=self.directory,
            env=self._environment(),
            # If this process dies, the Master's watchdog deletes the folder (each daemon's
            # watchdog stops its own group).
            cleanup_dir=self.directory if orphan_cleanup else None,
        )

    def start(self) -> SparkCluster:
        if self._master is not None:
            return self
        if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
            raise SparkClusterError("Java is not on PATH (nor JAVA_HOME set): Spark needs a JVM")
        if self._given_directory is not None:
            self._given_directory.mkdir(parents=True, exist_ok=True)
            self.directory = self._given_directory
        else:
            self.directory = Path(tempfile.mkdtemp(prefix="pc-spark-cluster-"))
        (self.directory / "local").mkdir(exist_ok=True)
        try:
            self._master_port, self._ui_port = free_port(), free_port()
            self._master = self._spawn(
                "master",
                "org.apache.spark.deploy.master.Master",
                *("--host", _HOST, "--port", str(self._master_port)),
                *("--webui-port", str(self._ui_port)),
            )
            started = [self.add_worker(wait=False) for _ in range(self.workers)]
            self.wait_for_workers(started)
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker(self, *, wait: bool = True) -> int:
        """Start one more Worker (e.g. to replace a killed one); its index."""
        assert self.directory is not None
        index = len(self._workers)
        work = self.directory / f"worker-{index}"
        work.mkdir(exist_ok=True)
        port = free_port()
        self._workers.append(
            self._spawn(
                f"worker-{index}",
                "org.apache.spark.deploy.worker.Worker",
                *("--host", _HOST, "--port", str(port), "--webui-port", str(free_port())),
                *("--cores", str(self.cores), "--memory", self.memory),
                *("--work-dir", str(work), self.master_url),
            )
        )
        self._ports.append(port)
        if wait:
            self.wait_for_workers([index])
        return index

    def state(self) -> dict[str, Any]:
        """The Master's own view (its web UI's JSON): workers, applications, cores."""
        with urllib.request.urlopen(f"http://{_HOST}:{self._ui_port}/json/", timeout=5) as answer:
            state: dict[str, Any] = json.load(answer)
            return state

    def wait_for_workers(self, indexes: list[int]) -> float:
        """Wait until the Workers ``indexes`` have registered with the Master (the Master
        counts each ALIVE, by its port); the seconds waited."""
        assert self._master is not None
        began = time.monotonic()
        waited = {self._ports[i]: i for i in indexes}
        while True:
            for name, process in (
                ("master", self._master),
                *((f"worker {i}", self._workers[i]) for i in indexes),
            ):
                code = process.exit_code()
                if code is not None:
                    raise SparkClusterError(
                        f"the Spark {name} exited with code {code}; its log "
                        f"({process.log_path}):\n{log_tail(process.log_path)}"
                    )
            with contextlib.suppress(OSError, ValueError):
                ports = {w.get("port") for w in self.state()["workers"] if w["state"] == "ALIVE"}
                if set(waited) <= ports:
                    return time.monotonic() - began
            if time.monotonic() - began > self.start_timeout:
                raise SparkClusterError(
                    f"Spark workers {sorted(waited.values())} did not register with the master "
                    f"in {self.start_timeout:.0f} s; logs in {self.directory}:\n"
                    f"{log_tail(self._master.log_path)}"
                )
            time.sleep(0.2)

    def kill_worker(self, index: int) -> None:
        """SIGKILL Worker ``index`` with every process under it (its executors and their Python
        workers), as a machine that dies would lose them; returns once the Worker is reaped."""
        worker = self._workers[index]
        _kill(_descendants(worker.pid))
        _kill([worker.pid])
        worker.wait(timeout=30.0)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the Workers (each stops its executors), then the Master; delete the folder
        unless it was given. Safe to call more than once."""
        for worker in self._workers:
            under = _descendants(worker.pid) if worker.exit_code() is None else []
            worker.stop(timeout)
            _kill(under)  # what outlived its Worker (the Worker stops its executors itself)
        self._workers, self._ports = [], []
        if self._master is not None:
            self._master.stop(timeout)
            self._master = None
        if self.directory is not None and self._given_directory is None:
            shutil.rmtree(self.directory, ignore_errors=True)
        self.directory = None


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (children, theirs, ...), from ``/proc`` (none without it)."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # (it ended meanwhile)
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
