"""Consumer processes SIGKILLed again and again (the stress version; not in CI).

``pytest -m stress tests/stress -s``: 180,000 keyed records (600 keys, 6 partitions) consumed in
KEY order by a group of three worker processes; a random member is SIGKILLed 16 times, one kill
every 6-7 s (the session timeout sets the pace), each time replaced, and about a quarter of the
kills land while the group is still rebalancing after the previous one. The same checks as the
CI version (``tests/integration/test_chaos.py``): nothing lost, committed offsets at the end of
the topic, no commit above a record not handled yet, per-key order within each process, and
duplicates within the bound explained in ``tests/chaos_harness.py``. About two minutes on a
2-core machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from chaos_harness import ChaosPlan, check, run_chaos

from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = [
    pytest.mark.stress,
    pytest.mark.kafka,
    pytest.mark.kafka_requires("commit_metadata", "accurate_high_watermark"),
]

PLAN = ChaosPlan(
    records=180_000,
    keys=600,
    kills=16,
    concurrency=4,
    kills_in_rebalance=0.25,
    phase_timeout=90.0,
)


@pytest.mark.timeout(1200)
def test_repeated_kills_lose_nothing_and_keep_key_order(
    kafka: KafkaBroker, topic: TopicFactory, group_id: str, tmp_path: Path
) -> None:
    # Given 180,000 keyed records and a group of three processes consuming them in KEY order
    name = topic(PLAN.partitions)

    # When a random member is SIGKILLed 16 times, replaced each time, some kills mid-rebalance
    report = run_chaos(kafka.bootstrap_servers, name, group_id, PLAN, tmp_path)
    print("\n" + report.summary())

    # Then nothing was lost, everything is committed, every process kept per-key order, and the
    # duplicates stay within what the killed and revoked processes had not committed
    check(report)
