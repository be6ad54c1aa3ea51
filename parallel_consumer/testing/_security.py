"""A secured LocalKafka: SASL/SCRAM users, a CA and certificates made at start, ACLs.

:class:`BrokerSecurity` belongs to one :class:`~parallel_consumer.testing.local_kafka.LocalKafka`
started with ``security="sasl_ssl"``, ``"sasl_plaintext"`` or ``"ssl"``. It makes the files the
broker needs (with the JDK's ``keytool``: nothing is downloaded), says which broker settings and
which ``kafka-storage format`` arguments turn security on, and manages users and ACLs through
an admin client logged in as the super user ``admin``.

The broker has two listeners: ``CLIENT`` (the secured one, also used between brokers, as the
super user) and ``CONTROLLER`` (PLAINTEXT, on a port of its own that clients are never given;
its principal ``ANONYMOUS`` is a super user, as the controller's own requests need).
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from parallel_consumer.testing._broker_process import LocalKafkaError

__all__ = ["ADMIN_USER", "SECURITY_MODES", "BrokerSecurity", "SecurityMode"]

SecurityMode = Literal["sasl_ssl", "sasl_plaintext", "ssl"]
SECURITY_MODES: tuple[SecurityMode, ...] = ("sasl_ssl", "sasl_plaintext", "ssl")

#: The super user the fixture's own admin work logs in as (and the brokers between themselves).
ADMIN_USER = "admin"
_MECHANISM = "SCRAM-SHA-512"
_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
#: keytool is a short-lived JVM: C1 only and the serial collector start it faster on 2 cores.
_QUICK_JVM = ("-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC", "-J-Xmx64m")
_DAYS = "7"
#: Seconds a grant or revoke may take to reach the broker's authorizer.
_ACL_WAIT = 30.0


class BrokerSecurity:
    """The secured listener of one local broker: its files, settings, users and ACLs."""

    def __init__(self, mode: str, folder: Path, keytool: str) -> None:
        if mode not in SECURITY_MODES:
            raise LocalKafkaError(
                f"unknown security {mode!r}: use one of {', '.join(SECURITY_MODES)} (or None)"
            )
        self.mode: SecurityMode = mode
        self._folder = folder
        self._keytool = keytool
        #: One password for every keystore this object makes (never a user's SASL password).
        self._store_password = secrets.token_urlsafe(16)
        self._passwords: dict[str, str] = {ADMIN_USER: secrets.token_urlsafe(16)}
        self._bootstrap: str | None = None

    @property
    def sasl(self) -> bool:
        return self.mode.startswith("sasl")

    @property
    def tls(self) -> bool:
        return self.mode != "sasl_plaintext"

    @property
    def ca_path(self) -> Path:
        """The CA certificate (PEM) clients trust; exists once :meth:`prepare` ran."""
        return self._folder / "ca.pem"

    # -- before the broker starts -----------------------------------------------------------

    def prepare(self) -> None:
        """Make the CA, the broker's keystore and (mTLS) the admin's certificate."""
        self._folder.mkdir(parents=True, exist_ok=True)
        if not self.tls:
            return
        self._keytool_run(
            "-genkeypair", "-alias", "ca", "-dname", "CN=pc-local-ca", "-ext", "bc:c",
            *self._new_key(), *self._store("ca.p12"),
        )  # fmt: skip
        self._keytool_run(
            "-exportcert", "-rfc", "-alias", "ca", "-file", str(self.ca_path),
            *self._store("ca.p12"),
        )  # fmt: skip
        self._signed_keystore("broker", san="ip:127.0.0.1,dns:localhost")
        if not self.sasl:
            self._signed_keystore(ADMIN_USER)

    def broker_properties(self, *, port: int, controller_port: int) -> dict[str, str]:
        """server.properties entries of the secured listener, the authorizer and super users."""
        protocol = self.mode.upper()
        props = {
            "listeners": f"CLIENT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"CLIENT://127.0.0.1:{port}",
            "listener.security.protocol.map": f"CLIENT:{protocol},CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "CLIENT",
            "authorizer.class.name": _AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN_USER};User:broker;User:ANONYMOUS",
        }
        if self.sasl:
            password = self._passwords[ADMIN_USER]
            props.update(
                {
                    "sasl.enabled.mechanisms": _MECHANISM,
                    "sasl.mechanism.inter.broker.protocol": _MECHANISM,
                    "listener.name.client.scram-sha-512.sasl.jaas.config": (
                        "org.apache.kafka.common.security.scram.ScramLoginModule required "
                        f'username="{ADMIN_USER}" password="{password}";'
                    ),
                }
            )
        if self.tls:
            props.update(
                {
                    "ssl.keystore.type": "PKCS12",
                    "ssl.keystore.location": str(self._folder / "broker.p12"),
                    "ssl.keystore.password": self._store_password,
                    "ssl.key.password": self._store_password,
                    "ssl.truststore.type": "PEM",
                    "ssl.truststore.location": str(self.ca_path),
                }
            )
        if self.mode == "ssl":
            props.update(
                {
                    "ssl.client.auth": "required",
                    # "CN=alice" -> principal "alice", so ACLs name users as with SASL.
                    "ssl.principal.mapping.rules": "RULE:^CN=([^,]*)$/$1/,DEFAULT",
                }
            )
        return props

    def format_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments: the admin's SCRAM credential, which the broker
        needs before it can log in to itself."""
        if not self.sasl:
            return []
        password = self._passwords[ADMIN_USER]
        return ["--add-scram", f"{_MECHANISM}=[name={ADMIN_USER},password={password}]"]

    def started(self, bootstrap_servers: str) -> None:
        self._bootstrap = bootstrap_servers

    # -- clients ------------------------------------------------------------------------------

    def client_config(self, bootstrap_servers: str, user: str = ADMIN_USER) -> dict[str, Any]:
        """The librdkafka settings a client of ``user`` needs (the user must exist)."""
        if user not in self._passwords:
            raise LocalKafkaError(f"no user {user!r}: create it with add_user({user!r})")
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            "security.protocol": self.mode.upper(),
        }
        if self.sasl:
            config["sasl.mechanism"] = _MECHANISM
            config["sasl.username"] = user
            config["sasl.password"] = self._passwords[user]
        if self.tls:
            config["ssl.ca.location"] = str(self.ca_path)
        if self.mode == "ssl":
            config["ssl.keystore.location"] = str(self._folder / f"{user}.p12")
            config["ssl.keystore.password"] = self._store_password
        return config

    def add_user(self, user: str, password: str | None = None) -> str:
        """Create ``user`` (SCRAM credential, or a certificate signed by the CA for mTLS) with
        no ACLs; returns its password (the keystore's with mTLS)."""
        if self.mode == "ssl":
            if user not in self._passwords:
                self._signed_keystore(user)
            self._passwords[user] = self._store_password
            return self._store_password
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        password = password or secrets.token_urlsafe(16)
        upsert = UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
        )
        self._admin_call("creating user " + repr(user), "alter_user_scram_credentials", [upsert])
        self._passwords[user] = password
        return password

    def change_acls(
        self,
        change: Literal["grant", "revoke"],
        user: str,
        resource: str,
        name: str,
        operations: Iterable[str],
        *,
        prefixed: bool = False,
    ) -> None:
        """Allow (``"grant"``), or stop allowing (``"revoke"``), ``user`` ``operations``
        (``"READ"``, ``"WRITE"``, ``"DESCRIBE"``, ...) on the ``resource`` (``"topic"``,
        ``"group"``, ``"transactional_id"``, ``"cluster"``) named ``name`` (a prefix of names
        with ``prefixed``)."""
        from confluent_kafka.admin import AclBindingFilter  # type: ignore[attr-defined]

        bindings = self._bindings(user, resource, name, operations, prefixed)
        filters = [
            AclBindingFilter(
                b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                b.permission_type,
            )
            for b in bindings
        ]  # fmt: skip
        what = f"{change} {user!r} {resource} {name!r}"
        grant = change == "grant"
        self._admin_call(
            what, "create_acls" if grant else "delete_acls", bindings if grant else filters
        )
        # The controller has it; wait until the broker's authorizer does too, so that a test's
        # next request sees the change (a refusal would stay in the client's metadata cache).
        self._wait_for_acls(what, filters, present=grant)

    def _wait_for_acls(self, what: str, filters: list[Any], *, present: bool) -> None:
        from confluent_kafka.admin import AdminClient

        assert self._bootstrap is not None
        admin = AdminClient({**self.client_config(self._bootstrap), "log_level": 3})
        deadline = time.monotonic() + _ACL_WAIT
        while True:
            found = [bool(admin.describe_acls(f, request_timeout=10).result(10)) for f in filters]
            if all(seen == present for seen in found):
                return
            if time.monotonic() > deadline:
                raise LocalKafkaError(f"{what}: the broker did not apply it within {_ACL_WAIT} s")
            time.sleep(0.05)

    # -- internals ----------------------------------------------------------------------------

    def _bindings(
        self, user: str, resource: str, name: str, operations: Iterable[str], prefixed: bool
    ) -> list[Any]:
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        try:
            restype = ResourceType[resource.upper()]
            ops = [AclOperation[op.upper()] for op in operations]
        except KeyError as exc:
            raise LocalKafkaError(f"unknown ACL resource type or operation: {exc}") from None
        pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
        return [
            AclBinding(restype, name, pattern, f"User:{user}", "*", op, AclPermissionType.ALLOW)
            for op in ops
        ]

    def _admin_call(self, what: str, method: str, arguments: list[Any]) -> None:
        from confluent_kafka.admin import AdminClient

        if self._bootstrap is None:
            raise LocalKafkaError(f"{what}: the broker is not started")
        admin = AdminClient({**self.client_config(self._bootstrap), "log_level": 3})
        try:
            futures = getattr(admin, method)(arguments, request_timeout=30)
            for future in futures.values():
                future.result(30)
        except Exception as exc:
            raise LocalKafkaError(f"{what} failed: {exc}") from exc

    def _new_key(self) -> tuple[str, ...]:
        return ("-keyalg", "EC", "-groupname", "secp256r1", "-validity", _DAYS)

    def _store(self, name: str) -> tuple[str, ...]:
        path = str(self._folder / name)
        password = self._store_password
        return ("-keystore", path, "-storetype", "PKCS12", "-storepass", password)

    def _signed_keystore(self, name: str, *, san: str | None = None) -> None:
        """``<name>.p12``: a key whose certificate (CN=name) the CA signed, with the CA in it."""
        store = self._store(f"{name}.p12")
        request, signed = self._folder / f"{name}.csr", self._folder / f"{name}.pem"
        self._keytool_run(
            "-genkeypair", "-alias", name, "-dname", f"CN={name}", *self._new_key(), *store
        )
        self._keytool_run("-certreq", "-alias", name, "-file", str(request), *store)
        self._keytool_run(
            "-gencert", "-rfc", "-alias", "ca", "-infile", str(request), "-outfile", str(signed),
            "-validity", _DAYS, *(("-ext", f"SAN={san}") if san else ()), *self._store("ca.p12"),
        )  # fmt: skip
        self._keytool_run(
            "-importcert", "-noprompt", "-alias", "ca", "-file", str(self.ca_path), *store
        )
        self._keytool_run("-importcert", "-alias", name, "-file", str(signed), *store)

    def _keytool_run(self, *arguments: str) -> None:
        argv = [self._keytool, *_QUICK_JVM, *arguments]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            shown = " ".join(a if self._store_password not in a else "***" for a in arguments[:3])
            raise LocalKafkaError(
                f"keytool {shown} ... failed (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-500:]}"
            )
