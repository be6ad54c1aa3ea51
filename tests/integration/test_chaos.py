"""Consumer processes SIGKILLed mid-run (the short version CI runs): nothing is lost.

Three worker processes (``tests/chaos_worker.py``) consume 30,000 keyed records (300 keys, 6
partitions) in KEY order as one group; the test SIGKILLs a random one twice, each time starting a
replacement, lets the group finish, and closes the survivors gracefully. Then no record may be
lost, the group's committed offsets must equal the end of the topic, no process may have seen a
commit above a record nobody had handled yet, each process must have handled a key's records in
offset order, and the duplicates must stay within what the killed and revoked processes had
finished without a commit the broker acknowledged (the bound is explained in
``tests/chaos_harness.py``). Run with ``-s`` to see the figures; the longer version with 16 kills
is ``tests/stress/test_chaos_stress.py`` (``pytest -m stress tests/stress``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from chaos_harness import ChaosPlan, check, run_chaos

from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = [
    pytest.mark.kafka,
    # Exact high watermarks for the end-of-topic check; offset maps in the commits, as in
    # production, so that a new owner skips what a killed one finished above its committed offset.
    pytest.mark.kafka_requires("commit_metadata", "accurate_high_watermark"),
]

PLAN = ChaosPlan(records=30_000, keys=300, kills=2, concurrency=4, phase_timeout=40.0)


def test_members_killed_mid_run_lose_nothing_and_keep_key_order(
    kafka: KafkaBroker, topic: TopicFactory, group_id: str, tmp_path: Path
) -> None:
    # Given 30,000 keyed records and a group of three processes consuming them in KEY order
    name = topic(PLAN.partitions)

    # When a random member is SIGKILLed twice mid-run, and replaced each time
    report = run_chaos(kafka.bootstrap_servers, name, group_id, PLAN, tmp_path)
    print("\n" + report.summary())

    # Then nothing was lost, everything is committed, every process kept per-key order, and the
    # duplicates stay within what the killed processes had finished but not committed
    check(report)


#: Calls of milliseconds over few lanes per member: chains, and the longest lanes first.
CHAINS_PLAN = ChaosPlan(
    records=20_000, keys=6, kills=2, concurrency=4, max_sleep_ms=4.0, phase_timeout=40.0
)


def test_members_killed_while_running_chains_lose_nothing_and_keep_key_order(
    kafka: KafkaBroker, topic: TopicFactory, group_id: str, tmp_path: Path
) -> None:
    # Given 20,000 records of 6 keys (about a dozen lanes per member, 4 workers each) and calls
    # of 0-4 ms: each worker runs a lane's records in chains, the longest lanes first
    name = topic(CHAINS_PLAN.partitions)

    # When a random member is SIGKILLed twice mid-run, and replaced each time
    report = run_chaos(kafka.bootstrap_servers, name, group_id, CHAINS_PLAN, tmp_path)
    print("\n" + report.summary())

    # Then the same holds as without chains, and chains did run
    check(report)
    assert report.chains > 0
