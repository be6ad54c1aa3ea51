"""Shared by the tests of runs that produce (test_produce_runs.py and
test_produce_runs_failed_*.py): input records on the fake cluster, and a controller stepped by
hand whose runner and producer only record what they are handed (the test plays the worker and
the broker)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Message
from doubles import RunTaker, stepped_controller

from parallel_consumer import Options, ProcessingOrder, ProducerRecord
from parallel_consumer._events import Release
from parallel_consumer.engine.controller import Controller
from parallel_consumer.engine.letters import DeadLetters
from parallel_consumer.testing.clock import FakeClock

WARM_UP = 3_000
TP = ("t", 0)


def produce_inputs(cluster, start: int, end: int, keys: int, partitions: int = 1) -> None:
    """Records ``start`` to ``end`` of topic ``t``: value ``i``, key ``k<i % keys>``,
    partition ``i % partitions``."""
    with cluster._cond:
        for i in range(start, end):
            cluster.produce("t", b"%d" % i, key=b"k%d" % (i % keys), partition=i % partitions)


def outputs(cluster) -> list:
    """What topic ``out`` holds, partition by partition."""
    return [m for p in cluster._logs["out"] for m in list(p)]


class FakeOutputs:
    """Records what the controller sends; the test reports deliveries."""

    transactional = False
    backlog = False

    def __init__(self) -> None:
        self.calls: list[tuple[int, list]] = []
        self.runs: list[tuple[int, list, list]] = []

    def send(self, batch, outputs) -> None:
        self.calls.append((batch, list(outputs)))

    def send_run(self, run, outputs, owners) -> None:
        self.runs.append((run, list(outputs), list(owners)))

    def pump(self) -> None:
        pass

    def close(self, *, abort: bool) -> None:
        pass


class Taker(RunTaker):
    """Takes runs (``taken``) and single calls (``singles``); runs nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.singles: list[tuple[int, object]] = []

    def submit(self, batch, context) -> None:
        self.singles.append((batch, context))

    def submit_chunk(self, calls) -> None:
        self.singles.extend(calls)

    def cancel(self, batch, error=None) -> None:
        pass


def messages(keys: str, start: int = 0) -> list:
    """Records of t[0] from offset ``start``, one per character of ``keys`` (its key)."""
    return [
        Message(topic="t", partition=0, offset=start + i, key=k.encode(), value=b"%d" % (start + i))
        for i, k in enumerate(keys)
    ]


def out(message) -> ProducerRecord:
    return ProducerRecord("out", message.value(), key=message.key())


def engine(
    ordering: ProcessingOrder = ProcessingOrder.KEY,
    hooks: Any = None,
    *,
    dead_letters: bool = False,
) -> tuple[Controller, Taker, FakeOutputs]:
    """A poll_and_produce controller stepped by hand, with t[0] assigned and calls measured
    short (records go out in runs); with ``dead_letters``, to topic ``dlq``."""
    runner = Taker()
    sent = FakeOutputs()
    options = Options(
        ordering=ordering,
        commit_interval=60,
        retry_delay=0,
        dead_letter_topic="dlq" if dead_letters else None,
    )
    extra: dict[str, Any] = {"dead_letters": DeadLetters(options, "g")} if dead_letters else {}
    controller = stepped_controller(
        FakeClock(), hooks, options=options, runner=runner, outputs=sent, **extra
    )
    controller._observe_service(1e-6)
    controller.run_once(block=False)
    return controller, runner, sent


def new_runs(runner: Taker, seen: set) -> list:
    """The runs handed out since the last look (``seen`` remembers them)."""
    found = [t for t in runner.taken if hasattr(t, "pending") and id(t) not in seen]
    seen.update(id(t) for t in found)
    return found


def released(controller: Controller) -> int:
    """Credit the controller gave back, or is about to."""
    return controller._to_release + sum(
        c.count for c in controller._poller.commands if isinstance(c, Release)
    )
