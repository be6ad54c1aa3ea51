"""The engine's parts, built and wired once: each gets the parts below it that it calls
(calls go one way: rebalance and commits -> watches and overdue -> runs -> dispatch -> delivery
-> ledger). The controller holds them and routes events to them (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from parallel_consumer._clock import Clock
from parallel_consumer._events import ControllerEvent
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

__all__ = ["Parts"]


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
