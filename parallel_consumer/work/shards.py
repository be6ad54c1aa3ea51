"""Shards: the queues that carry the ordering guarantee, and the ready queue that picks fairly.

A shard is one ordering lane (work/lanes.py holds the lane rule). KEY and PARTITION shards hand
out only their head, and only while nothing else of the shard is in flight or waiting for a
retry; UNORDERED shards hand out any waiting record.

Choosing the next record is O(1) amortised: shards with selectable work sit in a ready queue
(round-robin: a shard that still has work after giving one record goes to the back), instead of
scanning every shard after every completion.
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from collections.abc import Collection, Mapping
from typing import Any

from parallel_consumer.options import ProcessingOrder
from parallel_consumer.work.item import TopicPartition, WorkItem
from parallel_consumer.work.lanes import Shard

__all__ = ["LONGEST_LOOK", "PASSED_MOST", "ShardMap"]

#: ShardMap.take_longest looks at this many ready lanes for the longest.
LONGEST_LOOK = 32
#: A lane passed over this many times for longer ones goes next (see take_longest).
PASSED_MOST = 8
#: Dropped lanes kept for reuse as new ones.
SPARE_LANES = 1024

log = logging.getLogger("parallel_consumer")


def _count_down(counts: dict[Any, int], key: object) -> None:
    """One less of ``key`` in ``counts`` (which must hold it): gone at zero."""
    count = counts[key]
    if count == 1:
        del counts[key]
    else:
        counts[key] = count - 1


class ShardMap:
    """All shards of the assigned partitions, and the ready queue over them.

    Owned by the controller thread. The controller tells it about every state change of a
    record (added, taken, finished, waiting for retry, due again) and asks it for the next
    record to run.
    """

    def __init__(self, ordering: ProcessingOrder) -> None:
        self._ordering = ordering
        self._ordered = ordering is not ProcessingOrder.UNORDERED
        #: KEY order: the partitions whose null-keyed records were said to share one lane.
        self._null_keys_noted: set[TopicPartition] | None = (
            set() if ordering is ProcessingOrder.KEY else None
        )
        self._shards: dict[object, Shard] = {}
        self._ready: deque[Shard] = deque()
        self._parked: dict[TopicPartition, list[Shard]] = {}
        #: Per lane: calls of an earlier assignment of its partition still running. The lane
        #: stays busy until they end, so a record of a revoked and re-assigned partition never
        #: runs beside a stale call of its own lane (KEY and PARTITION only).
        self._stale_running: dict[object, int] = {}
        #: Per partition: how many of its calls ``_stale_running`` counts.
        self._stale_by_tp: dict[TopicPartition, int] = {}
        #: Per lane: holds of records whose outputs are on their way (see :meth:`hold`).
        self._held: dict[object, int] = {}
        #: Records waiting for dispatch, per partition (the back-pressure input; records
        #: queued for runs count too, see count_waiting).
        self.waiting_by_tp: dict[TopicPartition, int] = {}
        self.waiting = 0
        #: Lanes per partition (a partition without lanes hands all its records to runs).
        self._lanes_by_tp: dict[TopicPartition, int] = {}
        #: Dropped lanes kept for reuse (see _new_shard), at most SPARE_LANES.
        self._spare: list[Shard] = []

    # -- registration -------------------------------------------------------------------------

    def add(self, tp: TopicPartition, items: list[WorkItem]) -> None:
        """Register records of one partition, in offset order."""
        shards = self._shards
        ready = self._ready
        ordered = self._ordered
        for item in items:
            key = item.shard_key
            shard = shards.get(key)
            if shard is None:
                shard = self._new_shard(key, tp)
            shard.queue.append(item)
            if not shard.scheduled and not (ordered and shard.busy):
                shard.scheduled = True
                ready.append(shard)
        self._count_waiting(tp, len(items))

    def adopt(self, item: WorkItem) -> None:
        """``item`` is in flight without having been in a lane: a call of a run that left it
        (detached, or the run's failed record). Its lane is busy until it ends, exactly as if
        :meth:`take` had handed it out."""
        shard = self._shards.get(item.shard_key)
        if shard is None:
            shard = self._new_shard(item.shard_key, item.tp)
        shard.busy += 1
        item.in_flight = True

    def has_lane(self, key: object) -> bool:
        """Records of lane ``key`` wait, run or wait for a retry here."""
        return key in self._shards

    def take_idle(self, key: object) -> list[WorkItem] | None:
        """If lane ``key`` only has records waiting (none in flight or waiting for a retry, no
        history, not parked): remove the lane and return them, in order, for a run. Else
        None: the lane stays (``[]`` never comes back)."""
        shard = self._shards.get(key)
        if shard is None or shard.busy or shard.parked:
            return None
        items = list(shard.queue)
        for item in items:
            if item.attempts:
                return None
        shard.queue.clear()
        self._drop(shard)
        self._count_waiting(shard.tp, -len(items))
        return items

    def lanes_of(self, tp: TopicPartition) -> int:
        return self._lanes_by_tp.get(tp, 0)

    def stale_held_in(self, tp: TopicPartition) -> bool:
        """Some lane of ``tp`` waits for a call of a revoked assignment (see
        :meth:`hold_for_stale`)."""
        return tp in self._stale_by_tp

    def count_waiting(self, tp: TopicPartition, delta: int) -> None:
        """Records of ``tp`` waiting outside the lanes (queued for a run) count as waiting."""
        self._count_waiting(tp, delta)

    def remove_partition(self, tp: TopicPartition) -> int:
        """Forget every shard of ``tp`` (revoked); returns how many waiting records were dropped."""
        dropped = 0
        # A scan of every shard: revokes are rare, and an index per partition would cost a set
        # insert and delete for every short-lived shard on the hot path.
        for key in [key for key, shard in self._shards.items() if shard.tp == tp]:
            shard = self._shards.pop(key)
            shard.removed = True
            dropped += len(shard.queue)
            shard.queue.clear()
        self._parked.pop(tp, None)
        self._lanes_by_tp.pop(tp, None)
        self.waiting -= self.waiting_by_tp.pop(tp, 0)
        if any(shard.removed for shard in self._ready):
            # (so that ready_count, which sizes bundles, counts only lanes that can run)
            self._ready = deque(shard for shard in self._ready if not shard.removed)
        return dropped

    def hold_for_stale(self, item: WorkItem) -> None:
        """``item`` is still running although its partition was revoked (call after
        :meth:`remove_partition`): keep its lane busy until :meth:`stale_done`."""
        if not self._ordered:
            return
        key = item.shard_key
        self._stale_running[key] = self._stale_running.get(key, 0) + 1
        self._stale_by_tp[item.tp] = self._stale_by_tp.get(item.tp, 0) + 1
        shard = self._shards.get(key)
        if shard is not None:
            shard.busy += 1

    def stale_done(self, item: WorkItem) -> None:
        """A call held by :meth:`hold_for_stale` ended: its lane may run again."""
        key = item.shard_key
        count = self._stale_running.get(key)
        if count is None:
            return
        _count_down(self._stale_running, key)
        _count_down(self._stale_by_tp, item.tp)
        self._hold_ended(key)

    def hold(self, keys: list[object]) -> None:
        """Lanes ``keys`` are busy until :meth:`release`, whether they exist now or are
        created meanwhile, and whatever revokes happen: records of a run whose outputs are on
        their way hold their lanes as a call in flight would (KEY order only)."""
        if not self._ordered:
            return
        held = self._held
        shards = self._shards
        for key in keys:
            held[key] = held.get(key, 0) + 1
            shard = shards.get(key)
            if shard is not None:
                shard.busy += 1

    def release(self, keys: list[object]) -> None:
        """End holds taken by :meth:`hold`: the lanes' records may run again."""
        if not self._ordered:
            return
        held = self._held
        for key in keys:
            _count_down(held, key)
            self._hold_ended(key)

    def _hold_ended(self, key: object) -> None:
        """A hold on lane ``key`` (a stale call, or outputs on their way) ended."""
        shard = self._shards.get(key)
        if shard is not None:
            shard.busy -= 1
            if shard.queue:
                self._schedule(shard)
            elif not shard.busy:
                self._drop(shard)

    def is_held(self, key: object) -> bool:
        return key in self._held

    # -- selection ----------------------------------------------------------------------------

    def take(self, blocked: Mapping[TopicPartition, int]) -> WorkItem | None:
        """The next record to run, round-robin across shards, or None.

        ``blocked`` maps partitions whose offset map is too large to the highest succeeded
        offset: only records below it (holes that shrink the map) may run there. Shards whose
        head is not such a hole are parked until :meth:`unpark`.
        """
        ready = self._ready
        while ready:
            shard = ready.popleft()
            shard.scheduled = False
            if shard.removed or not shard.queue or (self._ordered and shard.busy):
                continue
            limit = blocked.get(shard.tp)
            if limit is not None and shard.queue[0].offset >= limit:
                self._park(shard)
                continue
            head = self._hand_out(shard)
            if shard.queue and not self._ordered:
                shard.scheduled = True
                ready.append(shard)
            return head
        return None

    def take_longest(self, blocked: Mapping[TopicPartition, int]) -> WorkItem | None:
        """As :meth:`take`, but of the first LONGEST_LOOK ready lanes (KEY and PARTITION), the
        one with the most records waiting, so that long lanes start early and all lanes end
        near the same time (longest-processing-time first). The first lane seen that was
        passed over PASSED_MOST times goes next whatever its length: no lane waits for ever
        behind longer ones (at most about the ready lanes plus PASSED_MOST takes).

        For calls that take milliseconds (chains), where the wall time of a burst is its
        longest lane's: the look costs microseconds. Short calls use :meth:`take`."""
        if not self._ordered:
            return self.take(blocked)
        ready = self._ready
        looked: list[Shard] = []
        best: Shard | None = None
        while ready and len(looked) < LONGEST_LOOK:
            shard = ready.popleft()
            if shard.removed or not shard.queue or shard.busy:
                shard.scheduled = False
                continue
            limit = blocked.get(shard.tp)
            if limit is not None and shard.queue[0].offset >= limit:
                self._park(shard)
                continue
            looked.append(shard)
            if shard.passed >= PASSED_MOST:
                best = shard  # the oldest of the lanes passed over too often
                break
            if best is None or len(shard.queue) > len(best.queue):
                best = shard
        if best is None:
            return None
        for shard in reversed(looked):
            if shard is not best:
                shard.passed += 1
                ready.appendleft(shard)
        best.scheduled = False
        return self._hand_out(best)

    def take_following(
        self, head: WorkItem, most: int, blocked: Mapping[TopicPartition, int]
    ) -> list[WorkItem]:
        """After :meth:`take` handed out ``head`` of a KEY or PARTITION lane: up to ``most``
        records that wait behind it in its lane, in order, to run after it on the same worker
        (a chain, see ``ThreadRunner.submit_chain``). Each keeps the lane busy as ``head``
        does, until it is finished, failed or put back (:meth:`put_back`). A blocked
        partition's records at or above its limit stay (see :meth:`take`)."""
        if not self._ordered or most <= 0:
            return []
        shard = self._shards.get(head.shard_key)
        if shard is None or not shard.queue:
            return []
        queue = shard.queue
        limit = blocked.get(shard.tp)
        out: list[WorkItem] = []
        while queue and len(out) < most:
            item = queue[0]
            if limit is not None and item.offset >= limit:
                break
            queue.popleft()
            item.in_flight = True
            out.append(item)
        if out:
            shard.busy += len(out)
            self._count_waiting(shard.tp, -len(out))
        return out

    def put_back(self, items: list[WorkItem]) -> None:
        """Records of a chain that never started (of one lane): back into their lane in
        offset order, which puts them ahead of the records that were waiting behind them,
        and behind a failed record of the chain whose retry is back already (its failure may
        be reported before they come back: ``ThreadRunner.release_stuck``)."""
        for item in items:
            item.in_flight = False
            self._reinsert(item)

    def unpark(self, tp: TopicPartition) -> None:
        """The partition is no longer blocked: its parked shards compete again."""
        for shard in self._parked.pop(tp, ()):
            shard.scheduled = shard.parked = False
            self._schedule(shard)

    # -- outcomes -----------------------------------------------------------------------------

    def finished(self, item: WorkItem) -> None:
        """``item`` succeeded (or was given up on): the shard's next record may run."""
        shard = self._shards.get(item.shard_key)
        item.in_flight = False
        if shard is None:
            return
        shard.busy -= 1
        if shard.queue:
            if not shard.scheduled and not (self._ordered and shard.busy):
                shard.scheduled = True
                self._ready.append(shard)
        elif not shard.busy:
            self._drop(shard)

    def retry_later(self, item: WorkItem) -> None:
        """``item`` failed and waits for its delay; meanwhile it keeps its shard busy."""
        item.in_flight = False

    def retry_now(self, item: WorkItem) -> None:
        """``item``'s retry delay has passed: it goes back to its shard, in offset order (for
        KEY and PARTITION that is the front)."""
        self._reinsert(item)

    def _reinsert(self, item: WorkItem) -> None:
        """``item``, taken from its shard (and counted busy there), goes back into it in offset
        order. (UNORDERED: records after it may have run meanwhile and other retries gone to the
        front; KEY and PARTITION: a chain's records may come back after the retry of the failed
        record before them. Either way the head stays the lowest offset, which is what take()
        judges a blocked partition's shard by.)"""
        shard = self._shards.get(item.shard_key)
        if shard is None:
            return
        shard.busy -= 1
        queue = shard.queue
        if not queue or item.offset < queue[0].offset:
            queue.appendleft(item)
        else:
            queue.insert(bisect.bisect_left(queue, item.offset, key=_offset), item)
        self._count_waiting(item.tp, 1)
        if shard.parked:
            # Its new head may be a hole below the limit: let take() judge it again.
            self._parked[shard.tp].remove(shard)
            shard.scheduled = shard.parked = False
        self._schedule(shard)

    # -- views --------------------------------------------------------------------------------

    def has_ready(self) -> bool:
        return bool(self._ready)

    def ready_count(self, blocked: Mapping[TopicPartition, int]) -> int:
        """About how many records could be taken now, one after another: the ready lanes
        (KEY and PARTITION: a lane hands out one record at a time), or their waiting records
        (UNORDERED). Lanes whose head waits behind their blocked partition's limit (see
        :meth:`take`) do not count. An estimate for sizing hand-outs: a lane left in the ready
        queue that a take would skip (rare: one held since) counts too."""
        ready: Collection[Shard] = self._ready
        if blocked:
            ready = [  # (rare: a partition whose offset map is too large)
                shard
                for shard in ready
                if shard.tp not in blocked
                or not shard.queue
                or shard.queue[0].offset < blocked[shard.tp]
            ]
        if self._ordered:
            return len(ready)
        return sum(len(shard.queue) for shard in ready)

    def find(self, tp: TopicPartition, offset: int) -> WorkItem | None:
        """The record at ``offset`` of ``tp`` if it waits in a lane (a scan: for rare uses,
        such as finding the record that holds a stalled partition)."""
        for shard in self._shards.values():
            if shard.tp == tp:
                for item in shard.queue:
                    if item.offset == offset:
                        return item
        return None

    def __len__(self) -> int:
        return len(self._shards)

    def __repr__(self) -> str:
        return (
            f"<ShardMap {self._ordering.name} shards={len(self._shards)} "
            f"ready={len(self._ready)} waiting={self.waiting}>"
        )

    # -- internals ----------------------------------------------------------------------------

    def _park(self, shard: Shard) -> None:
        """``shard``'s head is above its blocked partition's limit: it waits (still counted as
        scheduled) until :meth:`unpark`."""
        shard.scheduled = True
        shard.parked = True
        self._parked.setdefault(shard.tp, []).append(shard)

    def _hand_out(self, shard: Shard) -> WorkItem:
        """Take ``shard``'s head (taken off the ready queue by the caller) to run now."""
        head = shard.queue.popleft()
        shard.busy += 1
        shard.passed = 0  # (its wait for take_longest starts again)
        head.in_flight = True
        self.waiting -= 1
        self.waiting_by_tp[shard.tp] -= 1
        return head

    def _new_shard(self, key: object, tp: TopicPartition) -> Shard:
        if self._spare:
            # (KEY order with many keys makes and drops a lane per record: reusing them spares
            # the allocations, and the garbage collector the passes they would trigger)
            shard = self._spare.pop()
            shard.reuse(key, tp)
        else:
            shard = Shard(key, tp)
        self._shards[key] = shard
        noted = self._null_keys_noted
        if noted is not None and key[2] is None and tp not in noted:  # type: ignore[index]
            noted.add(tp)
            log.warning(
                "%s[%d]: records with a null key share one lane in KEY order, so they run one "
                "at a time whatever max_concurrency says; give them keys, or use PARTITION or "
                "UNORDERED order (said once per partition)",
                *tp,
            )
        lanes = self._lanes_by_tp
        lanes[tp] = lanes.get(tp, 0) + 1
        if self._stale_running:
            shard.busy = self._stale_running.get(key, 0)
        if self._held:
            shard.busy += self._held.get(key, 0)
        return shard

    def _drop(self, shard: Shard) -> None:
        shard.removed = True
        del self._shards[shard.key]
        lanes = self._lanes_by_tp
        count = lanes.get(shard.tp, 0)
        if count > 1:
            lanes[shard.tp] = count - 1
        else:
            lanes.pop(shard.tp, None)
        if not shard.scheduled and not shard.queue and len(self._spare) < SPARE_LANES:
            # Nothing refers to it any more (a lane in the ready queue or parked is scheduled;
            # take() skips it there as removed): it may serve as the next new lane.
            self._spare.append(shard)

    def _schedule(self, shard: Shard) -> None:
        if shard.scheduled or shard.removed or not shard.queue:
            return
        if self._ordered and shard.busy:
            return
        shard.scheduled = True
        self._ready.append(shard)

    def _count_waiting(self, tp: TopicPartition, delta: int) -> None:
        self.waiting += delta
        self.waiting_by_tp[tp] = self.waiting_by_tp.get(tp, 0) + delta


def _offset(item: WorkItem) -> int:
    return item.offset
