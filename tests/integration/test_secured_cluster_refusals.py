"""A secured cluster refusing the consumer: a wrong password is a clear error within 30 s and
commits nothing; a missing ACL (the group, an output topic, the dead-letter topic) holds the
affected records uncommitted, names the permission and the resource, makes health()
unhealthy, and once granted everything goes through with nothing lost.

One SASL_SSL broker for the module; each test has a user of its own, so that its grants and
refusals touch no other test."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest
from engine_support import holds_for
from secured_support import (
    KNOWN_PASSWORD,
    committed,
    consumer_config,
    grant_app,
    new_topic,
    read_all,
    secured_broker,
    unique,
    wait_for,
)

from parallel_consumer import (
    ConfigurationError,
    Options,
    ParallelConsumer,
    PollContext,
    ProducerRecord,
)
from parallel_consumer.testing import LocalKafka, produce_records

pytestmark = [pytest.mark.kafka, pytest.mark.security]

#: Records per test, all in partition 0, keys a, b, c.
RECORDS = 20
#: The bound the issue sets for saying that the credentials are wrong.
CLEAR_ERROR_WITHIN = 30.0


@pytest.fixture(scope="module")
def secured() -> Iterator[LocalKafka]:
    yield from secured_broker()


def _source(kafka: LocalKafka) -> str:
    source = new_topic(kafka, unique("in"))
    produce_records(
        kafka.bootstrap_servers,
        source,
        RECORDS,
        keys=["a", "b", "c"],
        producer_config=kafka.client_config(),
    )
    return source


def _refused(pc: ParallelConsumer, *words: str) -> bool:
    report = pc.health()
    return not report.healthy and any(
        all(word in reason for word in words) for reason in report.reasons
    )


def test_a_wrong_password_is_a_clear_error_within_30_s_and_nothing_is_committed(
    secured: LocalKafka, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a consumer of user app with a wrong password (no dead letters: nothing to check
    # at start, so the consumer itself must say it)
    caplog.set_level(logging.ERROR, logger="parallel_consumer")
    source, group = _source(secured), unique("g")
    config = consumer_config(secured, "app", group)
    config["sasl.password"] = KNOWN_PASSWORD + "-wrong"
    handled = threading.Event()
    pc = ParallelConsumer(config, Options(commit_interval=0.1))
    pc.subscribe([source])
    began = time.monotonic()
    pc.poll(lambda ctx: handled.set())
    try:
        # When it runs: then health() says the login was refused, within 30 s
        waited = wait_for(
            lambda: _refused(pc, "Authentication failed", "sasl.password"),
            timeout=CLEAR_ERROR_WITHIN,
            what="health() to report the refused login",
            show=pc.health,
        )
        print(f"the refused login was reported after {time.monotonic() - began:.1f} s")
        assert waited < CLEAR_ERROR_WITHIN
        # And an ERROR says it (once), naming what to check
        said = [r.getMessage() for r in caplog.records if "refused access" in r.getMessage()]
        assert len(said) == 1
        assert "sasl.username and sasl.password" in said[0]
    finally:
        pc.close()
    # And nothing was handled or committed
    assert not handled.is_set()
    assert committed(secured, group, source) == {0: -1001}


def _pipeline(
    kafka: LocalKafka, user: str, source: str, out: str, dead_letters: str, group: str
) -> ParallelConsumer:
    """KEY order, outputs to ``out``, offset 4 poison (to ``dead_letters`` after 2 tries)."""
    pc = ParallelConsumer(
        consumer_config(kafka, user, group),
        Options(
            max_retries=1,
            retry_delay=0.1,
            commit_interval=0.1,
            dead_letter_topic=dead_letters,
        ),
    )
    pc.subscribe([source])

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> ProducerRecord:
        if ctx.offset == 4:
            raise ValueError("poison record")
        return ProducerRecord(out, str(ctx.offset), key=ctx.key)

    return pc


@pytest.mark.parametrize("denied", ["group", "output topic", "dead-letter topic"])
def test_a_missing_acl_holds_records_uncommitted_until_granted_and_loses_nothing(
    secured: LocalKafka, denied: str
) -> None:
    # Given a user with every ACL it needs except one: READ on its group, or WRITE on the
    # output topic or on the dead-letter topic (both outside the user's prefix; DESCRIBE on them)
    user = unique("user")
    secured.add_user(user)
    grant_app(secured, user, group=denied != "group")
    source, group = _source(secured), unique("g")
    out, dead_letters = (
        new_topic(secured, f"x-{unique('out')}"),
        new_topic(secured, f"x-{unique('dlq')}"),
    )
    for topic in (out, dead_letters):
        secured.grant(user, "topic", topic, "DESCRIBE")
    for topic, refused in ((out, "output topic"), (dead_letters, "dead-letter topic")):
        if refused != denied:
            secured.grant(user, "topic", topic, "WRITE")
    missing = {
        "group": ("group", group, "READ", "Group authorization failed"),
        "output topic": ("topic", out, "WRITE", f"WRITE permission on topic '{out}'"),
        "dead-letter topic": (
            "topic",
            dead_letters,
            "WRITE",
            f"WRITE permission on topic '{dead_letters}'",
        ),
    }[denied]
    pc = _pipeline(secured, user, source, out, dead_letters, group)
    try:
        # When it runs without it: then health() names the permission and the resource
        wait_for(
            lambda: _refused(pc, missing[3]),
            timeout=CLEAR_ERROR_WITHIN,
            what=f"health() to report the refused {denied}",
            show=pc.health,
        )
        # And the affected records stay uncommitted while it runs on
        first_affected = 4 if denied == "dead-letter topic" else 0
        holds_for(
            lambda: (
                committed(secured, group, source)[0] <= first_affected and _refused(pc, missing[3])
            ),
            seconds=2,
            what=f"no commit past offset {first_affected}, and the refusal reported",
        )
        # When the permission is granted
        resource, name = missing[0], missing[1]
        if resource == "group":
            secured.grant(user, "group", name, "READ")
        else:
            secured.grant(user, "topic", name, "WRITE")
        # Then every record is committed, and health() recovers
        waited = wait_for(
            lambda: committed(secured, group, source)[0] == RECORDS,
            timeout=60,
            what="every record committed after the grant",
            show=pc.statistics,
        )
        print(f"{denied}: everything committed {waited:.1f} s after the grant")
        wait_for(lambda: pc.health().healthy, timeout=30, what="health()", show=pc.health)
    finally:
        pc.close()
    # And nothing was lost: every output (each at least once) and the dead letter are there
    outputs = {int(m.value()) for m in read_all(secured, out)}
    assert outputs == set(range(RECORDS)) - {4}
    assert [m.value() for m in read_all(secured, dead_letters)] == [b"value-4"]


def test_with_dead_letters_a_wrong_password_stops_the_start_with_the_refused_login(
    secured: LocalKafka,
) -> None:
    # Given dead-lettering on: the dead-letter topics are checked at start, by an admin client
    config = consumer_config(secured, "app", unique("g"))
    config["sasl.password"] = KNOWN_PASSWORD + "-wrong"
    pc = ParallelConsumer(config, Options(dead_letter_topic=unique("dlq")))
    pc.subscribe([_source(secured)])
    began = time.monotonic()
    try:
        # When processing starts: then it fails at once, saying the login was refused
        with pytest.raises(ConfigurationError, match="Authentication failed") as refused:
            pc.poll(lambda ctx: None)
    finally:
        pc.close()
    took = time.monotonic() - began
    print(f"the start failed after {took:.1f} s")
    assert took < CLEAR_ERROR_WITHIN
    assert "sasl.username and sasl.password" in str(refused.value)
