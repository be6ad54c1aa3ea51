"""``pc-bench``: run the benchmark workloads (docs/benchmarks.md) against this library and its
peers, or plot a run's JSON.

    pc-bench run --quick                     # W1 and W2 reduced: a few minutes, a local broker
    pc-bench run W1 W2 --repeat 3            # full sizes, medians of 3
    pc-bench run --all --bootstrap host:9092 --peers serial,java-pc
    pc-bench list                            # workloads and contestants
    pc-bench plot benchmarks/results/pc-bench-....json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from parallel_consumer._arguments import Parser
from parallel_consumer.bench.gc_mode import GC_MODES, TUNED_YOUNG_THRESHOLD, gc_mode
from parallel_consumer.bench.kafka_io import LOCAL_BROKER_CONFIG

__all__ = ["main"]

DEFAULT_OUT = Path("benchmarks/results")


class UsageError(Exception):
    """Bad input on the command line: printed as one line, exit status 2."""


def _parser() -> argparse.ArgumentParser:
    from parallel_consumer.bench.contestants import DEFAULT_PEERS

    parser = Parser(
        prog="pc-bench",
        description="parallel_consumer benchmarks: workloads, contestants and how to read the "
        "table in docs/benchmarks.md",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run workloads against this library and its peers")
    run.add_argument("workloads", nargs="*", metavar="WORKLOAD", help="e.g. W1 W2 (see list)")
    which = run.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="W1 and W2 reduced (the default)")
    which.add_argument("--all", action="store_true", help="every workload at full size")
    run.add_argument(
        "--scale",
        choices=["full", "quick", "tiny"],
        default=None,
        help="sizes of the named workloads (default full; --quick implies quick)",
    )
    run.add_argument("--bootstrap", help="use this broker instead of starting a local one")
    run.add_argument(
        "--peers",
        default=",".join(DEFAULT_PEERS),
        help=f"contestants beside pc, comma-separated (default {','.join(DEFAULT_PEERS)}; "
        "'none' for pc alone)",
    )
    run.add_argument("--repeat", type=int, default=None, help="runs per row (default 3; quick 1)")
    run.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the JSON file")
    run.add_argument("--timeout", type=float, default=600.0, help="most seconds for one run")
    run.add_argument(
        "--gc",
        choices=GC_MODES,
        default="default",
        help="the garbage collector's settings for the in-process contestants: the "
        "interpreter's (default) or the tuning docs/async-handlers.md recommends (gc.freeze() "
        f"after start-up, young threshold {TUNED_YOUNG_THRESHOLD:,})",
    )
    commands.add_parser("list", help="list workloads and contestants")
    plot = commands.add_parser("plot", help="write PNG charts of a run's JSON")
    plot.add_argument("results", type=Path)
    plot.add_argument("--out", type=Path, default=None, help="folder (default: beside the JSON)")
    from parallel_consumer.bench.latency import command as latency

    latency.add_parser(commands)
    return parser


def _select(args: argparse.Namespace) -> tuple[list[str], str]:
    from parallel_consumer.bench.workloads import QUICK, WORKLOADS

    by_name = {name.lower(): name for name in WORKLOADS}
    unknown = [w for w in args.workloads if w.lower() not in by_name]
    if unknown:
        raise UsageError(
            f"unknown workload {', '.join(unknown)}; known: {', '.join(WORKLOADS)} "
            "(W7 is not implemented yet)"
        )
    if args.all:
        return list(WORKLOADS), args.scale or "full"
    if args.workloads:
        return [by_name[w.lower()] for w in args.workloads], args.scale or "full"
    return list(QUICK), args.scale or "quick"


def _peers(text: str) -> list[str]:
    from parallel_consumer.bench.contestants import CONTESTANTS, US

    names = [] if text.strip() == "none" else [p.strip() for p in text.split(",") if p.strip()]
    unknown = [n for n in names if n not in CONTESTANTS or n == US]
    if unknown:
        known = ", ".join(n for n in CONTESTANTS if n != US)
        raise UsageError(f"unknown peer {', '.join(unknown)}; known: {known}")
    return names


def _run(args: argparse.Namespace) -> int:
    from parallel_consumer.bench import report
    from parallel_consumer.bench.contestants import CONTESTANTS, US, RunEnv
    from parallel_consumer.bench.kafka_io import check_reachable
    from parallel_consumer.bench.runner import run_rows
    from parallel_consumer.bench.workloads import WORKLOADS
    from parallel_consumer.testing import LocalKafka

    workloads, scale = _select(args)
    peers = _peers(args.peers)
    repeat = args.repeat or (1 if scale != "full" else 3)
    if repeat < 1:
        raise UsageError("--repeat must be 1 or more")
    progress = report.RichProgress()
    say = progress.note

    rows = []
    for name in workloads:
        reason = WORKLOADS[name].requires()
        if reason:
            say(f"[yellow]{name} skipped: {reason}[/]")
            continue
        rows += WORKLOADS[name].rows(scale)  # type: ignore[arg-type]
    skipped_contestants = {}
    contestants = [US]
    if "java-pc" in peers:
        from parallel_consumer.bench.contestants.java_pc import find_project, needs_build

        project = find_project()
        if project is not None and needs_build(project):
            say(f"building the java-pc harness with Maven in {project} (first use) ...")
    for name in peers:
        reason = CONTESTANTS[name].unavailable()
        if reason:
            skipped_contestants[name] = reason
            say(f"[yellow]{name} skipped: {reason}[/]")
        else:
            contestants.append(name)
    if not rows:
        say("nothing to run")
        return 1

    broker = None
    if args.bootstrap:
        check_reachable(args.bootstrap)
        bootstrap, kafka_version = args.bootstrap, None
    else:
        say("starting a local Apache Kafka broker (LocalKafka) ...")
        broker = LocalKafka(broker_config=LOCAL_BROKER_CONFIG).start()
        bootstrap, kafka_version = broker.bootstrap_servers, broker.version
        say(f"broker {broker.version} ready at {bootstrap} in {broker.start_seconds:.1f} s")
    try:
        machine = report.machine_facts(bootstrap if broker is None else "LocalKafka", kafka_version)
        with gc_mode(args.gc) as gc_settings:
            say(
                f"garbage collector {args.gc}: thresholds {gc_settings['thresholds']}, "
                f"{gc_settings['frozen_objects']:,} objects frozen (in-process contestants)"
            )
            results = run_rows(RunEnv(bootstrap, args.timeout), rows, contestants, repeat, progress)
    finally:
        progress.close()
        if broker is not None:
            broker.stop()
    progress.console.print(report.results_table(results))
    path = report.write_json(
        args.out,
        results,
        machine=machine,
        parameters={
            "workloads": workloads,
            "scale": scale,
            "repeat": repeat,
            "contestants": contestants,
            "timeout": args.timeout,
            "gc": gc_settings,
            "command": sys.argv,
        },
        skipped_contestants=skipped_contestants,
    )
    say(f"results: {path}  (charts: pc-bench plot {path})")
    failed = [r for r in results if r.failed or any(not s.ok for s in r.summaries.values())]
    return 1 if failed else 0


def _list() -> int:
    from parallel_consumer.bench.contestants import CONTESTANTS
    from parallel_consumer.bench.workloads import QUICK, WORKLOADS

    print("workloads:")
    for name, workload in WORKLOADS.items():
        reason = workload.requires()
        quick = " (in --quick)" if name in QUICK else ""
        print(f"  {name:<4} {workload.title}{quick}" + (f"  [skipped: {reason}]" if reason else ""))
    print("contestants:")
    for name, contestant in CONTESTANTS.items():
        print(f"  {name:<9} {contestant.description}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pc-bench``; returns the exit status."""
    args = _parser().parse_args(argv)
    from parallel_consumer.bench.kafka_io import BrokerUnreachable
    from parallel_consumer.testing import LocalKafkaError

    try:
        if args.command == "list":
            return _list()
        if args.command == "latency":
            from parallel_consumer.bench.latency import command as latency

            return latency.run(args)
        if args.command == "plot":
            from parallel_consumer.bench import plot

            for path in plot.plot(args.results, args.out):
                print(path)
            return 0
        return _run(args)
    except UsageError as exc:
        print(f"pc-bench: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"pc-bench: no such file: {exc.filename}", file=sys.stderr)
        return 1
    except (BrokerUnreachable, LocalKafkaError) as exc:
        print(f"pc-bench: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(
            f"pc-bench: {exc}; install the bench extra: pip install -e '.[bench]' in a clone",
            file=sys.stderr,
        )
        return 1
