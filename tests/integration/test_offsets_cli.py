"""``pc offsets`` against the real broker: groups committed by this library (a consumer stopped
mid-run) and by hand with the Java library's offset maps."""

from __future__ import annotations

import json
import pathlib
import threading
from typing import Any

import pytest
from engine_support import commit_directly, committed, wait_until

from parallel_consumer import Options, ParallelConsumer, PollContext, ProcessingOrder
from parallel_consumer.cli.main import main
from parallel_consumer.cli.offsets import incomplete_ranges
from parallel_consumer.offsets import decode_offset_map
from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = pytest.mark.timeout(120)

VECTORS = json.loads(
    (pathlib.Path(__file__).parents[1] / "compat" / "java_vectors.json").read_text()
)


def _pc_offsets(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[Any], str]:
    code = main(["offsets", *argv])
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines() if line.strip()]
    return code, rows, captured.err


def test_offsets_shows_exactly_the_records_a_stopped_consumer_left_unfinished(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a consumer whose handler never finishes offsets 3, 7 and 8 of 20
    name = topic(1)
    produce_records(kafka.bootstrap_servers, name, 20, partitions=[0])
    never = {3, 7, 8}
    release = threading.Event()
    done: set[int] = set()
    lock = threading.Lock()

    def handler(ctx: PollContext) -> None:
        if ctx.offset in never:
            release.wait(60)
            raise RuntimeError("released at the end of the test")
        with lock:
            done.add(ctx.offset)

    pc = ParallelConsumer(
        consumer_config, Options(ordering=ProcessingOrder.UNORDERED, commit_interval=0.2)
    )
    try:
        pc.subscribe(name)
        pc.poll(handler)
        wait_until(lambda: len(done) == 17, timeout=60, what="17 records done")
        # When it is stopped mid-run (the three calls are still running)
        pc.close(drain=False, timeout=1.0)
    finally:
        release.set()
    stored = committed(consumer_config, name, [0])[0]
    # Then pc offsets prints exactly that set, with the stored map's encoding and size
    code, rows, err = _pc_offsets(
        capsys,
        "--bootstrap",
        kafka.bootstrap_servers,
        "--group",
        consumer_config["group.id"],
        "--json",
    )
    assert code == 0, err
    decoded = decode_offset_map(stored[0], stored[1])
    assert decoded.encoding is not None
    assert rows == [
        {
            "topic": name,
            "partition": 0,
            "committed_offset": 3,
            "end_offset": 20,
            "lag": 17,
            "encoding": "".join(p.capitalize() for p in decoded.encoding.name.split("_")),
            # The broker stores exactly the map: the consumer commits it without the NUL
            # confluent-kafka would append (kafka/exact_commits.py).
            "metadata_bytes": len(stored[1]),
            "metadata_limit": 4096,
            "incomplete_count": 3,
            "incomplete_ranges": [[3, 3], [7, 8]],
            "highest_seen": 19,
            "decode_error": None,
        }
    ]


def test_offsets_decodes_offset_maps_written_by_the_java_library(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a group committed by hand with the Java library's maps, one per partition
    chosen = [
        "worked_example",
        "gaps_at_both_ends",
        "periodic_every_7th",
        "v2_only_70k",
        "sparse_100k",
    ]
    vectors = [next(v for v in VECTORS if v["name"] == name) for name in chosen]
    name = topic(len(vectors))
    commit_directly(
        consumer_config,
        name,
        {p: (v["base"], v["java_choice_metadata"]) for p, v in enumerate(vectors)},
    )
    # When pc offsets reads the group (every range shown)
    code, rows, err = _pc_offsets(
        capsys,
        "--bootstrap",
        kafka.bootstrap_servers,
        "--group",
        consumer_config["group.id"],
        "--topic",
        name,
        "--ranges",
        "0",
        "--json",
    )
    # Then each partition shows the set, encoding and coverage the Java library decodes
    assert code == 0, err
    assert len(rows) == len(vectors)
    for row, vector in zip(rows, vectors, strict=True):
        java = vector["encodings"][vector["java_choice"]]["java_decoded"]
        assert row["committed_offset"] == vector["base"], vector["name"]
        assert row["encoding"] == vector["java_choice"], vector["name"]
        assert row["incomplete_ranges"] == incomplete_ranges(java["incompletes"], None)
        assert row["incomplete_count"] == len(java["incompletes"]), vector["name"]
        assert row["highest_seen"] == java["highest_seen"], vector["name"]
        assert row["decode_error"] is None


def test_offsets_names_an_unknown_group_and_exits_1(
    kafka: KafkaBroker, group_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, rows, err = _pc_offsets(
        capsys, "--bootstrap", kafka.bootstrap_servers, "--group", group_id
    )
    assert code == 1
    assert rows == []
    assert f"group {group_id!r} has no committed offsets" in err


def test_offsets_table_lists_partitions_without_commits_too(
    kafka: KafkaBroker, topic: TopicFactory, group_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    name = topic(2)
    code = main(
        ["offsets", "--bootstrap", kafka.bootstrap_servers, "--group", group_id, "--topic", name]
    )
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["TOPIC", "PART", "COMMITTED"]
    assert [line.split()[:3] for line in lines[1:]] == [[name, "0", "-"], [name, "1", "-"]]
