"""L1, the latency workload of pc-bench (``pc-bench latency``, docs/benchmarks.md).

An open-loop producer writes records at a fixed rate (each carries its produce time in its
value), KEY order over Zipf-distributed keys, a 5 ms handler; every contestant is run at the
same rates (25 %, 50 % and 80 % of ``pc``'s capacity, measured first in the same run) and
reports when each record's handler returned and when its offset's commit was acknowledged.

``load`` (the schedule and the keys) and ``stats`` (percentiles, CDFs, the keep-up verdict)
are pure; ``producer`` runs in a child process so that producing does not take the GIL from
the contestants; ``drivers`` and ``java_driver`` run one contestant each; ``session`` runs the
whole workload; ``command`` is the command line and ``charts`` the CDF plots.
"""

from __future__ import annotations
