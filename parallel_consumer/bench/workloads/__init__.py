"""The workload registry (docs/benchmarks.md): one module per workload, each a :class:`Workload`.

Adding a workload is one module defining ``WORKLOAD`` and one line in :data:`WORKLOADS`.
"""

from __future__ import annotations

from parallel_consumer.bench.model import Row
from parallel_consumer.bench.workloads import w1, w1b, w2, w3, w4, w5, w6, w8
from parallel_consumer.bench.workloads.base import Scale, Workload

__all__ = ["QUICK", "WORKLOADS", "Scale", "Workload", "quick_rows"]

WORKLOADS: dict[str, Workload] = {
    w.WORKLOAD.id: w.WORKLOAD for w in (w1, w1b, w2, w3, w4, w5, w6, w8)
}

#: What ``--quick`` runs (reduced sizes): the README's main command, a few minutes.
QUICK = ("W1", "W2")


def quick_rows() -> list[Row]:
    return [row for workload in QUICK for row in WORKLOADS[workload].rows("quick")]
