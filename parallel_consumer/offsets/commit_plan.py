"""Decide what to commit for one partition: the offset, its metadata, and whether to back off."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from sortedcontainers import SortedList

from parallel_consumer.offsets._ranges import sorted_offsets
from parallel_consumer.offsets.codec import encode_offset_map, encode_sorted_offset_map
from parallel_consumer.offsets.encoding import OffsetEncoding

__all__ = ["DEFAULT_MAX_METADATA_BYTES", "CommitPlan", "MetadataStatus", "plan_commit"]

#: The broker's default ``offset.metadata.max.bytes``; the limit applies per partition.
DEFAULT_MAX_METADATA_BYTES = 4096


class MetadataStatus(enum.Enum):
    """How the encoded offset map relates to the metadata size limit."""

    #: The map fits comfortably (or no map is needed): take new records freely.
    FITS = "fits"
    #: The map is committed but uses at least ``near_limit_ratio`` of the limit.
    NEAR_LIMIT = "near_limit"
    #: The map is over the limit, so only the offset is committed (metadata ``""``), like Java.
    TOO_LARGE = "too_large"
    #: The map is over the limit and goes to the side topic (``spill=True``): the commit carries
    #: a reference to it (``offsets/spill.py``); ``metadata`` is the whole map.
    SPILL = "spill"
    #: No encoding can represent the range (length fields overflow); only the offset is committed.
    NO_ENCODING = "no_encoding"


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitPlan:
    """What to commit for a partition: ``OffsetAndMetadata(offset, metadata)``.

    ``size`` is the length of the encoded map even when it was dropped (0 when there is none).
    """

    offset: int
    metadata: str
    status: MetadataStatus
    encoding: OffsetEncoding | None
    size: int


def plan_commit(
    incomplete_offsets: Iterable[int],
    highest_succeeded: int,
    *,
    max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
    near_limit_ratio: float = 0.75,
    force: OffsetEncoding | None = None,
    spill: bool = False,
) -> CommitPlan | None:
    """Plan the commit of one partition from its incomplete offsets.

    ``incomplete_offsets`` is any iterable of ints in any order (duplicates count once); a
    ``SortedList`` or a strictly increasing list is the fast path. ``highest_succeeded`` is the
    highest offset that completed, -1 if none did (it must not itself be in
    ``incomplete_offsets``: like Java, the map marks it complete). The committed offset is the
    lowest incomplete offset, or ``highest_succeeded + 1`` when none is incomplete. Returns None
    when there is nothing to commit (no incompletes and nothing ever succeeded).

    How the engine reacts to :attr:`CommitPlan.status`:

    * ``FITS``: commit; let the partition take new records.
    * ``NEAR_LIMIT`` (``size >= near_limit_ratio * max_metadata_bytes``): commit, and block the
      partition: select only records below ``highest_succeeded`` (the holes in the map) until a
      later plan is ``FITS`` again. Java blocks only above the ratio (strictly greater). With
      ``spill`` there is no need to: a map that grows over the limit spills.
    * ``TOO_LARGE`` (``size > max_metadata_bytes``): commit the offset alone (metadata ``""``, so
      everything above it replays after a restart), log a warning, and block as above.
    * ``SPILL`` (``size > max_metadata_bytes`` and ``spill``): the map goes to the side topic
      and the commit carries a reference to it; the partition keeps taking new records.
    * ``NO_ENCODING``: the same as ``TOO_LARGE``.

    When nothing above the lowest incomplete offset has succeeded, no map is needed and the
    metadata is ``""`` (Java would encode a one-offset map marking the base complete when
    ``highest_succeeded`` is -1, which would skip that record after a restart).
    """
    if max_metadata_bytes <= 0:
        raise ValueError(f"max_metadata_bytes must be > 0, got {max_metadata_bytes}")
    if not 0 < near_limit_ratio <= 1:
        raise ValueError(f"near_limit_ratio must be in (0, 1], got {near_limit_ratio}")
    if type(incomplete_offsets) is SortedList:  # sorted by contract: no copy, no check
        ordered: Iterable[int] = incomplete_offsets
        lowest = incomplete_offsets[0] if incomplete_offsets else None
    else:
        array = sorted_offsets(incomplete_offsets)
        ordered, lowest = array, (int(array[0]) if array.size else None)
    if lowest is None:
        if highest_succeeded < 0:
            return None
        return _plain(highest_succeeded + 1)
    offset = lowest
    if highest_succeeded <= offset:
        return _plain(offset)
    if ordered is incomplete_offsets:
        encoded = encode_offset_map(offset, highest_succeeded, ordered, force=force)
    else:
        encoded = encode_sorted_offset_map(offset, highest_succeeded, array, force)
    if encoded is None:
        return CommitPlan(
            offset=offset, metadata="", status=MetadataStatus.NO_ENCODING, encoding=None, size=0
        )
    if encoded.size > max_metadata_bytes and spill:
        status, metadata = MetadataStatus.SPILL, encoded.metadata
    elif encoded.size > max_metadata_bytes:
        status, metadata = MetadataStatus.TOO_LARGE, ""
    elif encoded.size >= near_limit_ratio * max_metadata_bytes:
        status, metadata = MetadataStatus.NEAR_LIMIT, encoded.metadata
    else:
        status, metadata = MetadataStatus.FITS, encoded.metadata
    return CommitPlan(
        offset=offset,
        metadata=metadata,
        status=status,
        encoding=encoded.encoding,
        size=encoded.size,
    )


def _plain(offset: int) -> CommitPlan:
    return CommitPlan(offset=offset, metadata="", status=MetadataStatus.FITS, encoding=None, size=0)
