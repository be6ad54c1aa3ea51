"""``pc dlq show`` and ``pc dlq redrive`` against the real broker.

The dead letters here are written by hand with the shared header contract; the round trip
through the engine's own dead-lettering is in ``test_dead_letters.py``.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from engine_support import committed, wait_until

from parallel_consumer import Options, ParallelConsumer, PollContext
from parallel_consumer import dead_letter as dl
from parallel_consumer.cli.main import main
from parallel_consumer.testing import produce_records, read_topic
from parallel_consumer.testing.pytest_plugin import KafkaBroker

pytestmark = pytest.mark.timeout(120)


def _write_dead_letters(
    bootstrap: str, dlq: str, original: str, n: int, *, first_offset: int = 0
) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    now = datetime.now(UTC)
    for i in range(first_offset, first_offset + n):
        headers = dl.dead_letter_headers(
            topic=original,
            partition=i % 2,
            offset=i,
            timestamp_ms=1_700_000_000_000 + i,
            attempts=4,
            error=ValueError(f"bad record {i}"),
            first_failure_at=now,
            last_failure_at=now,
            group="orders-group",
            reason=dl.Reason.DEAD_LETTER if i % 3 == 0 else dl.Reason.RETRIES_EXHAUSTED,
            original_headers=[("app", f"h{i}".encode())],
        )
        producer.produce(dlq, key=f"k{i}".encode(), value=f"v{i}".encode(), headers=headers)
    assert producer.flush(30) == 0


def _pc(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _read_with_headers(bootstrap: str, topic: str) -> list[Message]:
    """Every record of ``topic`` (all partitions, from the start to the end), headers included."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.partition.eof": True}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending, out = set(partitions), []
        deadline = time.monotonic() + 30
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(100, 0.2):
                error = message.error()
                if error is None:
                    out.append(message)
                elif error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(message.partition())
        assert not pending, f"could not read {topic} to its end"
        return out
    finally:
        consumer.close()


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        answers = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 10)
        return {a.partition: a.offset for a in answers}
    finally:
        consumer.close()


