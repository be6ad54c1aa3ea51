"""``java-pc``: Confluent's Java Parallel Consumer, run by the Maven project in
``benchmarks/java/`` (built with ``mvn`` on first use, then reused until its sources change).

The harness prints JSON lines with epoch times (the clock every contestant reports on) and writes
what its handler saw to a file, so the checks here are the same as for the Python contestants.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from parallel_consumer.bench.contestants.base import RunEnv
from parallel_consumer.bench.kafka_io import new_group
from parallel_consumer.bench.model import Observation, Row

__all__ = ["JavaParallelConsumerContestant", "build", "find_project", "harness_argv"]

MAIN_CLASS = "bench.BenchRunner"
PROJECT_ENV = "PC_BENCH_JAVA_PROJECT"


def find_project() -> Path | None:
    """``$PC_BENCH_JAVA_PROJECT``, else ``benchmarks/java`` of the source checkout this package
    runs from, else of the current directory."""
    candidates = []
    if os.environ.get(PROJECT_ENV):
        candidates.append(Path(os.environ[PROJECT_ENV]))
    candidates.append(Path(__file__).resolve().parents[3] / "benchmarks" / "java")
    candidates.append(Path.cwd() / "benchmarks" / "java")
    return next((c for c in candidates if (c / "pom.xml").is_file()), None)


def needs_build(project: Path) -> bool:
    """True when the harness was never built or its sources changed since."""
    class_file = project / "target" / "classes" / (MAIN_CLASS.replace(".", "/") + ".class")
    classpath_file = project / "target" / "classpath.txt"
    if not class_file.exists() or not classpath_file.exists():
        return True
    sources = [project / "pom.xml", *project.glob("src/**/*.java")]
    newest = max(source.stat().st_mtime for source in sources)
    return newest > min(class_file.stat().st_mtime, classpath_file.stat().st_mtime)


@functools.cache
def build(project: Path) -> str:
    """Build the harness when its sources changed; return its classpath."""
    classes = project / "target" / "classes"
    classpath_file = project / "target" / "classpath.txt"
    if needs_build(project):
        done = subprocess.run(
            ["mvn", "-q", "-B", "package", "-DskipTests"],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"mvn package failed in {project}: {tail[0]}")
    return f"{classes}{os.pathsep}{classpath_file.read_text().strip()}"


def harness_argv(
    classpath: str,
    bootstrap: str,
    topic: str,
    group: str,
    ends: Mapping[int, int],
    row: Row,
    log_path: Path,
    timeout: float,
) -> list[str]:
    """The command line running ``row`` in the Java harness (its options: BenchRunner.java)."""
    return [
        "java",
        "-Xmx1g",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        classpath,
        MAIN_CLASS,
        *("--bootstrap", bootstrap, "--topic", topic, "--group", group),
        *("--ends", ",".join(f"{p}:{end}" for p, end in sorted(ends.items()))),
        *("--ordering", row.ordering, "--concurrency", str(row.concurrency)),
        *("--batch-size", str(row.batch_size)),
        *("--commit-interval-ms", str(round(row.commit_interval * 1000))),
        *("--work", row.work.kind, "--ms", str(row.work.ms)),
        *("--out", str(log_path), "--timeout", str(round(timeout))),
    ]


class JavaParallelConsumerContestant:
    name = "java-pc"
    description = "Confluent's Java Parallel Consumer 0.5.3.3 (benchmarks/java), same options"

    def unavailable(self) -> str | None:
        missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
        if missing:
            return f"java-pc needs {' and '.join(missing)} on PATH (Java 17+ and Maven)"
        project = find_project()
        if project is None:
            return (
                "java-pc needs the Maven project benchmarks/java of a source checkout "
                f"(run from the checkout, or set {PROJECT_ENV})"
            )
        try:
            build(project)
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
            return f"java-pc could not be built: {exc}"
        return None

    def unsupported(self, row: Row) -> str | None:
        if row.produce is not None:
            return "the Java harness has no pollAndProduce yet"
        if row.work.kind not in ("noop", "sleep_random", "sleep"):
            return f"the Java harness runs no {row.work.kind} work"
        return None

    def run(self, env: RunEnv, row: Row, topic: str, ends: dict[int, int]) -> Observation:
        project = find_project()
        assert project is not None
        classpath = build(project)
        with tempfile.TemporaryDirectory(prefix="pc-bench-java-") as tmp:
            log_path = Path(tmp) / "log.tsv"
            argv = harness_argv(
                classpath, env.bootstrap, topic, new_group("java"), ends, row, log_path, env.timeout
            )
            launched = time.time()
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=env.timeout + 60, check=False
            )
            events = {}
            for line in done.stdout.splitlines():
                if line.startswith("{"):
                    event = json.loads(line)
                    events[event["event"]] = event
            if "committed" not in events:
                reason = (
                    events.get("failed", {}).get("reason")
                    or (done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"])[0]
                )
                raise RuntimeError(f"java-pc {row.name}: {reason}")
            log = []
            for line in log_path.read_text().splitlines():
                partition, key, offset, took = line.split("\t")[:4]
                log.append((int(partition), key, int(offset), float(took)))
        return Observation(
            # The JVM's own start (~0.5 s) is not the consumer's start-up: count from "started".
            started=events["started"]["t"],
            first_call=events["first_call"]["t"],
            finished=events["committed"]["t"],
            log=log,
            extra={"jvm_start": events["started"]["t"] - launched},
        )
