"""What a run shows and keeps: live progress (rich), the results table, one JSON file per run."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import confluent_kafka

from parallel_consumer.bench.contestants import US
from parallel_consumer.bench.measure import Measurement
from parallel_consumer.bench.model import Row
from parallel_consumer.bench.runner import RowResult

__all__ = ["RichProgress", "machine_facts", "results_table", "write_json"]


class RichProgress:
    """A live line per run (rich's status spinner) and one printed line per finished run."""

    def __init__(self) -> None:
        from rich.console import Console

        # Piped output (CI logs, tee) gets a wide console, not rich's default of 80 columns.
        self.console = Console(highlight=False, width=None if sys.stdout.isatty() else 180)
        self._status: Any = None
        self._row_runs = 0
        self._row_done = 0

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _show(self, text: str) -> None:
        if self._status is None:
            self._status = self.console.status(text)
            self._status.start()
        else:
            self._status.update(text)

    def note(self, text: str) -> None:
        self.console.print(text)

    def row_started(self, row: Row, runs: int) -> None:
        self._row_runs, self._row_done = runs, 0
        data = row.data
        self.console.rule(
            f"[bold]{row.name}[/]: {data.records:,} records, {data.partitions} partition(s), "
            f"{row.ordering}, C={row.concurrency}, {row.work.describe()}"
            + (f", {row.instances} instances" if row.instances > 1 else "")
            + (f", batch {row.batch_size}" if row.batch_size > 1 else "")
        )
        self._show(f"{row.name}: producing {data.records:,} records")

    def data_ready(self, row: Row, topic: str, produce_seconds: float, reused: bool) -> None:
        if not reused:
            self.console.print(
                f"  produced to {topic} in {produce_seconds:.2f} s (not on any clock)",
                style="dim",
            )

    def run_started(self, row: Row, contestant: str, index: int) -> None:
        self._show(
            f"{row.name}: {contestant} run {index + 1} ({self._row_done}/{self._row_runs} done)"
        )

    def run_finished(self, row: Row, contestant: str, result: Measurement) -> None:
        self._row_done += 1
        checks = "ok" if result.missing == 0 and result.order_ok else "[red]CHECK FAILED[/]"
        ideal = (
            f"ideal {result.ideal:7.3f} s  ratio {result.ratio:5.2f}"
            if row.work.kind != "noop"
            else f"c {result.c_us:6.1f} µs/record"
        )
        self.console.print(
            f"  {contestant:<9} wall {result.wall:7.3f} s  {ideal}  "
            f"{result.records_per_s:>9,.0f} rec/s  start-up {result.startup:5.2f} s  "
            f"dup {result.duplicates}  missing {result.missing}  "
            f"order {'kept' if result.order_ok else 'BROKEN'}  {checks}"
        )

    def run_skipped(self, row: Row, contestant: str, reason: str) -> None:
        self.console.print(f"  {contestant:<9} skipped: {reason}", style="yellow")

    def run_failed(self, row: Row, contestant: str, reason: str) -> None:
        self.console.print(f"  {contestant:<9} failed: {reason}", style="red")


def results_table(results: Sequence[RowResult]) -> Any:
    """Rows = workload x contestant; wall, ideal, ratio, records/s, duplicates, ratio to us."""
    from rich.table import Table

    table = Table(title="pc-bench results (medians; wall/ours > 1: slower than pc)")
    for name, justify in (
        ("row", "left"),
        ("contestant", "left"),
        ("wall s", "right"),
        ("ideal s", "right"),
        ("wall/ideal", "right"),
        ("records/s", "right"),
        ("c µs", "right"),
        ("start-up s", "right"),
        ("dup", "right"),
        ("checks", "left"),
        ("wall/ours", "right"),
        ("Java pub. s", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for result in results:
        ours = result.summaries.get(US)
        first = True
        for name, summary in result.summaries.items():
            vs_us = f"{summary.wall / ours.wall:.2f}" if ours and ours.wall > 0 else "-"
            java = result.row.java_published if first and result.row.java_published else None
            # A no-op row's ideal is ~0: its figures are records/s and c, not a ratio.
            has_ideal = result.row.work.kind != "noop" and summary.ideal > 0
            table.add_row(
                result.row.name if first else "",
                name,
                f"{summary.wall:.3f}",
                f"{summary.ideal:.3f}" if has_ideal else "-",
                f"{summary.ratio:.2f}" if has_ideal else "-",
                f"{summary.records_per_s:,.0f}",
                f"{summary.c_us:.1f}",
                f"{summary.startup:.2f}",
                str(summary.duplicates),
                "ok" if summary.ok else "[red]FAILED[/]",
                vs_us,
                f"{java:g}" if java else "",
            )
            first = False
        for name in result.failed:
            table.add_row(
                result.row.name if first else "", name, *[""] * 7, "[red]failed[/]", "", ""
            )
            first = False
    return table


def machine_facts(broker: str, kafka_version: str | None) -> dict[str, Any]:
    """Cores, memory, Python, client and broker versions: what a reader needs to weigh figures."""
    memory = None
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        memory = round(pages * page_size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    from parallel_consumer.bench.contestants.java_pc import find_project

    return {
        "cores": os.cpu_count(),
        "memory_gib": memory,
        "load_average_at_start": load,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "kafka": kafka_version,
        "broker": broker,
        "java_project": str(find_project()) if find_project() else None,
        "note": "a local broker's JVM shares the machine's cores with the benchmark",
    }


def write_json(
    out_dir: Path,
    results: Sequence[RowResult],
    *,
    machine: dict[str, Any],
    parameters: dict[str, Any],
    skipped_contestants: dict[str, str],
) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"pc-bench-{time.strftime('%Y%m%dT%H%M%S')}.json"
    document = {
        "format": "pc-bench/1",
        "machine": machine,
        "parameters": parameters,
        "skipped_contestants": skipped_contestants,
        "rows": [
            {
                "workload": r.row.workload,
                "row": r.row.label,
                "parameters": _row_parameters(r.row),
                "topic": r.topic,
                "produce_seconds": r.produce_seconds,
                "java_published": r.row.java_published,
                "results": {name: s.as_dict() for name, s in r.summaries.items()},
                "start_inclusive_records_per_s": {
                    name: s.runs[0].records / (s.wall + s.startup)
                    for name, s in r.summaries.items()
                },
                "ratio_to_us": {
                    name: s.wall / r.summaries[US].wall
                    for name, s in r.summaries.items()
                    if US in r.summaries and r.summaries[US].wall > 0
                },
                "ratio_to_raw_records_per_s": {
                    name: s.records_per_s / r.summaries["raw"].records_per_s
                    for name, s in r.summaries.items()
                    if "raw" in r.summaries
                },
                "skipped": r.skipped,
                "failed": r.failed,
            }
            for r in results
        ],
    }
    path.write_text(json.dumps(document, indent=2, default=str))
    return path


def _row_parameters(row: Row) -> dict[str, Any]:
    return {
        "records": row.data.records,
        "partitions": row.data.partitions,
        "keys": row.data.keys,
        "key_mode": row.data.key_mode,
        "value_size": row.data.value_size,
        "ordering": row.ordering,
        "concurrency": row.concurrency,
        "instances": row.instances,
        "work": row.work.describe(),
        "batch_size": row.batch_size,
        "commit_interval": row.commit_interval,
        "async_handler": row.async_handler,
        "runner": row.runner,
        "produce": row.produce,
    }
