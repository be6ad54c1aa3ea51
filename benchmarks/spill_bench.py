"""Records/s on a partition held by a poison record, with spilled offset maps, against the same
run without the poison record (issue #37's goal: at least 0.8x).

One partition of ``--records`` records over 500 keys, KEY order, a no-op handler; the poison
record (offset 100) has ``--later`` more records of its key at random offsets after it. Variants,
interleaved, ``--repeat`` times each (medians), on one embedded broker, each with a new group:

* ``clean``: no poison record: every record succeeds.
* ``spill``: the poison record fails for ever (retried every 50 ms); maps over 4 KB spill
  (the default).
* ``throttled``: the same with ``spill_offset_maps=False``: what the library did before (as on
  main): the partition runs only its holes once the map nears the limit; capped at ``--cap``
  seconds.

The rate is the records *not* of the poison key that finished, divided by the time from the
first handler call to the last of them (or to the cap). Memory: the peak of the engine's held
records (``statistics().held``, bounded by ``max_buffered_records``) and the process's peak RSS
growth during the run. Writes ``benchmarks/results/spill-<time>.json``.

Run: ``python benchmarks/spill_bench.py [--records 1000000 --later 5000 --repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from parallel_consumer import Options, ParallelConsumer, PollContext, ProcessingOrder
from parallel_consumer.bench.kafka_io import base_consumer_config, new_group
from parallel_consumer.testing import LocalKafka, create_topic

POISON = 100
MAX_BUFFERED = 20_000


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _produce(bootstrap: str, topic: str, records: int, later: int) -> set[int]:
    rnd = random.Random(records)
    held = {POISON, *rnd.sample(range(POISON + 1, records), later)}
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for offset in range(records):
        key = b"poison" if offset in held else b"k%d" % rnd.randrange(500)
        while True:
            try:
                producer.produce(topic, b"v", key, partition=0)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(120)
    return held


def _one(
    bootstrap: str,
    topic: str,
    variant: str,
    records: int,
    held: set[int],
    cap: float,
    commit_interval: float,
) -> dict[str, Any]:
    target = records - len(held)
    lock = threading.Lock()
    finished = 0
    first: list[float] = []
    last = [0.0]
    done = threading.Event()
    poisoned = variant != "clean"

    def handle(ctx: PollContext) -> None:
        nonlocal finished
        now = time.perf_counter()
        if not first:
            first.append(now)
        if ctx.offset in held:
            if poisoned and ctx.offset == POISON:
                raise RuntimeError("poison")
            return
        with lock:
            finished += 1
            last[0] = now
            if finished >= target:
                done.set()

    options = Options(
        ordering=ProcessingOrder.KEY,
        max_concurrency=16,
        retry_delay=0.05,
        commit_interval=commit_interval,
        max_buffered_records=MAX_BUFFERED,
        spill_offset_maps=variant != "throttled",
        stall_threshold=None,
    )
    pc = ParallelConsumer(base_consumer_config(bootstrap, new_group(f"spill-{variant}")), options)
    pc.subscribe(topic)
    rss0 = _rss_kib()
    peak_rss = rss0
    peak_held = 0
    pc.poll(handle)
    deadline = time.monotonic() + cap
    while not done.wait(0.25) and time.monotonic() < deadline:
        peak_rss = max(peak_rss, _rss_kib())
        peak_held = max(peak_held, pc.statistics().poller.held)
    stats = pc.statistics()
    status = {s.partition: s.metadata_status for s in stats.partitions}
    pc.close(drain=False, timeout=2)
    elapsed = (last[0] if done.is_set() else time.perf_counter()) - first[0]
    return {
        "variant": variant,
        "finished": finished,
        "complete": done.is_set(),
        "seconds": elapsed,
        "records_per_s": finished / elapsed,
        "peak_held": peak_held,
        "peak_rss_growth_mib": (peak_rss - rss0) / 1024,
        "metadata_status": status.get(0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--commit-interval", type=float, default=0.5)
    parser.add_argument("--later", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cap", type=float, default=60.0, help="seconds per run at most")
    parser.add_argument("--variants", default="clean,spill,throttled")
    args = parser.parse_args()
    variants = args.variants.split(",")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with LocalKafka() as kafka:
        bootstrap = kafka.bootstrap_servers
        topic = create_topic(bootstrap, "spill-bench", partitions=1)
        held = _produce(bootstrap, topic, args.records, args.later)
        # Not counted: the first run reads the topic from disk and warms the process up.
        warm = _one(bootstrap, topic, "clean", args.records, held, args.cap, args.commit_interval)
        print(f"warm-up (not counted): {json.dumps(warm)}", flush=True)
        for round_ in range(args.repeat):
            for variant in variants:
                result = _one(
                    bootstrap, topic, variant, args.records, held, args.cap, args.commit_interval
                )
                runs[variant].append(result)
                print(f"round {round_ + 1} {variant}: {json.dumps(result)}", flush=True)
    medians = {v: statistics.median(r["records_per_s"] for r in rs) for v, rs in runs.items()}
    summary: dict[str, Any] = {"median_records_per_s": medians}
    if "clean" in medians:
        for v in variants:
            if v != "clean":
                summary[f"{v}_over_clean"] = medians[v] / medians["clean"]
    print(json.dumps(summary, indent=2))
    out = Path("benchmarks/results") / f"spill-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "benchmark": "benchmarks/spill_bench.py",
                "records": args.records,
                "later_records_of_the_poison_key": args.later,
                "repeat": args.repeat,
                "cap_seconds": args.cap,
                "commit_interval": args.commit_interval,
                "summary": summary,
                "runs": runs,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
