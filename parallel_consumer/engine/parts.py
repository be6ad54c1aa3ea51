"""The engine's parts, built and wired once: each gets the parts below it that it calls
(calls go one way: rebalance and commits -> watches and overdue -> runs -> dispatch -> delivery
-> ledger). The controller holds them and routes events to them (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from parallel_consumer._clock import Clock
from parallel_consumer._events import ControllerEvent, PollerCommand
from parallel_consumer.engine.commits import Commits
from parallel_consumer.engine.delivery import Delivery
from parallel_consumer.engine.dispatch import Dispatch
from parallel_consumer.engine.ledger import Ledger
from parallel_consumer.engine.overdue import Overdue
from parallel_consumer.engine.rebalance import Rebalance
from parallel_consumer.engine.runs import RunDispatch
from parallel_consumer.engine.watches import Watches
from parallel_consumer.hooks import CallSampling, Hooks
from parallel_consumer.kafka.committers import Committer
from parallel_consumer.options import Options
from parallel_consumer.runners.base import Runner
from parallel_consumer.status import PollerStatistics

__all__ = ["Parts", "PollerPort"]


class PollerPort(Protocol):
    """What the controller needs of the poller."""

    def send(self, command: PollerCommand) -> None: ...

    def join(self, timeout: float) -> bool: ...

    def statistics(self) -> PollerStatistics: ...


@dataclass(frozen=True, slots=True)
class Parts:
    ledger: Ledger
    delivery: Delivery
    dispatch: Dispatch
    runs: RunDispatch
    overdue: Overdue
    watches: Watches
    commits: Commits
    rebalance: Rebalance

    def drained(self) -> bool:
        """Nothing polled is waiting, running, waiting for a retry or for its outputs."""
        ledger = self.ledger
        return not (
            ledger.shards.waiting
            or ledger.in_flight
            or self.runs.runs
            or ledger.retries
            or self.delivery.in_transit()
        )

    @classmethod
    def build(
        cls,
        options: Options,
        *,
        clock: Clock,
        runner: Runner,
        committer: Committer,
        hooks: Hooks,
        active: frozenset[str],
        sampling: CallSampling | None,
        post: Callable[[ControllerEvent], None],
    ) -> Parts:
        ledger = Ledger(options, clock, hooks)
        ledger.on_success = hooks.on_success if "on_success" in active else None
        delivery = Delivery(ledger, clock, options.ordering, hooks)
        dispatch = Dispatch(
            options,
            clock=clock,
            ledger=ledger,
            delivery=delivery,
            runner=runner,
            hooks=hooks,
            active=active,
            sampling=sampling,
            post=post,
        )
        runs = RunDispatch(
            options, clock=clock, ledger=ledger, delivery=delivery, dispatch=dispatch
        )
        commits = Commits(
            ledger=ledger, delivery=delivery, committer=committer, hooks=hooks, post=post
        )
        return cls(
            ledger=ledger,
            delivery=delivery,
            dispatch=dispatch,
            runs=runs,
            overdue=Overdue(
                options,
                ledger=ledger,
                delivery=delivery,
                dispatch=dispatch,
                runs=runs,
                hooks=hooks,
            ),
            watches=Watches(
                options, ledger=ledger, delivery=delivery, dispatch=dispatch, runs=runs
            ),
            commits=commits,
            rebalance=Rebalance(
                clock=clock,
                ledger=ledger,
                delivery=delivery,
                dispatch=dispatch,
                runs=runs,
                commits=commits,
                hooks=hooks,
            ),
        )
