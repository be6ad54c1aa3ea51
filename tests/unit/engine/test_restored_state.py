"""restored_state: what a newly assigned partition makes of the committed offset and metadata,
read back with possible stray bytes (the default) or exactly (``exact=True``)."""

from __future__ import annotations

from confluent_kafka import Message

from parallel_consumer.offsets import OffsetEncoding, decode_offset_map, encode_offset_map
from parallel_consumer.work.partitions import restored_state

TP = ("t", 0)


def accepted(exact: bool, metadata: str) -> list[int]:
    state = restored_state(TP, 1, 3, metadata, fail_on_invalid=True, exact=exact)
    fresh = state.accept([Message(topic="t", partition=0, offset=o) for o in range(3, 600)])
    return [m.offset() for m in fresh]


# A plain RunLength map as Java writes it: its first 4 runs are a map of their own
JAVA_STYLE = encode_offset_map(3, 599, [3, 17, 42, 500], force=OffsetEncoding.RUN_LENGTH)


def test_exact_metadata_restores_the_whole_map() -> None:
    assert JAVA_STYLE is not None
    # as committed by Java, and as confluent-kafka would store it (with its NUL)
    assert accepted(True, JAVA_STYLE.metadata) == [3, 17, 42, 500]
    assert accepted(True, JAVA_STYLE.metadata + "\x00") == [3, 17, 42, 500]


def test_metadata_read_back_restores_only_what_the_shortest_candidate_says() -> None:
    # the default: the map may be followed by stray bytes, so it is cut conservatively and the
    # records after its 4-run prefix run again (none is skipped that was not finished)
    assert JAVA_STYLE is not None
    prefix = decode_offset_map(3, JAVA_STYLE.metadata)
    assert prefix.incomplete == (3, 17)
    assert prefix.highest_seen < 42

    assert accepted(False, JAVA_STYLE.metadata + "\x80") == [
        3,
        17,
        *range(prefix.highest_seen + 1, 600),
    ]
