"""Shared pieces of the poll_and_produce tests: reading an output topic back and checking it.

Outputs carry their input's coordinates in the value (``"<partition>:<offset>"``), so a test
can tell which input each output came from, count duplicates and check per-key order.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition
from engine_support import committed_in_engine, end_offsets, wait_until

from parallel_consumer import ParallelConsumer, PollContext, ProducerRecord, Statistics


def output_of(ctx: PollContext, out_topic: str) -> ProducerRecord:
    """The output a test handler produces for one input: same key, the input's coordinates."""
    return ProducerRecord(out_topic, f"{ctx.partition}:{ctx.offset}", key=ctx.key)


@dataclass
class OutputLog:
    """What a reader of the output topic saw, in log order per output partition."""

    #: Per output partition: (key, input partition, input offset), in the output's order.
    records: dict[int, list[tuple[bytes | None, int, int]]] = field(default_factory=dict)

    @property
    def inputs(self) -> Counter[tuple[int, int]]:
        """How often each input (partition, offset) has an output."""
        return Counter((p, o) for rows in self.records.values() for _, p, o in rows)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.inputs.values())

    def order_violations(self) -> list[tuple[bytes | None, int, int]]:
        """(key, earlier output's input offset, later output's input offset) wherever a key's
        outputs are not in the order of their inputs within one input partition. Repeats of an
        output already seen (duplicates) are skipped."""
        wrong = []
        for rows in self.records.values():
            last: dict[tuple[bytes | None, int], int] = {}
            seen: set[tuple[int, int]] = set()
            for key, partition, offset in rows:
                if (partition, offset) in seen:
                    continue
                seen.add((partition, offset))
                lane = (key, partition)
                if lane in last and offset < last[lane]:
                    wrong.append((key, last[lane], offset))
                last[lane] = max(offset, last.get(lane, -1))
        return wrong


def read_outputs(
    bootstrap_servers: str,
    topic: str,
    partitions: Sequence[int],
    *,
    read_committed: bool = True,
    timeout: float = 60.0,
) -> OutputLog:
    """Read ``topic`` from the beginning to its current end (the last stable offset under
    ``read_committed``)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "pc-output-reader-unused",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if read_committed else "read_uncommitted",
            "enable.partition.eof": True,
        }
    )
    log = OutputLog({p: [] for p in partitions})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < len(partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} did not reach its end in {timeout}s")
            for message in consumer.consume(500, timeout=0.5):
                error = message.error()
                if error is not None:
                    if error.code() == error._PARTITION_EOF:
                        at_end.add(message.partition())
                        continue
                    raise RuntimeError(f"reading {topic}: {error}")
                at_end.discard(message.partition())
                source, offset = message.value().decode().split(":")
                log.records[message.partition()].append((message.key(), int(source), int(offset)))
    finally:
        consumer.close()
    return log


def finish_and_read(
    bootstrap_servers: str,
    pc: ParallelConsumer,
    source: str,
    sink: str,
    partitions: Sequence[int],
    *,
    in_order: bool = True,
    timeout: float = 90,
) -> tuple[OutputLog, Statistics]:
    """Wait until ``pc`` committed every input of ``source``, close it, and check what a
    ``read_committed`` reader finds in ``sink``: each input's output exactly once (and, with
    ``in_order``, a key's outputs in the order of its inputs). Returns the outputs and the
    statistics taken before closing."""
    ends = end_offsets(bootstrap_servers, source, partitions)
    wait_until(
        lambda: committed_in_engine(pc.statistics(), ends),
        timeout=timeout,
        what="every input committed",
        show=pc.statistics,
    )
    stats = pc.statistics()
    pc.close()
    outputs = read_outputs(bootstrap_servers, sink, partitions)
    assert set(outputs.inputs) == {(p, o) for p in partitions for o in range(ends[p])}
    assert outputs.duplicates == 0
    if in_order:
        assert outputs.order_violations() == []
    return outputs, stats
