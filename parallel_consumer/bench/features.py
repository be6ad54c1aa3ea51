"""Which engine features this installation has: later workloads need APIs being built now.

Each function returns None when the feature is there, else the one-line reason a row that needs
it is skipped. They look, never guess: an attribute, an enum member, or a probe on the in-memory
fake cluster.
"""

from __future__ import annotations

import functools

import parallel_consumer
from parallel_consumer import options as options_module

__all__ = [
    "async_handlers_missing",
    "poll_and_produce_missing",
    "process_runner_missing",
    "uvloop_missing",
]


@functools.cache
def poll_and_produce_missing() -> str | None:
    missing = [
        what
        for what, there in (
            (
                "ParallelConsumer.poll_and_produce",
                hasattr(parallel_consumer.ParallelConsumer, "poll_and_produce"),
            ),
            ("ProducerRecord", hasattr(parallel_consumer, "ProducerRecord")),
            (
                "CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER",
                hasattr(options_module.CommitMode, "PERIODIC_TRANSACTIONAL_PRODUCER"),
            ),
        )
        if not there
    ]
    if missing:
        return f"this parallel_consumer has no {', '.join(missing)} (poll_and_produce is coming)"
    return None


@functools.cache
def process_runner_missing() -> str | None:
    kinds = {kind.value for kind in options_module.RunnerKind}
    fields = getattr(options_module.Options, "__dataclass_fields__", {})
    if "process" not in kinds or "processes" not in fields:
        return (
            "this parallel_consumer has no process runner (Options(runner='process', processes=N))"
        )
    return None


@functools.cache
def uvloop_missing() -> str | None:
    """Rows on uvloop need ``Options.loop_factory`` and the uvloop package (the ``uvloop``
    extra)."""
    fields = getattr(options_module.Options, "__dataclass_fields__", {})
    if "loop_factory" not in fields:
        return "this parallel_consumer has no Options.loop_factory"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "uvloop is not installed (pip install -e '.[uvloop]' in a clone)"
    return None


@functools.cache
def async_handlers_missing() -> str | None:
    """Probe: register an ``async def`` handler on the in-memory fake cluster."""
    from parallel_consumer import ParallelConsumer
    from parallel_consumer.errors import ConfigurationError
    from parallel_consumer.testing import FakeCluster

    async def handler(ctx: object) -> None:
        return None

    cluster = FakeCluster()
    cluster.create_topic("probe")
    pc = ParallelConsumer(
        {"bootstrap.servers": "fake", "group.id": "probe"}, consumer_factory=cluster.consumer
    )
    try:
        pc.subscribe(["probe"])
        pc.poll(handler)
    except ConfigurationError as exc:
        return f"this parallel_consumer runs no async def handlers ({exc})".split(";")[0] + ")"
    finally:
        pc.close()
    return None
