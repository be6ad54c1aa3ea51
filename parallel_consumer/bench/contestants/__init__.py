"""The contestants: every way of consuming that a workload's rows are run with.

Adding one is one module with a class following :class:`~.base.Contestant`, listed here.
"""

from __future__ import annotations

from parallel_consumer.bench.contestants.asyncio_floor import AsyncioFloorContestant
from parallel_consumer.bench.contestants.base import Contestant, RunEnv
from parallel_consumer.bench.contestants.client_loops import RawContestant, SerialContestant
from parallel_consumer.bench.contestants.java_pc import JavaParallelConsumerContestant
from parallel_consumer.bench.contestants.pc import (
    ParallelConsumerContestant,
    ParallelConsumerOtelContestant,
)
from parallel_consumer.bench.contestants.pc_loop import ParallelConsumerOnCallersLoopContestant
from parallel_consumer.bench.contestants.pc_share import ParallelConsumerShareContestant
from parallel_consumer.bench.contestants.pyrallel import PyrallelContestant
from parallel_consumer.bench.contestants.share import ShareContestant

__all__ = ["CONTESTANTS", "DEFAULT_PEERS", "MANY_INSTANCES", "US", "Contestant", "RunEnv"]

#: This library's name in tables and ratios ("ratio to us").
US = "pc"

CONTESTANTS: dict[str, Contestant] = {
    c.name: c
    for c in (
        ParallelConsumerContestant(),
        ParallelConsumerOtelContestant(),
        ParallelConsumerOnCallersLoopContestant(),
        SerialContestant(),
        RawContestant(),
        AsyncioFloorContestant(),
        PyrallelContestant(),
        ShareContestant(),
        ParallelConsumerShareContestant(),
        JavaParallelConsumerContestant(),
    )
}

#: Peers run beside ``pc`` unless ``--peers`` says otherwise.
DEFAULT_PEERS = ("serial", "raw", "asyncio", "pyrallel", "share", "pc-share", "java-pc")

#: Contestants that run rows with several members in one group (``Row.instances``): a share
#: group's members all read every partition.
MANY_INSTANCES = frozenset({"share", "pc-share"})
