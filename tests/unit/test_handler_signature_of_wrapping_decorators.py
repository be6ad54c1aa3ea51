"""A decorator made with ``functools.wraps`` whose wrapper takes the context but calls a
function that takes more (dependency injection) is a valid handler: what runs is the wrapper."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from parallel_consumer import Lifecycle, ParallelConsumer, PollContext
from parallel_consumer.testing.fakes import FakeCluster


@pytest.fixture
def new_consumer() -> Iterator[Callable[[], ParallelConsumer]]:
    cluster = FakeCluster()
    cluster.create_topic("t")
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


def with_database(function: Callable[[PollContext, Any], None]) -> Callable[[PollContext], None]:
    """Injects a dependency: the wrapper takes the context only."""

    @functools.wraps(function)
    def wrapper(ctx: PollContext) -> None:
        function(ctx, "db")

    return wrapper


def test_a_wraps_decorator_that_injects_an_argument_is_accepted(
    new_consumer: Callable[[], ParallelConsumer],
) -> None:
    # Given a handler that takes (ctx, db), wrapped by a decorator whose wrapper takes ctx
    @with_database
    def handle(ctx: PollContext, db: Any) -> None: ...

    handle(PollContext([]))  # the wrapper itself is callable with the context alone
    pc = new_consumer()
    # When it is registered, Then it is accepted (the wrapper is what runs)
    pc.poll(handle)
    assert pc.lifecycle is not Lifecycle.NEW