def test_show_lists_each_dead_letter_with_its_failure(
    kafka: KafkaBroker, topic: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Given six dead letters of topic "orders-x" in a two-partition dead-letter topic
    dlq = topic(2)
    _write_dead_letters(kafka.bootstrap_servers, dlq, "orders-x", 6)

    # When they are shown as a table and as JSON
    code, table, table_err = _pc(
        "dlq", "show", dlq, "--bootstrap", kafka.bootstrap_servers, capsys=capsys
    )
    assert code == 0, table_err
    code, lines, err = _pc(
        "dlq", "show", dlq, "--bootstrap", kafka.bootstrap_servers, "--json", capsys=capsys
    )
    assert code == 0, err

    # Then every record is there with its original place, attempts, reason and error
    rows = [json.loads(line) for line in lines.splitlines()]
    assert sorted(r["original_offset"] for r in rows) == list(range(6))
    for row in rows:
        i = row["original_offset"]
        assert row["dead_letter"] is True
        assert row["original_topic"] == "orders-x"
        assert row["original_partition"] == i % 2
        assert row["attempts"] == 4
        assert row["error_type"] == "builtins.ValueError"
        assert row["error_message"] == f"bad record {i}"
        assert row["key"] == f"k{i}"
        assert row["reason"] == ("dead-letter" if i % 3 == 0 else "retries-exhausted")
    assert table.splitlines()[0].split()[:4] == ["AT", "ORIGINAL", "ATT", "REASON"]
    assert len(table.splitlines()) == 7
    assert "ValueError: bad record 5" in table
    assert "6 record(s)" in table_err


def test_show_filters_on_headers_and_stops_at_the_limit(
    kafka: KafkaBroker, topic: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    dlq = topic(1)
    _write_dead_letters(kafka.bootstrap_servers, dlq, "orders-x", 9)
    code, lines, _ = _pc(
        "dlq", "show", dlq, "--bootstrap", kafka.bootstrap_servers, "--json",
        "--filter", "reason=dead-letter", capsys=capsys,
    )  # fmt: skip
    assert code == 0
    assert [json.loads(x)["original_offset"] for x in lines.splitlines()] == [0, 3, 6]
    code, lines, _ = _pc(
        "dlq", "show", dlq, "--bootstrap", kafka.bootstrap_servers, "--json",
        "--filter", "app=h4", capsys=capsys,
    )  # fmt: skip
    assert [json.loads(x)["original_offset"] for x in lines.splitlines()] == [4]
    code, lines, _ = _pc(
        "dlq", "show", dlq, "--bootstrap", kafka.bootstrap_servers, "--json", "--limit", "2",
        capsys=capsys,
    )  # fmt: skip
    assert len(lines.splitlines()) == 2


def test_show_names_a_missing_topic(kafka: KafkaBroker, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _pc(
        "dlq", "show", "no-such-topic-pc", "--bootstrap", kafka.bootstrap_servers, capsys=capsys
    )
    assert code == 1
    assert "no-such-topic-pc" in err


def test_redrive_sends_each_record_back_once_and_keeps_its_progress(
    kafka: KafkaBroker, topic: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Given four dead letters of a two-partition topic
    bootstrap = kafka.bootstrap_servers
    original, dlq = topic(2), topic(2)
    _write_dead_letters(bootstrap, dlq, original, 4)

    # When they are redriven, twice, then two more arrive and a third redrive runs
    code, _, err = _pc("dlq", "redrive", "--from", dlq, "--bootstrap", bootstrap, capsys=capsys)
    assert code == 0, err
    assert "redrove 4 record(s)" in err
    code, _, err = _pc("dlq", "redrive", "--from", dlq, "--bootstrap", bootstrap, capsys=capsys)
    assert "redrove 0 record(s)" in err
    _write_dead_letters(bootstrap, dlq, original, 2, first_offset=4)
    code, _, err = _pc("dlq", "redrive", "--from", dlq, "--bootstrap", bootstrap, capsys=capsys)
    assert "redrove 2 record(s)" in err

    # Then the original topic holds each record once, in its original partition, with its own
    # headers, without the dead-letter headers, and with the redrive audit
    copies = _read_with_headers(bootstrap, original)
    keys = sorted(m.key() for m in copies)
    assert keys == [f"k{i}".encode() for i in range(6)]
    for record in copies:
        key = record.key()
        assert isinstance(key, bytes)
        i = int(key[1:])
        assert record.partition() == i % 2
        assert record.value() == f"v{i}".encode()
        pairs = cast(list[tuple[str, bytes]], record.headers())
        headers = dict(pairs)
        assert headers["app"] == f"h{i}".encode()
        assert not [k for k, _ in pairs if k.startswith(dl.DLQ_PREFIX)]
        assert headers[dl.REDRIVE_COUNT] == b"1"
        assert headers[dl.REDRIVE_FROM].decode().startswith(f"{dlq}/")
        assert datetime.fromisoformat(headers[dl.REDRIVE_AT].decode().replace("Z", "+00:00"))
    # and the group kept its place at the end of the dead-letter topic
    ends = {r.partition: r.offset + 1 for r in read_topic(bootstrap, dlq)}
    assert _committed(bootstrap, f"pc-dlq-redrive.{dlq}", dlq, 2) == ends


def test_redrive_to_another_topic_with_a_filter(
    kafka: KafkaBroker, topic: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    bootstrap = kafka.bootstrap_servers
    dlq, retry = topic(1), topic(3)
    _write_dead_letters(bootstrap, dlq, "elsewhere", 6)
    code, _, err = _pc(
        "dlq", "redrive", "--from", dlq, "--to", retry, "--bootstrap", bootstrap,
        "--filter", "reason=retries-exhausted", capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    assert "redrove 4 record(s)" in err
    assert "passed over 2" in err
    assert sorted(r.key for r in read_topic(bootstrap, retry)) == [b"k1", b"k2", b"k4", b"k5"]


def test_dry_run_sends_and_commits_nothing(
    kafka: KafkaBroker, topic: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    bootstrap = kafka.bootstrap_servers
    original, dlq = topic(2), topic(1)
    _write_dead_letters(bootstrap, dlq, original, 3)
    code, out, err = _pc(
        "dlq", "redrive", "--from", dlq, "--bootstrap", bootstrap, "--dry-run", "--json",
        capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    assert [json.loads(line)["to"] for line in out.splitlines()] == [original] * 3
    assert "would redrive 3" in err
    assert read_topic(bootstrap, original) == []
    assert _committed(bootstrap, f"pc-dlq-redrive.{dlq}", dlq, 1) == {0: -1001}


def test_a_failed_redrive_commits_nothing_and_the_next_run_sends_everything(
    kafka: KafkaBroker, topic: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Given dead letters and a destination the broker refuses (no such topic, no auto-create)
    bootstrap = kafka.bootstrap_servers
    dlq, original = topic(1), topic(1)
    _write_dead_letters(bootstrap, dlq, original, 3)
    code, _, err = _pc(
        "dlq", "redrive", "--from", dlq, "--to", "pc-missing-topic-redrive",
        "--bootstrap", bootstrap, "--config", "message.timeout.ms=3000", capsys=capsys,
    )  # fmt: skip
    # Then it fails, saying nothing was committed
    assert code == 1
    assert "nothing was committed" in err
    # and a later redrive to the right place sends all three
    code, _, err = _pc("dlq", "redrive", "--from", dlq, "--bootstrap", bootstrap, capsys=capsys)
    assert code == 0, err
    assert "redrove 3 record(s)" in err
    assert len(read_topic(bootstrap, original)) == 3


def test_bad_arguments_are_refused_with_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["dlq", "show", "t", "--bootstrap", "x:1", "--filter", "novalue"])
    assert exc.value.code == 2
    assert "expected header=value" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["dlq", "redrive", "--bootstrap", "x:1"])
    assert "--from" in capsys.readouterr().err


def test_the_json_of_show_is_parsable_by_scripts(
    kafka: KafkaBroker, topic: Callable[..., str]
) -> None:
    # run() writes to the stream it is given: scripts can call it in-process too
    import argparse

    from parallel_consumer.cli import dlq as dlq_cli

    dlq = topic(1)
    _write_dead_letters(kafka.bootstrap_servers, dlq, "o", 2)
    parser = argparse.ArgumentParser()
    dlq_cli.add_parser(parser.add_subparsers(dest="command"))
    out = io.StringIO()
    args = parser.parse_args(["dlq", "show", dlq, "--bootstrap", kafka.bootstrap_servers, "--json"])
    assert dlq_cli.run(args, out) == 0
    assert [json.loads(x)["original_offset"] for x in out.getvalue().splitlines()] == [0, 1]


def test_round_trip_dead_lettered_by_the_engine_then_redriven_runs_each_record_once(
    kafka: KafkaBroker,
    topic: Callable[..., str],
    consumer_config: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given 120 keyed records; while a downstream is "broken", every 10th record fails with a
    # non-retryable error and is dead-lettered by the engine
    bootstrap = kafka.bootstrap_servers
    source = topic(2)
    produce_records(bootstrap, source, 120, keys=[f"k{i}" for i in range(12)])
    broken = threading.Event()
    broken.set()
    lock = threading.Lock()
    succeeded: Counter[bytes] = Counter()
    redriven_headers: dict[bytes, dict[str, bytes]] = {}

    def handle(ctx: PollContext) -> None:
        value = ctx.value
        assert value is not None
        if broken.is_set() and int(value.split(b"-")[1]) % 10 == 0:
            raise LookupError(f"downstream down for {value!r}")
        with lock:
            succeeded[value] += 1
            if any(k == dl.REDRIVE_COUNT for k, _ in ctx.headers):
                redriven_headers[value] = {k: v or b"" for k, v in ctx.headers}

    options = Options(non_retryable=(LookupError,), commit_interval=0.2)
    first = ParallelConsumer(dict(consumer_config), options)
    try:
        first.subscribe([source])
        first.poll(handle)
        wait_until(
            lambda: (
                first.statistics().records_succeeded + first.statistics().records_dead_lettered
                >= 120
            ),
            timeout=60,
            what="every record handled or dead-lettered",
        )
    finally:
        first.close()
    dlq = dl.default_topic(source)
    bad = {f"value-{i}".encode() for i in range(0, 120, 10)}
    assert {letter.value for letter in read_topic(bootstrap, dlq)} == bad

    # When the downstream is fixed and the dead letters are redriven, twice
    broken.clear()
    code, _, err = _pc("dlq", "redrive", "--from", dlq, "--bootstrap", bootstrap, capsys=capsys)
    assert code == 0, err
    assert "redrove 12 record(s)" in err
    code, _, err = _pc("dlq", "redrive", "--from", dlq, "--bootstrap", bootstrap, capsys=capsys)
    assert "redrove 0 record(s)" in err

    # Then a consumer of the same group runs each redriven record once, successfully, and
    # every record of the topic has succeeded exactly once over both runs
    second = ParallelConsumer(dict(consumer_config), options)
    try:
        second.subscribe([source])
        second.poll(handle)
        wait_until(
            lambda: len(succeeded) == 120,
            timeout=60,
            what="the redriven records to be handled",
        )
        ends = {r.partition: r.offset + 1 for r in read_topic(bootstrap, source)}
        wait_until(
            lambda: all(
                # At or past its last record: the redriven copies came in a transaction, and
                # the commit moves past its marker too.
                committed(consumer_config, source, [p])[p][0] >= end
                for p, end in ends.items()
            ),
            timeout=60,
            what="the group's commits to reach the end",
        )
    finally:
        second.close()
    assert set(succeeded.values()) == {1}
    assert set(redriven_headers) == bad
    for headers in redriven_headers.values():
        assert headers[dl.REDRIVE_COUNT] == b"1"
        assert headers[dl.REDRIVE_FROM].startswith(f"{dlq}/".encode())
        assert not [k for k in headers if k.startswith(dl.DLQ_PREFIX)]
    assert len(read_topic(bootstrap, dlq)) == 12  # nothing dead-lettered a second time


def test_show_matches_the_bare_error_class_name_and_shows_values(
    kafka: KafkaBroker, topic: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Given six dead letters whose error.type header is builtins.ValueError
    dlq = topic(1)
    _write_dead_letters(kafka.bootstrap_servers, dlq, "orders-x", 6)
    # When they are filtered by the class name alone, values shown
    code, lines, err = _pc(
        "dlq", "show", dlq, "--bootstrap", kafka.bootstrap_servers, "--json", "--show-value",
        "--filter", "error.type=ValueError", capsys=capsys,
    )  # fmt: skip
    # Then all six match, each with its value
    assert code == 0, err
    rows = [json.loads(line) for line in lines.splitlines()]
    assert [(r["original_offset"], r["value"]) for r in rows] == [(i, f"v{i}") for i in range(6)]
    # And another class name matches none, and the table has a VALUE column
    code, table, err = _pc(
        "dlq", "show", dlq, "--bootstrap", kafka.bootstrap_servers, "--show-value",
        "--filter", "error.type=KeyError", capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    assert "0 record(s)" in err
    assert "0 of 6 matched" in err
    code, table, err = _pc(
        "dlq", "show", dlq, "--bootstrap", kafka.bootstrap_servers, "--show-value", capsys=capsys
    )
    assert table.splitlines()[0].split()[-1] == "VALUE"
    assert table.splitlines()[1].split()[-1] == "v0"


def test_a_filtered_redrive_counts_its_matches_and_warns_in_the_default_group(
    kafka: KafkaBroker, topic: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Given twelve dead letters, four of them with reason dead-letter
    bootstrap = kafka.bootstrap_servers
    dlq, retry = topic(1), topic(1)
    _write_dead_letters(bootstrap, dlq, "elsewhere", 12)
    # When a filtered redrive runs in its own group
    code, _, err = _pc(
        "dlq", "redrive", "--from", dlq, "--to", retry, "--bootstrap", bootstrap,
        "--filter", "reason=dead-letter", "--group", f"{dlq}-mine", capsys=capsys,
    )  # fmt: skip
    # Then it says how many matched, and does not warn
    assert code == 0, err
    assert "redrove 4 record(s)" in err
    assert "4 of 12 matched" in err
    assert "warning" not in err
    # When the same filter runs in the default group
    code, _, err = _pc(
        "dlq", "redrive", "--from", dlq, "--to", retry, "--bootstrap", bootstrap,
        "--filter", "reason=dead-letter", capsys=capsys,
    )  # fmt: skip
    # Then it warns that the other records are passed over for good there
    assert code == 0, err
    assert "warning" in err
    assert "passed for good" in err
    assert "--group" in err
