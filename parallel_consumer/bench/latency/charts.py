"""L1's charts: per load, the CDF of record-produced -> handler-done and -> commit
acknowledged, one line per contestant (matplotlib, from the bench extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_latency"]

#: Where the percentiles are read off the logit axis.
TICKS = (0.01, 0.1, 0.5, 0.9, 0.99, 0.999)
TICK_LABELS = ("p1", "p10", "p50", "p90", "p99", "p99.9")


def plot_latency(document: dict[str, Any], out: Path, stem: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import (
        FixedFormatter,
        FixedLocator,
        NullFormatter,
        ScalarFormatter,
    )

    from parallel_consumer.bench.colours import COLOURS

    written = []
    spec = document["parameters"]["spec"]
    notes = document["parameters"].get("notes", {})
    for entry in document["loads"]:
        figure, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
        for ax, kind, title in (
            (axes[0], "done", "produced -> handler returned"),
            (axes[1], "commit", "produced -> commit acknowledged"),
        ):
            for name, result in entry["results"].items():
                points = [(x, f) for x, f in result[f"{kind}_cdf_ms"] if 0 < f < 1 and x > 0]
                if not points:
                    continue
                note = notes.get(name, "")
                label = name + (" (UNORDERED)" if "UNORDERED" in note else "")
                label += " (floor: poll returned, no work)" if "floor" in note else ""
                if not result["keeps_up"]:
                    label += " (cannot keep up)"
                ax.plot(
                    [x for x, _ in points],
                    [f for _, f in points],
                    label=label,
                    color=COLOURS.get(name),
                    linestyle="-" if result["keeps_up"] else ":",
                )
            ax.set_xscale("log")
            ax.set_yscale("logit")
            ax.yaxis.set_major_locator(FixedLocator(TICKS))
            ax.yaxis.set_major_formatter(FixedFormatter(TICK_LABELS))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.set_xlabel("latency (ms)")
            ax.set_title(title)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(loc="lower right", fontsize=8)
        axes[0].set_ylabel("records within that latency (percentile, logit axis)")
        figure.suptitle(
            f"L1 at {entry['load']:g} of pc's capacity ({entry['rate']:,.0f} records/s): KEY, "
            f"Zipf s={spec['zipf_s']:g} over {spec['keys']:,} keys, {spec['work_ms']:g} ms "
            f"handler, C={spec['concurrency']}; repeats pooled"
        )
        figure.tight_layout()
        path = out / f"{stem}-L1-{round(entry['load'] * 100)}pct.png"
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    return written
