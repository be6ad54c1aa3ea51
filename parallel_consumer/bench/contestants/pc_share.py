"""``pc-share``: this library on a share group (KIP-932, docs/share-groups.md), beside ``pc`` on a
consumer group and the raw ``share`` loop. UNORDERED rows only."""

from __future__ import annotations

import time
from typing import Any

from parallel_consumer import GroupProtocol, Options, ParallelConsumer
from parallel_consumer.bench.contestants.base import LogRecorder, RunEnv
from parallel_consumer.bench.contestants.pc import ParallelConsumerContestant
from parallel_consumer.bench.contestants.share import (
    new_share_group,
    share_unavailable,
    share_unsupported,
)
from parallel_consumer.bench.model import Observation, Row

__all__ = ["ParallelConsumerShareContestant"]


class ParallelConsumerShareContestant(ParallelConsumerContestant):
    name = "pc-share"
    description = "parallel_consumer on a share group (group_protocol='share')"

    def unavailable(self) -> str | None:
        return share_unavailable()

    def unsupported(self, row: Row) -> str | None:
        if (why := share_unsupported(row)) is not None:
            return why
        if row.produce is not None and row.produce == "PERIODIC_TRANSACTIONAL_PRODUCER":
            return "a share group has no transactions"
        return super().unsupported(row)

    def options(self, row: Row) -> Options:
        plain = super().options(row)
        settings = {
            name: getattr(plain, name)
            for name in (
                "ordering",
                "max_concurrency",
                "batch_size",
                "commit_interval",
                "max_buffered_records",
                "runner",
                "processes",
                "loop_factory",
            )
        }
        return Options(group_protocol=GroupProtocol.SHARE, **settings)

    def run(self, env: RunEnv, row: Row, topic: str, ends: dict[int, int]) -> Observation:
        if row.produce is not None or row.runner.get("runner") == "process":
            raise RuntimeError("pc-share runs in-process rows without outputs")
        recorder = LogRecorder(sum(ends.values()))
        config: dict[str, Any] = {
            "bootstrap.servers": env.bootstrap,
            "group.id": new_share_group(env.bootstrap),
            "log_level": 3,  # (the client warns once that share consumers are in preview)
        }
        members = [ParallelConsumer(config, self.options(row)) for _ in range(row.instances)]
        started = time.time()
        try:
            handler = self._handler(row, recorder)
            for pc in members:
                pc.subscribe([topic])
                pc.poll(handler)
            recorder.wait(env.timeout, f"pc-share {row.name}")
            # The clock stops once every record was acknowledged to its client (a share group
            # commits nothing; the acknowledgements travel with the clients' next polls).
            deadline = time.monotonic() + 60
            while any((p := pc.statistics().poller) is not None and p.held for pc in members):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pc-share {row.name}: records still held")
                time.sleep(0.002)
            finished = time.time()
            registered = [pc.statistics().records_registered for pc in members]
        finally:
            for pc in members:
                pc.close()
        assert recorder.first_call is not None
        return Observation(
            started=started,
            first_call=recorder.first_call,
            finished=finished,
            log=recorder.log,
            extra={
                "clock": "to the last record's acknowledgement (sent with its client's next poll)",
                "records_registered": registered,
            },
        )
