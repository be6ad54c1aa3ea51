"""``pc-bench plot``: PNG charts of a run's JSON (matplotlib, from the bench extra).

* W1 as grouped bars per row: this library, java-pc when it ran, the Java library's published
  figure, and the ideal;
* W2 (and any other no-op workload) as records/s per contestant per row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from parallel_consumer.bench.colours import COLOURS

__all__ = ["plot"]


def plot(results: Path, out: Path | None = None) -> list[Path]:
    """Write the charts this run has data for; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    document = json.loads(results.read_text())
    out = out or results.parent
    out.mkdir(parents=True, exist_ok=True)
    stem = results.stem
    if document.get("format", "").startswith("pc-bench-latency"):
        from parallel_consumer.bench.latency.charts import plot_latency

        return plot_latency(document, out, stem)
    written = []
    w1 = [r for r in document["rows"] if r["workload"] == "W1" and r["results"]]
    if w1:
        written.append(_w1_chart(w1, document, out / f"{stem}-W1.png"))
    w2 = [r for r in document["rows"] if r["workload"] == "W2" and r["results"]]
    if w2:
        written.append(_rate_chart(w2, document, "W2", out / f"{stem}-W2.png"))
    return written


def _subtitle(document: dict[str, Any]) -> str:
    m = document["machine"]
    p = document["parameters"]
    gc = p.get("gc") or {}
    collector = f"; garbage collector {gc['mode']}" if gc.get("mode") else ""
    return (
        f"{m.get('cores')} cores, Python {m.get('python')}, confluent-kafka "
        f"{m.get('confluent_kafka')}, Kafka {m.get('kafka') or '?'}; scale {p.get('scale')}, "
        f"median of {p.get('repeat')}{collector}"
    )


def _style(ax: Any, ncol: int) -> None:
    """Plain numbers on the log axis (not 10^x), and the legend under the plot, off the bars."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    plain = FuncFormatter(lambda v, _: f"{v:,.3g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_locator(LogLocator(subs=(2, 5)))
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=8)
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=ncol, frameon=False)
    ax.grid(axis="y", alpha=0.3, which="both")


def _w1_chart(rows: list[dict[str, Any]], document: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    labels = [r["row"] for r in rows]
    series: dict[str, list[float]] = {"pc": [], "java-pc": [], "Java published": [], "ideal": []}
    for r in rows:
        res = r["results"]
        series["pc"].append(res["pc"]["wall"] if "pc" in res else float("nan"))
        series["java-pc"].append(res["java-pc"]["wall"] if "java-pc" in res else float("nan"))
        series["Java published"].append(r.get("java_published") or float("nan"))
        series["ideal"].append(res["pc"]["ideal"] if "pc" in res else float("nan"))
    series = {k: v for k, v in series.items() if any(x == x for x in v)}  # drop all-NaN
    names = {
        "pc": "parallel_consumer (this library)",
        "java-pc": "Java Parallel Consumer, same run",
        "Java published": "Java Parallel Consumer, published (10,000 records, other hardware)",
        "ideal": "ideal (from the measured sleeps)",
    }
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(labels) + 2), 6))
    ax.margins(y=0.12)
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
        bars = ax.bar(xs, values, width, label=names.get(name, name), color=COLOURS[name])
        ax.bar_label(
            bars,
            labels=[("" if v != v else f"{v:.1f}" if v >= 10 else f"{v:.2f}") for v in values],
            fontsize=7,
            padding=2,
            rotation=90 if len(labels) > 5 else 0,
        )
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("seconds (log scale; lower is better)")
    ax.set_yscale("log")
    records = rows[0]["parameters"]["records"]
    ax.set_title(
        f"W1: {records:,} records, 1 partition, 0-4 ms sleep, 16 threads: wall time per "
        f"ordering\n{_subtitle(document)}",
        fontsize=10,
    )
    _style(ax, 2)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _rate_chart(
    rows: list[dict[str, Any]], document: dict[str, Any], workload: str, path: Path
) -> Path:
    import matplotlib.pyplot as plt

    contestants: list[str] = []
    for r in rows:
        contestants += [c for c in r["results"] if c not in contestants]
    labels = [r["row"] for r in rows]
    fig, ax = plt.subplots(figsize=(11, 5.5))
    width = 0.8 / len(contestants)
    for i, name in enumerate(contestants):
        values = [
            r["results"][name]["records_per_s"] if name in r["results"] else float("nan")
            for r in rows
        ]
        xs = [x + (i - (len(contestants) - 1) / 2) * width for x in range(len(labels))]
        bars = ax.bar(xs, values, width, label=name, color=COLOURS.get(name))
        ax.bar_label(
            bars,
            labels=[f"{v / 1000:,.0f}k" if v == v else "" for v in values],
            fontsize=7,
            padding=2,
        )
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("records/s (log scale; higher is better)")
    ax.set_yscale("log")
    p = rows[0]["parameters"]
    ax.set_title(
        f"{workload}: {p['records']:,} records, {p['partitions']} partitions, {p['keys']:,} keys, "
        f"{p['work']} handler: throughput per contestant\n{_subtitle(document)}",
        fontsize=10,
    )
    _style(ax, min(len(contestants), 6))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
