"""``pc``: operator and developer commands for parallel_consumer.

``pc demo`` processes keyed records on a local broker; ``pc kafka start`` runs a local broker
until Ctrl-C; ``pc kafka resolve`` fills the broker jar cache (``pc spark resolve``: Spark's
Kafka connector jars); ``pc spark cluster`` runs a Spark standalone cluster until Ctrl-C;
``pc dlq show`` and ``pc dlq redrive`` inspect and re-publish dead-lettered records;
``pc offsets`` shows a group's committed offsets with their decoded offset maps and lag.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType

from parallel_consumer import __version__
from parallel_consumer._arguments import Parser, config_pair
from parallel_consumer.cli import demo, dlq, offsets
from parallel_consumer.cli.brokers import CommandError, verbose
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.testing import _apache_kafka
from parallel_consumer.testing.local_kafka import DEFAULT_KAFKA_VERSION, LocalKafka, LocalKafkaError
from parallel_consumer.testing.spark_cluster import SparkCluster, SparkClusterError

__all__ = ["main"]

#: Commands announced but not implemented yet: name -> what they will do.
_COMING: dict[str, str] = {}


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pc", description="parallel_consumer tools")
    parser.add_argument(
        "--version", action="version", version=f"pc (parallel_consumer) {__version__}"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print the Kafka clients' log lines too"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    kafka = commands.add_parser("kafka", help="run a local Kafka broker for development and tests")
    kafka_commands = kafka.add_subparsers(dest="kafka_command", required=True, metavar="ACTION")
    start = kafka_commands.add_parser("start", help="start a broker; stop it with Ctrl-C")
    start.add_argument(
        "--backend",
        choices=["auto", "apache", "tansu"],
        default="auto",
        help="auto: apache when Java (and its jars or Maven) is there, else tansu",
    )
    start.add_argument("--port", type=int, default=None, help="client port (default: a free one)")
    start.add_argument("--version", default=DEFAULT_KAFKA_VERSION, help="Apache Kafka version")
    start.add_argument(
        "--config",
        type=config_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a server.properties entry (apache backend; repeatable)",
    )
    resolve = kafka_commands.add_parser(
        "resolve", help="download the broker jars with Maven into the cache (once)"
    )
    resolve.add_argument("--version", default=DEFAULT_KAFKA_VERSION, help="Apache Kafka version")

    spark = commands.add_parser("spark", help="the PySpark runner's tools")
    spark_commands = spark.add_subparsers(dest="spark_command", required=True, metavar="ACTION")
    spark_commands.add_parser(
        "resolve",
        help="download Spark's Kafka connector jars with Maven into the cache (once); needs "
        "the spark extra",
    )
    cluster = spark_commands.add_parser(
        "cluster",
        help="run a Spark standalone cluster on this machine (a Master and Workers from the "
        "installed pyspark, on loopback) until Ctrl-C; needs the spark extra and Java",
    )
    cluster.add_argument("--workers", type=int, default=2, help="Workers (default 2)")
    cluster.add_argument("--cores", type=int, default=1, help="cores per Worker (default 1)")
    cluster.add_argument(
        "--memory", default="1g", help="memory a Worker offers its executors (default 1g)"
    )
    cluster.add_argument(
        "--executor-memory", default="512m", help="in the printed settings (default 512m)"
    )

    demo.add_parser(commands)
    dlq.add_parser(commands)
    offsets.add_parser(commands)
    for name, what in _COMING.items():
        commands.add_parser(name, help=f"(coming) {what}")
    return parser


def _kafka_start(args: argparse.Namespace) -> int:
    broker = LocalKafka(
        backend=args.backend, version=args.version, port=args.port, broker_config=dict(args.config)
    )
    try:
        broker.start()  # Ctrl-C here raises KeyboardInterrupt; start() stops what it began
    except KeyboardInterrupt:
        return 130
    try:
        print(broker.bootstrap_servers, flush=True)
        print(
            f"{broker.backend} {broker.version} ready in {broker.start_seconds:.1f} s; "
            f"log: {broker.log_path}; Ctrl-C stops it.",
            file=sys.stderr,
            flush=True,
        )
        return _until_stopped(lambda: broker.running, f"the broker exited; see {broker.log_path}")
    finally:
        broker.stop()


def _spark_cluster(args: argparse.Namespace) -> int:
    cluster = SparkCluster(
        args.workers, cores=args.cores, memory=args.memory, executor_memory=args.executor_memory
    )
    began = time.monotonic()
    try:
        cluster.start()  # Ctrl-C here raises KeyboardInterrupt; start() stops what it began
    except KeyboardInterrupt:
        return 130
    try:
        print(cluster.master_url, flush=True)
        settings = " ".join(f"--conf {k}={v}" for k, v in cluster.session_conf().items())
        print(
            f"{args.workers} Spark workers of {args.cores} core(s) ready in "
            f"{time.monotonic() - began:.1f} s; logs in {cluster.directory}; drivers use "
            f"{settings}; Ctrl-C stops it.",
            file=sys.stderr,
            flush=True,
        )
        return _until_stopped(
            lambda: cluster.running, f"a Spark daemon exited; see {cluster.directory}"
        )
    finally:
        cluster.stop()


def _until_stopped(running: Callable[[], bool], exited: str) -> int:
    """Wait for Ctrl-C or SIGTERM (0) or for what runs to exit by itself (1, printing
    ``exited``)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            if not running():
                print(exited, file=sys.stderr)
                return 1
        print("stopping", file=sys.stderr, flush=True)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pc``; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.verbose:
        verbose()
    try:
        if args.command == "kafka" and args.kafka_command == "start":
            return _kafka_start(args)
        if args.command == "demo":
            return demo.run(args)
        if args.command == "dlq":
            return dlq.run(args)
        if args.command == "offsets":
            return offsets.run(args)
        if args.command == "kafka" and args.kafka_command == "resolve":
            lib = _apache_kafka.resolve_jars(args.version)
            print(lib)
            return 0
        if args.command == "spark" and args.spark_command == "cluster":
            return _spark_cluster(args)
        if args.command == "spark" and args.spark_command == "resolve":
            from parallel_consumer.spark.jars import connector_jars

            try:
                found = connector_jars()
            except ImportError as exc:
                print(
                    f"pc: {exc}; install the spark extra: pip install -e '.[spark]' in a clone",
                    file=sys.stderr,
                )
                return 1
            print("\n".join(str(jar) for jar in found))
            return 0
    except (LocalKafkaError, SparkClusterError, ConfigurationError, CommandError) as exc:
        print(f"pc: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pc: interrupted", file=sys.stderr)
        return 130
    print(
        f"pc {args.command}: coming soon ({_COMING[args.command]}); not implemented yet.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
