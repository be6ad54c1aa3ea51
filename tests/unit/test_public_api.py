"""The package's public surface: ``__all__`` lists exactly the public names, and they import."""

from __future__ import annotations

import subprocess
import sys

import parallel_consumer


def test_all_lists_every_public_name_and_only_those() -> None:
    public = {
        name
        for name in dir(parallel_consumer)
        if name.isidentifier() and not name.startswith("_") and name != "annotations"
    }
    modules = {
        "commit",
        "consumer",
        "context",
        "errors",
        "hooks",
        "offsets",
        "options",
        "retry",
        "runners",
        "status",
        "work",
        "testing",
    }
    assert set(parallel_consumer.__all__) == public - modules
    assert len(parallel_consumer.__all__) == len(set(parallel_consumer.__all__))


def test_the_engine_imports_no_opentelemetry() -> None:
    # In a fresh interpreter: OpenTelemetry is an optional extra that only hooks may use.
    code = (
        "import sys, parallel_consumer, parallel_consumer.consumer;"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
