"""``pc-bench latency``: run L1 and write its JSON and CDF charts (docs/benchmarks.md).

pc-bench latency --repeat 3                       # capacity, then 25/50/80 %, all peers
pc-bench latency --capacity 900 --loads 0.5 --peers none
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from parallel_consumer.bench.latency.load import LoadSpec

__all__ = ["add_parser", "run"]

#: The peers L1 runs beside ``pc`` by default, in table order; ``raw`` (no work, no commits)
#: is the client path's floor, not a peer in the goals.
PEERS = ("java-pc", "pyrallel", "share", "serial", "raw")
#: ``tiny``: seconds, for tests.
SCALES = {
    "full": LoadSpec(),
    "tiny": LoadSpec(duration=2.0, capacity_records=600),
}


def add_parser(commands: Any) -> None:
    latency = commands.add_parser(
        "latency", help="L1: latency at 25/50/80 %% of pc's capacity (open-loop producer)"
    )
    latency.add_argument("--capacity", type=float, help="pc's records/s (default: measure it)")
    latency.add_argument(
        "--loads", default="0.25,0.5,0.8", help="fractions of the capacity (default 0.25,0.5,0.8)"
    )
    latency.add_argument("--duration", type=float, help="seconds of producing per run")
    latency.add_argument(
        "--scale", choices=sorted(SCALES), default="full", help="records and durations per run"
    )
    latency.add_argument("--repeat", type=int, default=3, help="runs per contestant and load")
    latency.add_argument(
        "--peers", default=",".join(PEERS), help=f"default {','.join(PEERS)}; 'none' for pc alone"
    )
    latency.add_argument("--bootstrap", help="use this broker instead of starting a local one")
    latency.add_argument(
        "--out", type=Path, default=Path("benchmarks/results"), help="folder of the JSON and charts"
    )


class _Usage(Exception):
    pass


def _loads(text: str) -> list[float]:
    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise _Usage(f"--loads: {exc}") from None
    if not loads or any(not 0 < x <= 2 for x in loads):
        raise _Usage("--loads takes fractions of the capacity, each above 0 and at most 2")
    return loads


def run(args: argparse.Namespace) -> int:
    from parallel_consumer.bench.latency.drivers import unavailable

    try:
        loads = _loads(args.loads)
        if args.repeat < 1:
            raise _Usage("--repeat must be 1 or more")
        known = ("pc", *PEERS)
        peers = [] if args.peers.strip() == "none" else [p.strip() for p in args.peers.split(",")]
        unknown = [p for p in peers if p not in known or p == "pc"]
        if unknown:
            raise _Usage(f"unknown peer {', '.join(unknown)}; L1 knows {', '.join(PEERS)}")
    except _Usage as exc:
        print(f"pc-bench: {exc}", file=sys.stderr)
        return 2
    spec = SCALES[args.scale]
    if args.duration:
        spec = dataclasses.replace(spec, duration=args.duration)
    skipped = {}
    contestants = ["pc"]
    for name in peers:
        reason = unavailable(name)
        if reason:
            skipped[name] = reason
            print(f"{name} skipped: {reason}", flush=True)
        else:
            contestants.append(name)
    from parallel_consumer.bench import report
    from parallel_consumer.bench.kafka_io import LOCAL_BROKER_CONFIG, check_reachable
    from parallel_consumer.testing import LocalKafka

    broker = None
    if args.bootstrap:
        check_reachable(args.bootstrap)
        bootstrap, version = args.bootstrap, None
    else:
        print("starting a local Apache Kafka broker (LocalKafka) ...", flush=True)
        broker = LocalKafka(broker_config=LOCAL_BROKER_CONFIG).start()
        bootstrap, version = broker.bootstrap_servers, broker.version
    try:
        machine = report.machine_facts(bootstrap if broker is None else "LocalKafka", version)
        document = _session(bootstrap, spec, loads, contestants, args.repeat, args.capacity)
    finally:
        if broker is not None:
            broker.stop()
    document["machine"] = machine
    document["parameters"]["skipped_contestants"] = skipped
    document["parameters"]["command"] = sys.argv
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"pc-bench-latency-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(document, indent=1))
    _print_table(document)
    print(f"results: {path}")
    from parallel_consumer.bench.latency.charts import plot_latency

    for chart in plot_latency(document, args.out, path.stem):
        print(f"chart: {chart}")
    return 0


def _say(text: str) -> None:
    print(text, flush=True)


def _session(
    bootstrap: str,
    spec: LoadSpec,
    loads: list[float],
    contestants: list[str],
    repeat: int,
    capacity: float | None,
) -> dict[str, Any]:
    from parallel_consumer.bench.latency import session
    from parallel_consumer.bench.runner import one_line, warm_up

    warm_up(bootstrap)
    capacity_runs: list[float] = []
    if capacity is None:
        capacity_runs = session.measure_capacity(bootstrap, spec, repeat, _say)
        capacity = statistics.median(capacity_runs)
    _say(f"pc capacity: {capacity:,.0f} records/s")
    entries = []
    gave_up: dict[str, float] = {}
    for load in loads:
        rate = load * capacity
        runs: dict[str, list[session.RunResult]] = {name: [] for name in contestants}
        errors: dict[str, list[str]] = {name: [] for name in contestants}
        not_run: dict[str, str] = {}
        for index in range(repeat):
            for name in contestants:
                if name in gave_up:
                    not_run[name] = f"could not keep up at {gave_up[name]:g} of the capacity"
                    continue
                _say(f"L1 {load:g} ({rate:,.0f}/s) {name} run {index + 1}/{repeat} ...")
                try:
                    result = session.one_run(bootstrap, name, spec, rate)
                except Exception as exc:
                    errors[name].append(one_line(exc))
                    _say(f"  failed: {errors[name][-1]}")
                    continue
                runs[name].append(result)
                done = result.done_latencies
                _say(
                    f"  {result.verdict.reason}; p99 handler-done "
                    f"{_p99_ms(done)} ms, backlog at end {result.verdict.backlog_at_end}"
                )
        results = {
            name: session.summarise(name, runs[name], errors[name])
            for name in contestants
            if name not in not_run
        }
        for name, summary in results.items():
            if summary["runs"] and summary["runs_kept_up"] == 0:
                gave_up.setdefault(name, load)
        entries.append({"load": load, "rate": rate, "results": results, "not_run": not_run})
    drivers = {name: session.driver(name) for name in contestants}
    return {
        "format": "pc-bench-latency/1",
        "workload": "L1",
        "parameters": {
            "spec": dataclasses.asdict(spec),
            "loads": loads,
            "repeat": repeat,
            "capacity": capacity,
            "capacity_runs": capacity_runs,
            "contestants": contestants,
            "commit_clocks": {name: d.commit_clock for name, d in drivers.items()},
            "notes": {name: d.note for name, d in drivers.items() if d.note},
        },
        "loads": entries,
        "goals": session.goals(entries, spec.work_ms),
    }


def _p99_ms(values: list[float]) -> str:
    from parallel_consumer.bench.latency.stats import percentile

    return f"{percentile(sorted(values), 99) * 1000:.1f}" if values else "-"


def _print_table(document: dict[str, Any]) -> None:
    print(
        f"\nL1 latency (ms; medians of {document['parameters']['repeat']}; pc capacity "
        f"{document['parameters']['capacity']:,.0f}/s)"
    )
    header = f"{'load':>5} {'rate/s':>7} {'contestant':<9} {'verdict':<22}"
    print(header + "  done p50/p99/p99.9        committed p50/p99/p99.9    backlog")
    for entry in document["loads"]:
        for name, r in entry["results"].items():
            if r["keeps_up"]:
                verdict = "sustained"
            elif r["runs"]:
                verdict = f"cannot keep up {r['runs'] - r['runs_kept_up']}/{r['runs']}"
            else:
                verdict = "failed"
            d, c = r["done_ms"], r["commit_ms"]
            print(
                f"{entry['load']:>5g} {entry['rate']:>7,.0f} {name:<9} {verdict:<22}  "
                f"{_fmt(d)}  {_fmt(c)}  {r['backlog_at_end']}"
            )
        for name, reason in entry["not_run"].items():
            print(f"{entry['load']:>5g} {entry['rate']:>7,.0f} {name:<9} not run: {reason}")
    print(f"goals: {json.dumps(document['goals'])}")


def _fmt(p: dict[str, float | None]) -> str:
    return "/".join("-" if v is None else f"{v:.1f}" for v in p.values()).ljust(25)
