"""Kafka refusing a client access: which client errors mean that, what each needs granted,
and the refusals in force (:class:`Refusals`), which ``health()`` reports until they end.

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
    "Refusals",
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


class Refusals:
    """The refusals in force, by what was refused (a topic written to, the client's login, the
    group): set when the brokers refuse, ended when the same thing succeeds. Owned by one
    thread; other threads read :attr:`texts` (a tuple, replaced whole)."""

    def __init__(self) -> None:
        self._by_key: dict[object, str] = {}
        self.texts: tuple[str, ...] = ()

    def refused(self, key: object, text: str) -> bool:
        """Record a refusal (its latest text); True when none was in force for ``key``."""
        new = key not in self._by_key
        self._by_key[key] = text
        self.texts = tuple(self._by_key.values())
        return new

    def allowed(self, key: object) -> None:
        """``key`` succeeded: its refusal (if any) is over."""
        if self._by_key.pop(key, None) is not None:
            self.texts = tuple(self._by_key.values())

    def clear(self) -> None:
        if self._by_key:
            self._by_key.clear()
            self.texts = ()

    def __bool__(self) -> bool:
        return bool(self._by_key)
