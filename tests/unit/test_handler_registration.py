"""Registering a handler: a handler that cannot take the context is refused at once, and a
closed consumer says that it is closed."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from parallel_consumer import (
    ConfigurationError,
    Lifecycle,
    ParallelConsumer,
    PollContext,
    ProducerRecord,
)
from parallel_consumer.testing.fakes import FakeCluster


@pytest.fixture
def cluster() -> FakeCluster:
    found = FakeCluster()
    found.create_topic("t")
    return found


@pytest.fixture
def new_consumer(cluster: FakeCluster) -> Iterator[Callable[[], ParallelConsumer]]:
    made: list[ParallelConsumer] = []

    def make() -> ParallelConsumer:
        pc = ParallelConsumer(
            {"bootstrap.servers": "fake:9092", "group.id": "g"},
            consumer_factory=cluster.consumer,
            producer_factory=cluster.producer,
            admin_factory=cluster.admin,
        )
        pc.subscribe("t")
        made.append(pc)
        return pc

    yield make
    for pc in made:
        pc.close(drain=False, timeout=5.0)


def _two(ctx: PollContext, extra: object) -> None: ...


def _none() -> None: ...


def _keyword_only(*, ctx: PollContext) -> None: ...


class _Method:
    def handle(self, ctx: PollContext, more: int) -> None: ...


WRONG: list[Callable[..., Any]] = [
    lambda a, b: None,
    _two,
    _none,
    _keyword_only,
    _Method().handle,
    functools.partial(_two),
]


@pytest.mark.parametrize("handler", WRONG, ids=lambda h: getattr(h, "__name__", repr(h)))
@pytest.mark.parametrize("via", ["poll", "poll_and_produce"])
def test_a_handler_that_cannot_take_the_context_is_refused_at_registration(
    new_consumer: Callable[[], ParallelConsumer], handler: Callable[..., Any], via: str
) -> None:
    # Given a consumer and a handler whose signature does not take one positional argument
    pc = new_consumer()
    # When it is registered
    # Then a TypeError names the handler's signature and what a handler takes
    with pytest.raises(TypeError, match=r"one argument, the context.*signature \("):
        getattr(pc, via)(handler)
    # And nothing started
    assert pc.lifecycle is Lifecycle.NEW


class _Callable:
    def __call__(self, ctx: PollContext) -> None: ...


def _with_default(ctx: PollContext, retries: int = 3) -> None: ...


def _any(*args: object) -> None: ...


RIGHT: list[Callable[..., Any]] = [
    lambda ctx: None,
    _with_default,
    _any,
    _Callable(),
    functools.partial(_two, extra=1),
    print,
]


@pytest.mark.parametrize("handler", RIGHT, ids=lambda h: getattr(h, "__name__", repr(h)))
def test_handlers_that_take_one_argument_are_accepted(
    new_consumer: Callable[[], ParallelConsumer], handler: Callable[..., Any]
) -> None:
    pc = new_consumer()
    pc.poll(handler)
    assert pc.lifecycle is not Lifecycle.NEW


def test_poll_and_produce_accepts_a_one_argument_handler(
    new_consumer: Callable[[], ParallelConsumer],
) -> None:
    pc = new_consumer()

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> ProducerRecord | None:
        return None

    assert pc.lifecycle is not Lifecycle.NEW


@pytest.mark.parametrize("started", [True, False])
def test_poll_after_close_says_the_consumer_is_closed(
    new_consumer: Callable[[], ParallelConsumer], started: bool
) -> None:
    # Given a consumer closed after (or before) it ran a handler
    pc = new_consumer()
    if started:
        pc.poll(lambda ctx: None)
    pc.close()
    # When a handler is registered again
    # Then the error says that the consumer is closed, not that a handler is registered
    with pytest.raises(ConfigurationError, match="closed ParallelConsumer") as raised:
        pc.poll(lambda ctx: None)
    assert "already registered" not in str(raised.value)
