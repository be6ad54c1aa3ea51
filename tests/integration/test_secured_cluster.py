"""The library on a SASL_SSL cluster with ACLs, credentials given once in the consumer's
configuration: the group consumer, outputs, dead letters (and the admin client that checks
their topic), exactly-once, the exact committed-offset reader, ``pc offsets`` and ``pc dlq``.
And no secret in anything a run printed or returned.

One broker for the module (about 6 s to start, with its CA made by keytool)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from secured_support import (
    KNOWN_PASSWORD,
    committed,
    consumer_config,
    new_topic,
    read_all,
    secured_broker,
    unique,
    wait_for,
)

from parallel_consumer import (
    CommitMode,
    ConfigurationError,
    Options,
    ParallelConsumer,
    PollContext,
    ProducerRecord,
)
from parallel_consumer.kafka.committed_reader import CommittedReader
from parallel_consumer.testing import LocalKafka, produce_records

pytestmark = [pytest.mark.kafka, pytest.mark.security]


@pytest.fixture(scope="module")
def secured() -> Iterator[LocalKafka]:
    yield from secured_broker()


def _source(kafka: LocalKafka, records: int) -> str:
    """A fresh topic of two partitions, ``records`` records in partition 0 (keys a, b, c)."""
    source = new_topic(kafka, unique("in"), 2)
    produce_records(
        kafka.bootstrap_servers,
        source,
        records,
        keys=["a", "b", "c"],
        partitions=[0],
        producer_config=kafka.client_config(),
    )
    return source


def _pipeline(
    kafka: LocalKafka, *, records: int = 30, poison: int | None = 5, **options: Any
) -> tuple[ParallelConsumer, str, str, str]:
    """A poll_and_produce consumer of user ``app`` on a fresh topic, started; the record at
    offset ``poison`` always fails (it is dead-lettered)."""
    source, out, group = _source(kafka, records), unique("out"), unique("g")
    new_topic(kafka, out, 2)
    pc = ParallelConsumer(
        consumer_config(kafka, "app", group),
        Options(max_retries=1, retry_delay=0.05, commit_interval=0.1, **options),
    )
    pc.subscribe([source])

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> ProducerRecord:
        if ctx.offset == poison:
            raise ValueError("poison record")
        return ProducerRecord(out, f"{ctx.partition}:{ctx.offset}", key=ctx.key)

    return pc, source, out, group


def test_outputs_and_dead_letters_work_with_credentials_given_once(secured: LocalKafka) -> None:
    # Given a consumer whose only credentials are in its consumer_config, dead-lettering on
    pc, source, out, group = _pipeline(secured)
    try:
        # When it has processed 30 records, one of them poison
        wait_for(
            lambda: committed(secured, group, source, 2)[0] == 30,
            timeout=60,
            what="every record committed",
            show=pc.statistics,
        )
        assert pc.health().healthy, pc.health().reasons
    finally:
        pc.close()
    # Then the outputs, the dead letter (in '<topic>.dlq', created at start) are there
    assert sorted(m.value() for m in read_all(secured, out)) == sorted(
        f"0:{i}".encode() for i in range(30) if i != 5
    )
    letters = read_all(secured, f"{source}.dlq")
    assert [(m.key(), m.value()) for m in letters] == [(b"c", b"value-5")]


def test_exactly_once_works_with_credentials_given_once(secured: LocalKafka) -> None:
    # Given the transactional mode, the transactional id prefix the only producer setting
    source, out, group = unique("in"), unique("out"), unique("g")
    new_topic(secured, source)
    new_topic(secured, out)
    produce_records(
        secured.bootstrap_servers,
        source,
        40,
        keys=["a", "b"],
        producer_config=secured.client_config(),
    )
    pc = ParallelConsumer(
        consumer_config(secured, "app", group),
        Options(commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER, commit_interval=0.1),
        producer_config={"transactional.id": unique("tx")},
    )
    pc.subscribe([source])

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> ProducerRecord:
        return ProducerRecord(out, str(ctx.offset), key=ctx.key)

    try:
        wait_for(
            lambda: committed(secured, group, source)[0] == 40,
            timeout=60,
            what="every record committed in a transaction",
            show=pc.statistics,
        )
    finally:
        pc.close()
    # Then a read_committed reader sees each output exactly once
    assert sorted(int(m.value()) for m in read_all(secured, out)) == list(range(40))


def test_the_exact_committed_reader_reads_with_the_consumers_credentials(
    secured: LocalKafka,
) -> None:
    # Given a commit with metadata by user app
    source, group = new_topic(secured, unique("in")), unique("g")
    config = consumer_config(secured, "app", group, **{"enable.auto.commit": False})
    committer = Consumer(config)
    try:
        committer.commit(offsets=[TopicPartition(source, 0, 7, "map-bytes")], asynchronous=False)
    finally:
        committer.close()
    # When the exact reader reads it with the same configuration
    reader = CommittedReader(config, name="test")
    try:
        answer = reader.read([(source, 0)], 30)
    finally:
        reader.close()
    # Then it answers (not None: no fallback), with the exact metadata: confluent-kafka's
    # commit stored a NUL after the string, which only the exact reader shows
    assert reader.unavailable is None
    assert answer == {(source, 0): (7, "map-bytes\x00")}


def _pc(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "parallel_consumer.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def _command_config(kafka: LocalKafka, tmp_path: Path, password: str = KNOWN_PASSWORD) -> Path:
    """The user's settings as the Kafka tools take them (a Java JAAS login included)."""
    path = tmp_path / "client.properties"
    path.write_text(
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        f'    username="app" password="{password}";\n'
        f"ssl.ca.location={kafka.client_config()['ssl.ca.location']}\n"
    )
    return path


