"""Hooks: where metrics, tracing and operator tools attach to the engine without changing it.

The engine calls a :class:`Hooks` object at a handful of points. Controller-side hooks run on
the controller thread and must return quickly (they sit on the path of every record); runner
hooks run on the thread that runs the handler, around the call, which is where a tracing span
belongs. Every method has a no-op default in :class:`NoHooks`: subclass it and override what
you need. An exception raised by a hook is logged and ignored: a broken metrics exporter must
not stop the consumer (a hook that raises even ``SystemExit`` is only logged).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.health import PartitionStall
from parallel_consumer.work.commit_tracker import CommitAnswer, OffsetCommit
from parallel_consumer.work.item import TopicPartition

__all__ = ["CallSampling", "Hooks", "NoHooks", "StallReport", "active_hooks", "guarded"]

log = logging.getLogger("parallel_consumer")


@dataclass(frozen=True, slots=True)
class StallReport:
    """Records wait, nothing runs, and nothing is due: the engine is not making progress."""

    waiting: int
    retry_waiting: int
    in_flight: int
    paused_partitions: int
    blocked_partitions: int
    #: Seconds the engine has been in this state.
    idle_for: float


class Hooks(Protocol):
    # -- controller thread --
    def on_dispatch(self, batch: int, context: PollContext) -> None:
        """A handler call for ``context``'s records was handed to the runner."""

    def on_work_done(
        self, batch: int, errors: Sequence[BaseException | None], duration: float
    ) -> None:
        """A call ended: one outcome per record (None = succeeded); ``duration`` in seconds
        from dispatch to the end of the call."""

    def on_commit_sent(self, commits: Sequence[OffsetCommit]) -> None:
        """Offsets (with their offset maps) were handed to the committer; ``on_commit`` gets
        the broker's answer for each."""

    def on_commit(self, answers: Sequence[CommitAnswer]) -> None:
        """The broker answered a commit."""

    def on_rebalance(self, kind: str, partitions: Sequence[TopicPartition]) -> None:
        """``kind`` is ``"assigned"``, ``"revoked"`` or ``"lost"``."""

    def on_stall(self, report: StallReport) -> None:
        """The engine found itself stalled (see :class:`StallReport`); it also logs a warning."""

    # -- controller thread: one record's fate (docs/failure-handling.md#hooks) --
    def on_success(self, record: RecordContext) -> None:
        """``record`` is done after processing (its outputs acknowledged, for
        ``poll_and_produce``). Not called for skipped or dead-lettered records."""

    def on_failure(self, record: RecordContext, error: BaseException) -> None:
        """An attempt of ``record`` failed with ``error`` (every failed attempt, signals
        included); ``record.attempts`` counts this failure."""

    def on_retry(self, record: RecordContext, error: BaseException, delay: float) -> None:
        """``record`` will run again in ``delay`` seconds."""

    def on_dead_letter(
        self, record: RecordContext, error: BaseException | None, reason: str
    ) -> None:
        """``record``'s dead letter was acknowledged by the broker (``reason``: a
        ``dead_letter.Reason`` value); its offset may now commit."""

    def on_skip(self, record: RecordContext, error: BaseException | None, reason: str) -> None:
        """``record`` was given up on without a dead letter (``Skip``, or the SKIP policy)."""

    def on_partition_stall(self, stall: PartitionStall) -> None:
        """A partition made no progress for ``Options.stall_threshold`` (once per episode,
        before the ``Options.on_stall`` action); the engine also logs a warning."""

    # -- runner (the thread that calls the handler) --
    def on_call_start(self, batch: int, context: PollContext) -> None:
        """Just before the handler is called."""

    def on_call_end(self, batch: int, context: PollContext, error: BaseException | None) -> None:
        """Just after the handler returned (``error`` None) or raised."""


