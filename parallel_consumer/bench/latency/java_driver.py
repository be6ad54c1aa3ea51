"""``java-pc`` on L1: the Java harness (benchmarks/java) in its own JVM, as for the throughput
rows, with a stop file; its log carries each handler call's return time (``Instant.now()``,
microseconds), and its commits are watched from here through the group's committed offsets."""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from parallel_consumer.bench.contestants.java_pc import build, find_project, harness_argv
from parallel_consumer.bench.kafka_io import new_group
from parallel_consumer.bench.latency.drivers import CommitWatcher, Job, Trace, reached, row_of

__all__ = ["JavaDriver"]

#: The harness's own limit; the session's stop signal ends a run long before.
HARNESS_TIMEOUT = 3600


class JavaDriver:
    name = "java-pc"
    commit_clock = (
        "the group's committed offsets polled (OffsetFetch) every 5 ms from the Python side: "
        "late by at most 5 ms plus one round trip"
    )
    note = "its own JVM; same options (KEY, C, commit interval)"

    def run(self, job: Job) -> Trace:
        project = find_project()
        if project is None:
            raise RuntimeError("java-pc: no benchmarks/java project")
        classpath = build(project)
        group = new_group("java-l1")
        trace = Trace()
        with tempfile.TemporaryDirectory(prefix="pc-bench-java-l1-") as tmp:
            log_path, stop_file = Path(tmp) / "log.tsv", Path(tmp) / "stop"
            argv = harness_argv(
                classpath,
                job.bootstrap,
                job.topic,
                group,
                job.ends,
                row_of(job.spec),
                log_path,
                HARNESS_TIMEOUT,
            )
            watcher = CommitWatcher(job.bootstrap, group, job.topic, list(job.ends)).start()
            trace.commits = watcher.commits
            process = subprocess.Popen(
                [*argv, "--stop-file", str(stop_file)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            events: dict[str, dict[str, object]] = {}
            assert process.stdout is not None
            reader = threading.Thread(
                target=_read_events,
                args=(process.stdout, events, job),
                name="bench-java-events",
                daemon=True,
            )
            reader.start()
            try:
                while process.poll() is None and not job.stop.is_set():
                    time.sleep(0.02)
                if process.poll() is None:
                    stop_file.touch()
                process.wait(60)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait(10)
                reader.join(10)
                # The last commits may land just before the harness saw them: look once more.
                deadline = time.monotonic() + 1
                while not reached(trace.commits, job.ends) and time.monotonic() < deadline:
                    time.sleep(0.01)
                watcher.stop()
            if log_path.exists():
                for line in log_path.read_text().splitlines():
                    partition, _, offset, _, done_at = line.split("\t")
                    trace.done.append((int(partition), int(offset), float(done_at)))
        trace.extra = {"events": sorted(events)}
        return trace


def _read_events(stream: IO[str], events: dict[str, dict[str, object]], job: Job) -> None:
    for line in stream:
        if line.startswith("{"):
            event = json.loads(line)
            events[event["event"]] = event
            if event["event"] == "first_call":
                job.ready.set()