def test_pc_offsets_and_pc_dlq_work_with_a_command_config_file(
    secured: LocalKafka, tmp_path: Path
) -> None:
    # Given a group that committed, and a dead letter, written by the library
    pc, source, _, group = _pipeline(secured, records=10)
    try:
        wait_for(lambda: committed(secured, group, source, 2)[0] == 10, timeout=60, what="commits")
    finally:
        pc.close()
    settings = _command_config(secured, tmp_path)
    bootstrap = ["--bootstrap", secured.bootstrap_servers, "--command-config", str(settings)]
    # When pc offsets and pc dlq show run with the same settings, once each
    offsets = _pc("offsets", *bootstrap, "--group", group, "--json")
    shown = _pc("dlq", "show", f"{source}.dlq", *bootstrap, "--json")
    # Then both answer, and neither printed the password
    assert offsets.returncode == 0, offsets.stderr
    assert f'"topic": "{source}"' in offsets.stdout
    assert '"committed_offset": 10' in offsets.stdout
    assert shown.returncode == 0, shown.stderr
    assert [json.loads(line)["original_offset"] for line in shown.stdout.splitlines()] == [5]
    for run in (offsets, shown):
        assert KNOWN_PASSWORD not in run.stdout + run.stderr


def test_no_secret_appears_in_logs_health_statistics_tracebacks_or_dead_letters(
    secured: LocalKafka,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Given everything logged (librdkafka's security and broker debug lines too)
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    source, group = _source(secured, 10), unique("g")
    config = consumer_config(secured, "app", group, debug="security,broker,protocol")
    pc = ParallelConsumer(config, Options(max_retries=0, retry_delay=0.05, commit_interval=0.1))
    pc.subscribe([source])
    done = threading.Event()

    @pc.poll
    def handle(ctx: PollContext) -> None:
        if ctx.offset == 5:
            raise ValueError("poison record")
        if ctx.offset == 9:
            done.set()

    try:
        wait_for(done.is_set, timeout=60, what="the records handled", show=pc.statistics)
        wait_for(lambda: pc.statistics().records_dead_lettered == 1, timeout=60, what="letter")
        seen += [repr(pc.health()), repr(pc.statistics()), repr(Options(name="secrets"))]
    finally:
        pc.close()
    # And the dead letters' headers, and the error of a consumer that cannot log in
    for message in read_all(secured, f"{source}.dlq"):
        seen += [f"{k}={v!r}" for k, v in message.headers() or ()]
    wrong = {**config, "sasl.password": KNOWN_PASSWORD + "-wrong"}
    del wrong["debug"]
    bad = ParallelConsumer(wrong, Options(dead_letter_topic=f"{source}.dlq"))
    bad.subscribe([source])
    try:
        with pytest.raises(ConfigurationError) as refused:
            bad.poll(lambda ctx: None)
    finally:
        bad.close()
    seen.append("".join(traceback.format_exception(refused.value)))
    assert "Authentication failed" in seen[-1]
    # And pc with a wrong password on its command line, and with --verbose
    cli = _pc(
        "--verbose", "offsets", "--bootstrap", secured.bootstrap_servers, "--group", group,
        "--command-config", str(_command_config(secured, tmp_path, KNOWN_PASSWORD + "-wrong")),
        "--timeout", "5",
    )  # fmt: skip
    assert cli.returncode != 0
    seen += [cli.stdout, cli.stderr]
    captured = capfd.readouterr()
    seen += [captured.out, captured.err]
    seen += [record.getMessage() for record in caplog.records]
    seen += [str(record.exc_text or "") for record in caplog.records]
    # Then the password is in none of it (and librdkafka's security lines were captured)
    assert any("SASL" in text for text in seen), "the debug lines were not captured"
    leaks = [text[:300] for text in seen if KNOWN_PASSWORD in text]
    assert leaks == []