class NoHooks:
    """The default: every hook does nothing."""

    def on_dispatch(self, batch: int, context: PollContext) -> None:
        pass

    def on_work_done(
        self, batch: int, errors: Sequence[BaseException | None], duration: float
    ) -> None:
        pass

    def on_commit_sent(self, commits: Sequence[OffsetCommit]) -> None:
        pass

    def on_commit(self, answers: Sequence[CommitAnswer]) -> None:
        pass

    def on_rebalance(self, kind: str, partitions: Sequence[TopicPartition]) -> None:
        pass

    def on_stall(self, report: StallReport) -> None:
        pass

    def on_success(self, record: RecordContext) -> None:
        pass

    def on_failure(self, record: RecordContext, error: BaseException) -> None:
        pass

    def on_retry(self, record: RecordContext, error: BaseException, delay: float) -> None:
        pass

    def on_dead_letter(
        self, record: RecordContext, error: BaseException | None, reason: str
    ) -> None:
        pass

    def on_skip(self, record: RecordContext, error: BaseException | None, reason: str) -> None:
        pass

    def on_partition_stall(self, stall: PartitionStall) -> None:
        pass

    def on_call_start(self, batch: int, context: PollContext) -> None:
        pass

    def on_call_end(self, batch: int, context: PollContext, error: BaseException | None) -> None:
        pass


_METHODS = [name for name in vars(NoHooks) if name.startswith("on_")]


def active_hooks(hooks: object) -> frozenset[str]:
    """The hook methods ``hooks`` implements: for a :class:`NoHooks` subclass the ones it
    overrides (the engine skips the others, so a hook nobody wrote costs nothing on the path of
    a record); for any other object, every method."""
    if isinstance(hooks, EngineHooks):
        return hooks.pc_active_hooks
    if not isinstance(hooks, NoHooks):
        return frozenset(_METHODS)
    cls = type(hooks)
    return frozenset(
        name
        for name in _METHODS
        if getattr(cls, name, None) is not getattr(NoHooks, name) or name in vars(hooks)
    )


@dataclass(frozen=True, slots=True)
class CallSampling:
    """What the engine hands to metrics (``parallel_consumer.telemetry``) instead of a hook on
    every call: ``sample(records, errors, duration, periodic)`` for at most one call per
    ``interval`` seconds (``periodic`` True; None: every call) and for every call longer than
    ``slow_after`` seconds. ``records`` are the call's Kafka messages."""

    interval: float | None
    slow_after: float
    sample: Callable[[Sequence[object], Sequence[BaseException | None], float, bool], None]


class EngineHooks:
    """Base of the library's own wrappers around user hooks (``guarded``, ``combine_hooks``):
    they know which methods the objects they wrap implement."""

    pc_active_hooks: frozenset[str] = frozenset()


class _Guarded(EngineHooks):
    """Calls another Hooks object and logs (never raises) what its methods raise. Methods the
    object does not implement stay the no-ops of :class:`NoHooks`."""

    def __init__(self, inner: Hooks) -> None:
        self._inner = inner
        self.pc_active_hooks = active_hooks(inner)
        for name in _METHODS:
            if name in self.pc_active_hooks:
                setattr(self, name, self._wrap(name, getattr(inner, name)))
            else:
                setattr(self, name, getattr(_NO_HOOKS, name))

    def _wrap(self, name: str, method: Callable[..., None]) -> Callable[..., None]:
        def call(*args: object) -> None:
            try:
                method(*args)
            except BaseException:
                # Even SystemExit: a hook must never strand records in flight or stop a thread.
                log.warning("hook %s of %r failed", name, self._inner, exc_info=True)

        return call


_NO_HOOKS = NoHooks()


def guarded(hooks: Hooks | None) -> Hooks:
    """``hooks`` made safe to call from the engine; :class:`NoHooks` (the default) as is."""
    if hooks is None or type(hooks) is NoHooks:
        return NoHooks()
    missing = [name for name in _METHODS if not callable(getattr(hooks, name, None))]
    if missing:
        raise ConfigurationError(
            f"hooks={hooks!r} lacks {', '.join(missing)}: subclass parallel_consumer.NoHooks "
            "and override what you need"
        )
    return cast(Hooks, _Guarded(hooks))
