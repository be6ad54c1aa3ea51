"""Hand-stepped stand-ins for the controller's neighbours (no threads, no Kafka)."""

from __future__ import annotations

from typing import Any

from parallel_consumer._events import Commit, PollerCommand
from parallel_consumer.context import PollContext
from parallel_consumer.status import PollerStatistics
from parallel_consumer.work.commits import CommitAnswer


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

    def start(self, handler: Any, done: Any) -> None:
        pass

    def submit(self, batch: int, context: PollContext) -> None:
        pass

    def cancel_queued(self) -> list[int]:
        return []

    def stop(self, timeout: float) -> bool:
        return True
