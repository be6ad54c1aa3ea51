"""Calls handed to one worker together, as the controller keeps count of them: chains and
bundles (docs/performance.md#chains, docs/performance.md#bundles).

A chain is consecutive records of one lane handed to one worker, each a call of its own in the
in-flight table, run in turn (``ThreadRunner.submit_chain``). A bundle is a few long calls of
different lanes handed to one worker while more records are ready than the workers can start
(``ThreadRunner.submit_chunk``). What the controller needs to know of them, and nothing else:
which group a call belongs to, how many calls of each are still in flight (a group holds one
worker, however many), how many per partition (they are its backlog for pausing), and when a
group's last reported call ended (the next one began then). Owned by the controller thread;
pure data.
"""

from __future__ import annotations

from collections.abc import Sequence

from parallel_consumer.work.item import TopicPartition

__all__ = ["Bundles", "Chains"]


class _Groups:
    """Groups of calls handed to one worker each, by the id of their first call."""

    __slots__ = ("_ends", "_left", "_of", "by_tp", "extra")

    def __init__(self) -> None:
        #: Per call of a group: (its group, the partition of each of its records).
        self._of: dict[int, tuple[int, tuple[TopicPartition, ...]]] = {}
        #: Per group: its calls still in flight.
        self._left: dict[int, int] = {}
        #: Per group: when its last reported call ended.
        self._ends: dict[int, float] = {}
        #: Calls in flight beyond the first of each group: they hold no worker of their own,
        #: so the call limit does not count them.
        self.extra = 0
        #: Per partition: records of groups' calls in flight.
        self.by_tp: dict[TopicPartition, int] = {}

    def start(self, calls: Sequence[tuple[int, tuple[TopicPartition, ...]]]) -> None:
        """A group of ``calls`` (call id and the partition of each of its records, in the
        order they run; the first names the group)."""
        group = calls[0][0]
        of = self._of
        by_tp = self.by_tp
        for call, tps in calls:
            of[call] = (group, tps)
            for tp in tps:
                by_tp[tp] = by_tp.get(tp, 0) + 1
        self._left[group] = len(calls)
        self.extra += len(calls) - 1

    def ended(self, call: int, at: float) -> float | None:
        """Call ``call`` ended at ``at`` and left its group; returns when the call before it
        in its group ended (when it began), or None (the first, or not a group's call)."""
        of = self._of.get(call)
        if of is None:
            return None
        group = of[0]
        before = self._ends.get(group)
        self._ends[group] = at
        self.over(call)
        return before

    def over(self, call: int) -> None:
        """Call ``call`` left its group (it ended, or was taken back before it started)."""
        of = self._of.pop(call, None)
        if of is None:
            return
        group, tps = of
        by_tp = self.by_tp
        for tp in tps:
            count = by_tp[tp] - 1
            if count:
                by_tp[tp] = count
            else:
                del by_tp[tp]
        left = self._left[group] - 1
        if left:
            self._left[group] = left
            self.extra -= 1
        else:
            del self._left[group]
            self._ends.pop(group, None)

    def of_partition(self, tp: TopicPartition) -> list[int]:
        """The groups out with calls of partition ``tp`` (a scan: for revokes)."""
        if tp not in self.by_tp:
            return []
        return sorted({group for group, tps in self._of.values() if tp in tps})

    def __contains__(self, call: object) -> bool:
        return call in self._of

    def __bool__(self) -> bool:
        return bool(self._of)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} out={len(self._left)} calls={len(self._of)} "
            f"extra={self.extra}>"
        )


class Chains(_Groups):
    """Chains handed to the runner: consecutive records of one lane each."""

    __slots__ = ()

    def chain_of(self, call: int) -> int | None:
        """The chain of call ``call`` (the id of its first call), if it is a chain's."""
        of = self._of.get(call)
        return None if of is None else of[0]


class Bundles(_Groups):
    """Bundles handed to the runner: long calls of different lanes, one worker each."""

    __slots__ = ()
