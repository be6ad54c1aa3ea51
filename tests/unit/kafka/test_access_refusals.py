"""The brokers refusing access (kafka/access.py): a failed login or a missing ACL is said at
ERROR once with what to check or grant, makes health() unhealthy while in force, ends when
the same thing succeeds, and never exhausts a record's retries (a grant mends it)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError

from parallel_consumer import Options, RecordContext
from parallel_consumer.errors import AccessDenied
from parallel_consumer.health import health_report
from parallel_consumer.kafka.access import is_refusal, what_to_grant
from parallel_consumer.kafka.client_log import ClientLog
from parallel_consumer.kafka.delivery_reports import not_delivered
from parallel_consumer.status import Lifecycle
from parallel_consumer.work.outcomes import DeadLetterNow, RetryAt, decide
from parallel_consumer.work.refusals import Refusals


def _message(topic: str = "t") -> Any:
    """What a delivery report's message and a record context read: the topic, the rest fixed."""
    return SimpleNamespace(
        topic=lambda: topic, partition=lambda: 0, offset=lambda: 7, key=lambda: b"k"
    )


def test_login_and_acl_errors_are_refusals_and_transport_errors_are_not() -> None:
    for code in (
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ):
        assert is_refusal(code)
    assert not is_refusal(KafkaError._TRANSPORT)
    assert not is_refusal(KafkaError._ALL_BROKERS_DOWN)


def test_the_advice_names_the_permission_and_the_resource() -> None:
    text = what_to_grant(KafkaError.TOPIC_AUTHORIZATION_FAILED, "WRITE", "orders.dlq")
    assert "WRITE permission on topic 'orders.dlq'" in text
    assert "sasl.password" in what_to_grant(KafkaError._AUTHENTICATION, "READ")


def test_a_failed_login_is_an_error_once_kept_until_a_broker_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="parallel_consumer")
    routed = ClientLog("pc-1 consumer", "127.0.0.1:1")
    for attempt in range(5):
        routed.error(KafkaError(KafkaError._AUTHENTICATION, f"SASL failed (after {attempt}ms)"))

    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1
    assert "Kafka refused access: pc-1 consumer: SASL failed" in errors[0]
    assert "sasl.username and sasl.password" in errors[0]
    assert len(routed.refusals.texts) == 1
    routed.reachable()
    assert routed.refusals.texts == ()


def test_a_refusal_ends_when_the_same_thing_succeeds_and_only_then() -> None:
    refusals = Refusals()
    assert refusals.refused(("write", "a"), "a refused")
    assert not refusals.refused(("write", "a"), "a refused again")
    refusals.refused(("write", "b"), "b refused")
    refusals.allowed(("write", "a"))
    assert refusals.texts == ("b refused",)


def test_a_refused_output_is_an_access_denied_naming_its_topic() -> None:
    error = not_delivered(
        0, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"), _message("out")
    )
    assert isinstance(error, AccessDenied)
    assert error.topic == "out"
    assert "WRITE permission on topic 'out'" in str(error)


def test_an_access_denied_never_exhausts_retries_while_other_failures_do() -> None:
    options = Options(max_retries=2, dead_letter_topic="dlq")
    record = RecordContext(_message(), 50)
    assert isinstance(decide(AccessDenied("refused"), record, 0.0, options), RetryAt)
    assert isinstance(decide(ValueError(), record, 0.0, options), DeadLetterNow)


def _report(**kw: Any) -> Any:
    return health_report(
        Lifecycle.RUNNING,
        partitions=[],
        dead_letter_failures=0,
        deadline_exceeded=0,
        overrunning_calls=0,
        stall_threshold=None,
        failure=None,
        **kw,
    )


def test_health_is_unhealthy_at_once_while_a_refusal_is_in_force() -> None:
    assert _report().healthy
    refused = _report(access_refused=("pc-1 consumer: Group authorization failed",))
    assert not refused.healthy
    assert refused.reasons == ("Kafka refused access: pc-1 consumer: Group authorization failed",)
