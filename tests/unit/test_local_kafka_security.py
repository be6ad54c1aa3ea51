"""The settings of a secured LocalKafka (testing/_security.py), without starting a broker: the
listener, the authorizer and super users, SCRAM or certificates per mode, and what a client
gets from client_config()."""

from __future__ import annotations

from pathlib import Path

import pytest

from parallel_consumer.testing import LocalKafka, LocalKafkaError
from parallel_consumer.testing._security import ADMIN_USER, BrokerSecurity


def _security(mode: str, tmp_path: Path) -> BrokerSecurity:
    return BrokerSecurity(mode, tmp_path, keytool="keytool")


@pytest.mark.parametrize(
    ("mode", "protocol"),
    [("sasl_ssl", "SASL_SSL"), ("sasl_plaintext", "SASL_PLAINTEXT"), ("ssl", "SSL")],
)
def test_the_only_client_listener_is_the_secured_one_with_acls_enforced(
    mode: str, protocol: str, tmp_path: Path
) -> None:
    props = _security(mode, tmp_path).broker_properties(port=9093, controller_port=9094)
    assert props["advertised.listeners"] == "CLIENT://127.0.0.1:9093"
    assert props["listener.security.protocol.map"] == f"CLIENT:{protocol},CONTROLLER:PLAINTEXT"
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert f"User:{ADMIN_USER}" in props["super.users"].split(";")


def test_sasl_modes_log_the_broker_in_as_the_admin_created_at_format_time(tmp_path: Path) -> None:
    security = _security("sasl_ssl", tmp_path)
    props = security.broker_properties(port=1, controller_port=2)
    password = security.client_config("b:1")["sasl.password"]
    assert (
        f'username="admin" password="{password}"'
        in (props["listener.name.client.scram-sha-512.sasl.jaas.config"])
    )
    assert security.format_arguments() == [
        "--add-scram",
        f"SCRAM-SHA-512=[name=admin,password={password}]",
    ]


def test_mtls_requires_client_certificates_and_maps_their_cn_to_the_user(tmp_path: Path) -> None:
    security = _security("ssl", tmp_path)
    props = security.broker_properties(port=1, controller_port=2)
    assert props["ssl.client.auth"] == "required"
    assert security.format_arguments() == []
    config = security.client_config("b:1")
    assert config["ssl.keystore.location"].endswith("admin.p12")
    assert "sasl.username" not in config


def test_client_config_gives_what_a_client_needs_per_mode(tmp_path: Path) -> None:
    assert set(_security("sasl_plaintext", tmp_path).client_config("b:1")) == {
        "bootstrap.servers",
        "security.protocol",
        "sasl.mechanism",
        "sasl.username",
        "sasl.password",
    }
    assert "ssl.ca.location" in _security("sasl_ssl", tmp_path).client_config("b:1")


def test_an_unknown_user_or_mode_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LocalKafkaError, match=r"add_user\('bob'\)"):
        _security("sasl_ssl", tmp_path).client_config("b:1", "bob")
    with pytest.raises(LocalKafkaError, match="unknown security"):
        _security("kerberos", tmp_path)


def test_security_needs_the_apache_backend_and_acls_need_a_secured_broker() -> None:
    with pytest.raises(LocalKafkaError, match="apache"):
        LocalKafka(backend="tansu", security="sasl_ssl")
    with pytest.raises(LocalKafkaError, match="security"):
        LocalKafka().add_user("alice")
