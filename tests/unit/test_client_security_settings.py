"""The security settings given once, in the consumer's configuration, reach every client the
library opens; secrets are redacted wherever a configuration is shown; ``pc`` reads them from
``--config`` and from a Kafka tools' ``--command-config`` file."""

from __future__ import annotations

import argparse

import pytest

from parallel_consumer import CommitMode, Options
from parallel_consumer._arguments import parse_properties
from parallel_consumer.cli.brokers import CommandError, add_connection_arguments, given_settings
from parallel_consumer.client_config import (
    REDACTED,
    checked_producer_config,
    connection_settings,
    hide_secrets,
    redacted,
)
from parallel_consumer.kafka.dead_letter_topics import admin_config

SECURED = {
    "bootstrap.servers": "b1:9093",
    "group.id": "orders",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "alice",
    "sasl.password": "s3cret-Pa55",
    "ssl.ca.location": "/etc/ca.pem",
    "ssl.key.password": "key-Pa55",
    "fetch.wait.max.ms": 50,
}


def test_connection_settings_are_the_brokers_and_the_security_ones_only() -> None:
    assert connection_settings(SECURED) == {
        k: v for k, v in SECURED.items() if k not in ("group.id", "fetch.wait.max.ms")
    }


def test_the_producer_and_its_admin_client_inherit_the_consumers_credentials() -> None:
    producer = checked_producer_config(None, SECURED, Options())
    for key in ("security.protocol", "sasl.mechanism", "sasl.username", "sasl.password"):
        assert producer[key] == SECURED[key]
        assert admin_config(producer)[key] == SECURED[key]
    assert "group.id" not in producer
    assert "fetch.wait.max.ms" not in producer


def test_the_transactional_producer_inherits_them_too() -> None:
    options = Options(commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER)
    producer = checked_producer_config({"transactional.id": "t"}, SECURED, options)
    assert producer["sasl.password"] == SECURED["sasl.password"]


def test_a_producer_setting_of_its_own_wins_over_the_consumers() -> None:
    own = {"sasl.username": "writer", "sasl.password": "other", "bootstrap.servers": "b2:9093"}
    producer = checked_producer_config(own, SECURED, Options())
    assert (producer["sasl.username"], producer["sasl.password"]) == ("writer", "other")
    assert producer["bootstrap.servers"] == "b2:9093"


def test_redacted_hides_every_secret_and_keeps_the_rest() -> None:
    shown = redacted(
        {
            **SECURED,
            "ssl.keystore.password": "ks",
            "ssl.key.pem": "-----BEGIN PRIVATE KEY-----",
            "sasl.oauthbearer.client.secret": "cs",
            "sasl.jaas.config": 'x password="p";',
        }
    )
    for key in (
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.key.pem",
        "sasl.oauthbearer.client.secret",
        "sasl.jaas.config",
    ):
        assert shown[key] == REDACTED
    assert shown["sasl.username"] == "alice"
    assert shown["ssl.ca.location"] == "/etc/ca.pem"


def test_hide_secrets_removes_a_secret_value_from_any_text() -> None:
    text = "login as alice with s3cret-Pa55 failed (key-Pa55)"
    assert hide_secrets(text, SECURED) == f"login as alice with {REDACTED} failed ({REDACTED})"


def test_properties_files_are_read_as_javas_properties_load_reads_them() -> None:
    text = (
        "# a comment\n! another\n\nsecurity.protocol=SASL_SSL\nsasl.mechanism : SCRAM-SHA-512\n"
        "ssl.ca.location /tmp/a\\ b.pem\nlong=one \\\n    two\nkey\\=with\\:marks=v\\u0041\n"
    )
    assert parse_properties(text) == [
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        ("ssl.ca.location", "/tmp/a b.pem"),
        ("long", "one two"),
        ("key=with:marks", "vA"),
    ]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_connection_arguments(parser)
    return parser.parse_args(["--bootstrap", "b:1", *argv])


def test_a_command_config_file_with_a_java_jaas_login_gives_librdkafkas_settings(
    tmp_path: object,
) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "client.properties"
    path.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '  username="alice" password="pa\\\\"ss";\nssl.ca.location=/etc/ca.pem\n'
    )
    settings = given_settings(_args("--command-config", str(path), "--config", "client.id=x"))
    assert settings == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "ssl.ca.location": "/etc/ca.pem",
        "client.id": "x",
        "sasl.username": "alice",
        "sasl.password": 'pa"ss',
    }


def test_config_wins_over_the_command_config_file(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "c.properties"
    path.write_text("sasl.username=file\n")
    args = _args("--command-config", str(path), "--config", "sasl.username=flag")
    assert given_settings(args)["sasl.username"] == "flag"


def test_a_java_truststore_is_refused_with_what_librdkafka_needs_instead() -> None:
    with pytest.raises(CommandError, match=r"ssl\.ca\.location"):
        given_settings(_args("--config", "ssl.truststore.location=/etc/trust.jks"))


def test_a_command_config_file_that_cannot_be_read_is_a_usage_error(tmp_path: object) -> None:
    with pytest.raises(SystemExit):
        _args("--command-config", f"{tmp_path}/missing.properties")
