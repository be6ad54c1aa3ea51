"""Chains out: the controller's bookkeeping of chains (docs/performance.md#chains).

A chain is consecutive records of one lane handed to one worker, each a call of its own in the
in-flight table, run in turn (``ThreadRunner.submit_chain``). What the controller needs to know
of the chains out, and nothing else: which chain a call belongs to, how many calls of each are
still in flight (a chain holds one worker, however many), how many per partition (they are its
backlog for pausing), and when a chain's last reported call ended (the next one began then).
Owned by the controller thread; pure data.
"""

from __future__ import annotations

from collections.abc import Sequence

from parallel_consumer.work.item import TopicPartition

__all__ = ["Chains"]


class Chains:
    """Chains handed to the runner, by the id of their first call."""

    __slots__ = ("_ends", "_left", "_of", "by_tp", "extra")

    def __init__(self) -> None:
        #: Per call of a chain: (its chain, its partition).
        self._of: dict[int, tuple[int, TopicPartition]] = {}
        #: Per chain: its calls still in flight.
        self._left: dict[int, int] = {}
        #: Per chain: when its last reported call ended.
        self._ends: dict[int, float] = {}
        #: Calls in flight beyond the first of each chain: they hold no worker of their own,
        #: so the call limit does not count them.
        self.extra = 0
        #: Per partition: calls of chains in flight.
        self.by_tp: dict[TopicPartition, int] = {}

    def start(self, calls: Sequence[int], tp: TopicPartition) -> None:
        """A chain of ``calls`` (in order, the first names the chain) of partition ``tp``."""
        chain = calls[0]
        for call in calls:
            self._of[call] = (chain, tp)
        self._left[chain] = len(calls)
        self.by_tp[tp] = self.by_tp.get(tp, 0) + len(calls)
        self.extra += len(calls) - 1

    def ended(self, call: int, at: float) -> float | None:
        """Call ``call`` ended at ``at`` and left its chain; returns when the call before it
        in its chain ended (when it began), or None (the first, or not a chain's call)."""
        of = self._of.get(call)
        if of is None:
            return None
        chain = of[0]
        before = self._ends.get(chain)
        self._ends[chain] = at
        self.over(call)
        return before

    def over(self, call: int) -> None:
        """Call ``call`` left its chain (it ended, or was taken back before it started)."""
        of = self._of.pop(call, None)
        if of is None:
            return
        chain, tp = of
        count = self.by_tp[tp] - 1
        if count:
            self.by_tp[tp] = count
        else:
            del self.by_tp[tp]
        left = self._left[chain] - 1
        if left:
            self._left[chain] = left
            self.extra -= 1
        else:
            del self._left[chain]
            self._ends.pop(chain, None)

    def chain_of(self, call: int) -> int | None:
        """The chain of call ``call`` (the id of its first call), if it is a chain's."""
        of = self._of.get(call)
        return None if of is None else of[0]

    def of_partition(self, tp: TopicPartition) -> list[int]:
        """The chains out of partition ``tp`` (a scan: for revokes)."""
        if tp not in self.by_tp:
            return []
        return sorted({chain for chain, of_tp in self._of.values() if of_tp == tp})

    def __contains__(self, call: object) -> bool:
        return call in self._of

    def __bool__(self) -> bool:
        return bool(self._of)

    def __repr__(self) -> str:
        return f"<Chains out={len(self._left)} calls={len(self._of)} extra={self.extra}>"
