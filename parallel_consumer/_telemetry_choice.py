"""Which telemetry a consumer reports to: the ``telemetry=`` argument of ParallelConsumer, resolved
without importing OpenTelemetry unless the application did."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from parallel_consumer.errors import ConfigurationError

if TYPE_CHECKING:
    from parallel_consumer.telemetry import Telemetry

__all__ = ["chosen_telemetry"]


def chosen_telemetry(given: Telemetry | bool | None) -> Telemetry | None:
    """``telemetry=``: a Telemetry as given, False for none, and None for the library
    convention: the global providers, if the application set any. Those live in modules it
    imported to set them; if none is imported, nothing was set and OpenTelemetry stays unloaded."""
    if given is False:
        return None
    if given is None:
        if "opentelemetry.metrics" not in sys.modules and "opentelemetry.trace" not in sys.modules:
            return None
        from parallel_consumer.telemetry import Telemetry  # optional: loaded only when in use

        return Telemetry.from_globals()
    if given is True:
        raise ConfigurationError(
            "telemetry=True: leave telemetry out to use the global OpenTelemetry providers, or "
            "pass Telemetry(...) (or False for none)"
        )
    return given
