"""Suite-wide checks: every test leaves no thread and no broker behind; hypothesis profiles.

The ``kafka``, ``topic``, ``group_id`` and ``consumer_config`` fixtures come from the package's
pytest plugin (``parallel_consumer.testing.pytest_plugin``), the same one users get.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from parallel_consumer.testing import running_instances

# "ci": no deadline, because on a shared 2-core machine (other jobs, a broker JVM) one slow example
# says nothing about the code; randomized, so every run explores new inputs, with print_blob so a
# failure in CI can be replayed locally with @reproduce_failure. "dev" is the same, but lighter.
settings.register_profile(
    "ci",
    deadline=None,
    max_examples=200,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=50, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

_THREAD_GRACE_SECONDS = 2.0


def _pooled(thread: threading.Thread) -> bool:
    """py4j's callback connections (Spark calling back into Python, e.g. foreachBatch) are
    pooled for the whole SparkSession, like the session itself: not a test's leak."""
    target = getattr(thread, "_target", None)
    return str(getattr(target, "__module__", "")).startswith("py4j.")


def _describe(threads: set[threading.Thread]) -> str:
    return ", ".join(sorted(f"{t.name!r} (daemon={t.daemon})" for t in threads))


@pytest.fixture(autouse=True)
def _no_leaked_threads_or_brokers() -> Iterator[None]:
    """Fail a test that leaves a Python thread running or a LocalKafka started.

    Only Python threads are visible here; librdkafka's native threads are not in
    ``threading.enumerate()``, so none need ignoring. Session fixtures (the shared ``kafka``
    broker) are set up before this function-scoped fixture, so they count as "before".
    """
    threads_before = set(threading.enumerate())
    brokers_before = set(running_instances())
    yield
    leaked_brokers = set(running_instances()) - brokers_before
    for broker in leaked_brokers:
        broker.stop()  # stop it anyway, so one leak does not cascade into every later test
    deadline = time.monotonic() + _THREAD_GRACE_SECONDS
    leaked_threads = {
        t for t in set(threading.enumerate()) - threads_before if t.is_alive() and not _pooled(t)
    }
    while leaked_threads and time.monotonic() < deadline:
        time.sleep(0.05)
        leaked_threads = {t for t in leaked_threads if t.is_alive()}
    problems = []
    if leaked_brokers:
        problems.append(f"LocalKafka instance(s) not stopped: {sorted(map(repr, leaked_brokers))}")
    if leaked_threads:
        problems.append(
            f"thread(s) still running {_THREAD_GRACE_SECONDS:.0f} s after the test: "
            f"{_describe(leaked_threads)}"
        )
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)
