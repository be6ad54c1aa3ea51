"""Kafka refusing a client access: which client errors mean that, and what each needs granted
(the refusals in force, which ``health()`` reports until they end, are ``work/refusals.py``).

An authentication failure (wrong password, unknown user, a certificate the brokers do not
trust) is reported by librdkafka through ``error_cb`` and retried for ever; an authorization
failure (a missing ACL) comes with the request it refused (a fetch, a group's coordinator
lookup, a produce). Neither mends itself: both need someone to change the credentials or
the ACLs, so both are said at ERROR and make ``health()`` unhealthy at once.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

__all__ = [
    "AUTHENTICATION_ERRORS",
    "AUTHORIZATION_ERRORS",
    "is_refusal",
    "what_to_grant",
]

#: The brokers did not let the client log in.
AUTHENTICATION_ERRORS = frozenset(
    {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL}
)
#: The brokers refused a request: the principal lacks an ACL (the resource it is about).
AUTHORIZATION_ERRORS = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
}


def is_refusal(code: int) -> bool:
    """Whether a client error of this code means the brokers refused access."""
    return code in AUTHENTICATION_ERRORS or code in AUTHORIZATION_ERRORS


def what_to_grant(code: int, operation: str, name: str | None = None) -> str:
    """The advice that ends an error message: what the principal lacks, or which credentials
    to check."""
    if code in AUTHENTICATION_ERRORS:
        return (
            "the brokers refused to log the client in: check security.protocol, sasl.mechanism, "
            "sasl.username and sasl.password, or the ssl.* certificate settings"
        )
    resource = AUTHORIZATION_ERRORS.get(code, "resource")
    named = f" {name!r}" if name else ""
    return (
        f"the client's principal lacks the {operation} permission on {resource}{named}: grant "
        "it with an ACL (see docs/operations.md)"
    )
