"""pc-bench: the benchmarks of docs/benchmarks.md, inside the package (``pip install -e
'.[bench]'`` in a clone).

The folder is the design: ``workloads/`` (one module per workload: its rows), ``contestants/``
(one module per way of consuming: this library, plain client loops, pyrallel-consumer, a share
group, the Java Parallel Consumer), ``measure`` (the clock, the ideal, the checks: pure),
``runner`` (prepares data, runs contestants), ``report`` (progress, table, JSON), ``plot``
(charts) and ``cli`` (``pc-bench``). See docs/benchmarks.md.
"""

from __future__ import annotations

from parallel_consumer.bench.cli import main

__all__ = ["main"]
