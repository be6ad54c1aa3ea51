"""The package's public surface: ``__all__`` lists exactly the public names, and they import."""

from __future__ import annotations

import subprocess
import sys
import types

import parallel_consumer


def test_all_lists_every_public_name_and_only_those() -> None:
    # Submodules are attributes too once imported (by this or another test): not API names.
    public = {
        name
        for name in dir(parallel_consumer)
        if name.isidentifier()
        and not name.startswith("_")
        and name != "annotations"
        and not isinstance(getattr(parallel_consumer, name), types.ModuleType)
    }
    assert set(parallel_consumer.__all__) == public
    assert len(parallel_consumer.__all__) == len(set(parallel_consumer.__all__))


def test_the_engine_imports_no_opentelemetry() -> None:
    # In a fresh interpreter: OpenTelemetry is an optional extra that only hooks may use.
    code = (
        "import sys, parallel_consumer, parallel_consumer.consumer;"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
