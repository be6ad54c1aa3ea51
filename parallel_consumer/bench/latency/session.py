"""Run L1: ``pc``'s capacity first, then every contestant at each load, repeats interleaved;
summaries are medians over the repeats, CDFs pool the repeats' samples."""

from __future__ import annotations

import math
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parallel_consumer.bench.latency import stats
from parallel_consumer.bench.latency.drivers import DRIVERS, Driver, Job, Trace
from parallel_consumer.bench.latency.load import LoadSpec, RateSchedule, plan_keys
from parallel_consumer.bench.latency.producer import (
    ProducerProcess,
    produce_backlog,
    produce_primers,
)
from parallel_consumer.testing import create_topic

__all__ = ["RunResult", "driver", "goals", "measure_capacity", "one_run", "summarise"]

#: Longest a contestant may take to handle its first record (group join, first fetch).
STARTUP_TIMEOUT = 90.0
#: Pause between the first record handled and the first record produced.
SETTLE = 0.5
#: After the producer stopped, a run gets this much, plus a fifth of its duration, to finish.
GRACE = 3.0

Say = Callable[[str], None]


def driver(name: str) -> Driver:
    if name == "java-pc":
        from parallel_consumer.bench.latency.java_driver import JavaDriver

        return JavaDriver()
    return DRIVERS[name]


@dataclass
class RunResult:
    verdict: stats.Verdict
    done_latencies: list[float]
    commit_latencies: list[float]
    produced: int
    producer_late_p99: float
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _run_driver(the_driver: Driver, job: Job) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["trace"] = the_driver.run(job)
        except BaseException as exc:
            outcome["error"] = exc
            job.ready.set()

    thread = threading.Thread(target=target, name=f"bench-l1-{the_driver.name}", daemon=True)
    thread.start()
    return thread, outcome


def _finish(thread: threading.Thread, outcome: dict[str, Any], job: Job, wait: float) -> Trace:
    thread.join(wait)
    job.stop.set()
    thread.join(120)
    if "error" in outcome:
        error = outcome["error"]
        raise RuntimeError(f"{type(error).__name__}: {error}") from error
    if "trace" not in outcome:
        raise RuntimeError("the contestant did not end within 120 s of its stop signal")
    trace: Trace = outcome["trace"]
    return trace


def one_run(bootstrap: str, name: str, spec: LoadSpec, rate: float) -> RunResult:
    """One contestant at ``rate`` records/s for ``spec.duration`` seconds on a fresh topic."""
    the_driver = driver(name)
    topic = create_topic(bootstrap, f"l1-{uuid.uuid4().hex[:8]}", partitions=spec.partitions)
    produce_primers(bootstrap, topic, spec.partitions)
    count = RateSchedule(rate, spec.duration, 0.0).count
    ends = dict.fromkeys(range(spec.partitions), 1)
    for _, partition in plan_keys(spec, count):
        ends[partition] += 1
    job = Job(bootstrap, topic, spec, ends, threading.Event(), threading.Event())
    with tempfile.TemporaryDirectory(prefix="pc-bench-l1-") as tmp:
        producer = ProducerProcess(bootstrap, topic, spec, rate, Path(tmp) / "produced.json")
        try:
            thread, outcome = _run_driver(the_driver, job)
            if not job.ready.wait(STARTUP_TIMEOUT) or "error" in outcome:
                _finish(thread, outcome, job, 0)
                raise RuntimeError(f"no record handled in {STARTUP_TIMEOUT:g} s")
            time.sleep(SETTLE)
            producer.go()
            document = producer.result(spec.duration + 120)
            trace = _finish(thread, outcome, job, GRACE + spec.duration / 5)
        finally:
            job.stop.set()
            producer.stop()
    produced = {(p, o): t for p, o, t in document["records"]}
    done = trace.first_done()
    acked = trace.acks if trace.acks is not None else stats.commit_times(trace.commits, produced)
    return RunResult(
        verdict=stats.verdict(produced, done),
        done_latencies=stats.latencies(produced, done),
        commit_latencies=stats.latencies(produced, acked),
        produced=len(produced),
        producer_late_p99=document["late_p99"],
        extra=trace.extra,
    )


