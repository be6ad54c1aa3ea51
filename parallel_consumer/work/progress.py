"""Per-partition progress watch: notice a partition held by one record (pure, clock injected).

A partition makes progress when its lowest unfinished offset moves on, which is what lets its
committed offset move. :class:`ProgressWatch` remembers, per partition, since when the current
lowest unfinished offset has held it and when the committed offset last moved; a partition is
*stalled* once both have lasted ``threshold`` seconds. Each stall episode is reported once; it
ends when the lowest unfinished offset or the committed offset moves (or the watch is told the
engine was paused, which restarts the clock).

This sits beside ``work/stall.py``: that one notices the *engine* doing nothing while records
wait (a bug detector); this one notices a *partition* held by a slow, hung or failing record
(usually user code or a downstream system).
"""

from __future__ import annotations

from dataclasses import dataclass

from parallel_consumer.work.item import TopicPartition

__all__ = ["PartitionTrack", "ProgressWatch", "Stall"]


@dataclass(slots=True)
class PartitionTrack:
    """What the watch knows about one partition (times on the engine's monotonic clock)."""

    epoch: int
    #: The lowest unfinished offset at the last observation (None: nothing unfinished).
    lowest: int | None
    #: Since when ``lowest`` has been the lowest unfinished offset.
    lowest_since: float
    committed: int | None
    #: When the committed offset last moved (or the partition was assigned / the engine
    #: resumed).
    moved_at: float
    #: This episode was reported.
    reported: bool = False

    def stalled_since(self) -> float | None:
        """When the current episode's clock started, if a record holds the partition."""
        if self.lowest is None:
            return None
        return max(self.lowest_since, self.moved_at)


@dataclass(frozen=True, slots=True)
class Stall:
    """A partition found stalled: ``offset`` (its lowest unfinished) held it ``stalled_for``."""

    tp: TopicPartition
    offset: int
    committed: int | None
    stalled_for: float


class ProgressWatch:
    """Owned by the controller thread; fed with observations of each assigned partition."""

    __slots__ = ("_threshold", "_tracks")

    def __init__(self, threshold: float | None) -> None:
        #: None: ages are tracked, but nothing is ever reported as stalled.
        self._threshold = threshold
        self._tracks: dict[TopicPartition, PartitionTrack] = {}

    def observe(
        self,
        tp: TopicPartition,
        *,
        epoch: int,
        lowest: int | None,
        committed: int | None,
        now: float,
    ) -> Stall | None:
        """Feed the partition's current lowest unfinished and committed offsets; returns a
        :class:`Stall` when a new episode is to be reported now (once per episode)."""
        track = self._tracks.get(tp)
        if track is None or track.epoch != epoch:
            self._tracks[tp] = PartitionTrack(epoch, lowest, now, committed, now)
            return None
        if lowest != track.lowest:
            track.lowest = lowest
            track.lowest_since = now
            track.reported = False
        if committed != track.committed:
            track.committed = committed
            track.moved_at = now
            track.reported = False
        since = track.stalled_since()
        threshold = self._threshold
        if since is None or threshold is None or track.reported or now - since < threshold:
            return None
        track.reported = True
        assert track.lowest is not None
        return Stall(tp, track.lowest, committed, now - since)

    def restart(self, tp: TopicPartition, now: float) -> None:
        """Start ``tp``'s stall clock again (after acting on its stall); a new episode may be
        reported one threshold from now."""
        track = self._tracks.get(tp)
        if track is not None:
            track.moved_at = now
            track.reported = False

    def restart_all(self, now: float) -> None:
        """The engine was not dispatching (paused): no partition could progress meanwhile."""
        for tp in self._tracks:
            self.restart(tp, now)

    def forget(self, tp: TopicPartition) -> None:
        self._tracks.pop(tp, None)

    def track(self, tp: TopicPartition) -> PartitionTrack | None:
        return self._tracks.get(tp)

    def stalled(self) -> list[TopicPartition]:
        """Partitions in a reported stall episode."""
        return [tp for tp, track in self._tracks.items() if track.reported]

    def wake_at(self) -> float | None:
        """The earliest time an unreported episode reaches the threshold (None: none can)."""
        threshold = self._threshold
        if threshold is None:
            return None
        earliest: float | None = None
        for track in self._tracks.values():
            since = track.stalled_since()
            if since is None or track.reported:
                continue
            at = since + threshold
            if earliest is None or at < earliest:
                earliest = at
        return earliest

    @property
    def watching(self) -> bool:
        """Some partition has an unfinished record."""
        return any(track.lowest is not None for track in self._tracks.values())

    def __len__(self) -> int:
        return len(self._tracks)

    def __repr__(self) -> str:
        return (
            f"<ProgressWatch threshold={self._threshold} partitions={len(self._tracks)} "
            f"stalled={len(self.stalled())}>"
        )
