"""What a handler saw, for engine tests with the real thread runner on the in-memory cluster
(chains, bundles): calls per record, order and overlaps per lane, the most calls at once.
A plain module (tests import it by name, as they do ``doubles``)."""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any


class Log:
    """Per lane: the offsets whose calls succeeded, in the order they ran; lanes run twice at
    once; calls per (lane, offset); the most calls in the handler at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.succeeded: dict[object, list[int]] = defaultdict(list)
        self.calls: dict[tuple[object, int], int] = defaultdict(int)
        self.active: dict[object, int] = defaultdict(int)
        self.overlaps: list[object] = []
        self.inside = 0
        self.most = 0

    def enter(self, lane: object, offset: int) -> None:
        with self.lock:
            self.active[lane] += 1
            self.calls[(lane, offset)] += 1
            if self.active[lane] > 1:
                self.overlaps.append(lane)
            self.inside += 1
            self.most = max(self.most, self.inside)

    def leave(self, lane: object, offset: int, ok: bool) -> None:
        with self.lock:
            self.active[lane] -= 1
            self.inside -= 1
            if ok:
                self.succeeded[lane].append(offset)

    def count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.succeeded.values())


def produce(cluster: Any, n: int, keys: int, partitions: int = 2) -> None:
    """Topic ``t`` with ``partitions`` partitions and ``n`` records, key ``k<i % keys>``,
    spread round-robin."""
    cluster.create_topic("t", partitions)
    with cluster._cond:
        for i in range(n):
            cluster.produce("t", b"%d" % i, key=b"k%d" % (i % keys), partition=i % partitions)
