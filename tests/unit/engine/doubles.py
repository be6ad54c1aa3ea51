"""Hand-stepped stand-ins for the controller's neighbours (no threads, no Kafka)."""

from __future__ import annotations

import threading
from typing import Any

from parallel_consumer import Options
from parallel_consumer._events import Assignment, Commit, PartitionsAssigned, PollerCommand
from parallel_consumer.context import PollContext
from parallel_consumer.engine.controller import Controller
from parallel_consumer.hooks import NoHooks
from parallel_consumer.kafka.committers import ConsumerCommitter
from parallel_consumer.runners.base import NO_FEATURES, RunnerFeatures
from parallel_consumer.status import PollerStatistics
from parallel_consumer.testing.clock import FakeClock
from parallel_consumer.work.commit_tracker import CommitAnswer


class StuckPoller:
    """A poller that does not stop (it is inside a revoke callback)."""

    def __init__(self) -> None:
        self.commands: list[PollerCommand] = []

    def send(self, command: PollerCommand) -> None:
        self.commands.append(command)
        if isinstance(command, Commit):
            command.reply.set_result(tuple(CommitAnswer(c) for c in command.offsets))

    def join(self, timeout: float) -> bool:
        return False

    def statistics(self) -> PollerStatistics:
        return PollerStatistics(0, 100, 100, 0, 0, None, None)


class IdleRunner:
    capacity = 1
    backlog = 1
    features = NO_FEATURES

    def start(self, handler: Any, done: Any) -> None:
        pass

    def submit(self, batch: int, context: PollContext) -> None:
        pass

    def cancel_queued(self) -> list[int]:
        return []

    def stop(self, timeout: float) -> bool:
        return True


class RunTaker:
    """A runner that takes runs and chunks and runs nothing (the test plays the worker)."""

    capacity = 8
    backlog = 8
    runs = True

    def __init__(self) -> None:
        self.taken: list[object] = []

    @property
    def features(self) -> RunnerFeatures:
        return RunnerFeatures(chunks=self, runs=self if self.runs else None)

    def start(self, handler: object, done: object) -> None:
        pass

    def submit(self, batch: int, context: PollContext) -> None:
        self.taken.append(context)

    def submit_chunk(self, calls: object) -> None:
        self.taken.append(calls)

    def submit_run(self, run: object) -> None:
        self.taken.append(run)

    def release_stuck(self, after: float, report: object) -> int:
        return 0

    def cancel_queued(self) -> list[int]:
        return []

    def stop(self, timeout: float) -> bool:
        return True


class ChainTaker:
    """A runner that takes chains (and single calls) and runs nothing (the test reports for
    it)."""

    capacity = 4
    backlog = 1
    runs = False

    def __init__(self) -> None:
        self.chains: list[list[tuple[int, PollContext]]] = []
        self.singles: list[tuple[int, PollContext]] = []

    @property
    def features(self) -> RunnerFeatures:
        return RunnerFeatures(chunks=self, chains=self)

    def start(self, handler: object, done: object) -> None:
        pass

    def submit(self, batch: int, context: PollContext) -> None:
        self.singles.append((batch, context))

    def submit_chunk(self, calls: object) -> None:
        raise AssertionError("no chunks here")

    def submit_chain(self, calls: list[tuple[int, PollContext]]) -> None:
        self.chains.append(list(calls))

    def take_back_chain(self, chain: int) -> tuple[list[object], list[int]]:
        return [], []

    def take_finished(self, first: int) -> list[object]:
        return []

    def release_stuck(self, after: float, report: object) -> int:
        return 0

    def cancel_queued(self) -> list[int]:
        return []

    def cancel(self, batch: int, error: BaseException | None = None) -> None:
        pass

    def stop(self, timeout: float) -> bool:
        return True


class Durations(NoHooks):
    """Hooks that keep each call's duration as ``on_work_done`` reports it."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}

    def on_work_done(self, batch: int, errors: object, duration: float) -> None:
        self.seen[batch] = duration


class BundleTaker:
    """A runner that takes single calls and chunks and runs nothing (the test reports)."""

    capacity = 4
    backlog = 1
    runs = False

    def __init__(self) -> None:
        self.singles: list[tuple[int, PollContext]] = []
        self.chunks: list[list[tuple[int, PollContext]]] = []

    @property
    def features(self) -> RunnerFeatures:
        return RunnerFeatures(chunks=self)

    def take_finished(self, first: int) -> list[object]:
        return []

    def start(self, handler: object, done: object) -> None:
        pass

    def submit(self, batch: int, context: PollContext) -> None:
        self.singles.append((batch, context))

    def submit_chunk(self, calls: list[tuple[int, PollContext]]) -> None:
        self.chunks.append(list(calls))

    def release_stuck(self, after: float, report: object) -> int:
        return 0

    def cancel_queued(self) -> list[int]:
        taken = [batch for batch, _ in self.singles]
        taken += [batch for chunk in self.chunks for batch, _ in chunk]
        self.singles.clear()
        self.chunks.clear()
        return taken

    def cancel(self, batch: int, error: BaseException | None = None) -> None:
        pass

    def stop(self, timeout: float) -> bool:
        return True


def stepped_controller(
    clock: FakeClock,
    hooks: Any = None,
    *,
    options: Options | None = None,
    runner: Any = None,
    **start: Any,
) -> Controller:
    """A started controller without its thread (step it with ``run_once``), over a
    :class:`StuckPoller` (``controller._poller``) and ``runner`` (an :class:`IdleRunner` by
    default), with t[0] assigned (epoch 1). ``start`` goes to ``Controller.start``."""
    options = options if options is not None else Options()
    poller = StuckPoller()
    controller = Controller(
        options,
        runner=runner if runner is not None else IdleRunner(),
        poller=poller,
        committer=ConsumerCommitter(poller, options.commit_mode),
        clock=clock,
        hooks=hooks,
    )
    controller.start(lambda ctx: None, thread=False, **start)
    controller.post(PartitionsAssigned((Assignment(("t", 0), 1, None, None),)))
    return controller


def blocked_partition(cluster: Any) -> tuple[Any, threading.Event, list[Any]]:
    """t[0] holds offset 0 (key a, blocks until released) and offset 1 (key b, runs at once);
    t[1] holds offset 0 (key c, runs at once). Returns the handler, its release event, and the
    RecordContexts of its calls in order."""
    cluster.create_topic("t", 2)
    cluster.produce("t", b"block", key=b"a", partition=0)
    cluster.produce("t", b"free", key=b"b", partition=0)
    cluster.produce("t", b"free", key=b"c", partition=1)
    release = threading.Event()
    calls: list[Any] = []

    def handle(ctx: Any) -> None:
        calls.append(ctx.record)
        if ctx.value == b"block" and ctx.attempts == 0:
            release.wait(30)

    return handle, release, calls