def measure_capacity(bootstrap: str, spec: LoadSpec, repeat: int, say: Say) -> list[float]:
    """``pc``'s records/s on a backlog of ``spec.capacity_records`` (first handler return to
    last), ``repeat`` times: what it can sustain, with this key distribution."""
    rates = []
    for _ in range(repeat):
        topic = create_topic(
            bootstrap, f"l1-cap-{uuid.uuid4().hex[:8]}", partitions=spec.partitions
        )
        produce_backlog(bootstrap, topic, spec, spec.capacity_records)
        ends = dict.fromkeys(range(spec.partitions), 0)
        for _, partition in plan_keys(spec, spec.capacity_records):
            ends[partition] += 1
        job = Job(bootstrap, topic, spec, ends, threading.Event(), threading.Event())
        thread, outcome = _run_driver(DRIVERS["pc"], job)
        trace = _finish(thread, outcome, job, 600)
        times = sorted(trace.first_done().values())
        if len(times) < spec.capacity_records:
            raise RuntimeError(f"capacity run: {len(times)}/{spec.capacity_records} handled")
        rates.append((len(times) - 1) / (times[-1] - times[0]))
        say(f"pc capacity on a backlog: {rates[-1]:,.0f} records/s")
    return rates


def _ms(seconds: float) -> float | None:
    """Milliseconds, or None for no figure (no samples: JSON has no NaN)."""
    return None if math.isnan(seconds) else round(seconds * 1000, 3)


def summarise(name: str, runs: Sequence[RunResult], errors: Sequence[str]) -> dict[str, Any]:
    """Medians over runs of each percentile; the CDF pools every run's samples."""
    kept = sum(r.verdict.keeps_up for r in runs)
    summary: dict[str, Any] = {
        "contestant": name,
        "runs": len(runs),
        "runs_kept_up": kept,
        "keeps_up": bool(runs) and kept == len(runs),
        "errors": list(errors),
        "backlog_at_end": [r.verdict.backlog_at_end for r in runs],
        "unfinished": [r.verdict.unfinished for r in runs],
        "verdicts": [r.verdict.as_dict() for r in runs],
        "producer_late_p99_ms": [_ms(r.producer_late_p99) for r in runs],
        "produced": [r.produced for r in runs],
        "handled": [len(r.done_latencies) for r in runs],
        "committed": [len(r.commit_latencies) for r in runs],
    }
    for kind in ("done", "commit"):
        per_run = [stats.percentiles(getattr(r, f"{kind}_latencies")) for r in runs]
        pooled = [x for r in runs for x in getattr(r, f"{kind}_latencies")]
        summary[f"{kind}_ms"] = {
            q: _ms(statistics.median(p[q] for p in per_run)) if per_run else None
            for q in ("p50", "p99", "p99.9")
        }
        summary[f"{kind}_cdf_ms"] = [(_ms(x), f) for x, f in stats.cdf_points(pooled)]
    return summary


#: Contestants that are floors, not peers: left out of the goals.
FLOORS = ("raw",)


def goals(loads: Sequence[dict[str, Any]], work_ms: float, us: str = "pc") -> dict[str, Any]:
    """The issue's goals, reported (never asserted): ``pc``'s p99 handler-done below every
    peer's at every load it sustains (a peer that cannot keep up counts as above; floors are
    no peers), and at 50 % load within 3x the handler time plus 20 ms."""
    below: dict[str, Any] = {}
    for entry in loads:
        ours = entry["results"].get(us)
        if not ours or not ours["keeps_up"]:
            below[f"{entry['load']:g}"] = None
            continue
        mine = ours["done_ms"]["p99"]
        below[f"{entry['load']:g}"] = {
            name: (not r["keeps_up"]) or mine < r["done_ms"]["p99"]
            for name, r in entry["results"].items()
            if name != us and name not in FLOORS and r["runs"]
        }
    half = next((e for e in loads if abs(e["load"] - 0.5) < 1e-9), None)
    limit = 3 * work_ms + 20
    at_half = None
    if half and us in half["results"] and half["results"][us]["runs"]:
        p99 = half["results"][us]["done_ms"]["p99"]
        at_half = {"p99_ms": p99, "limit_ms": limit, "met": p99 <= limit}
    return {"p99_below_every_peer": below, "p99_at_half_load": at_half}
