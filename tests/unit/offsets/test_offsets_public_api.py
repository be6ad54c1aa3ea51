"""The public surface of parallel_consumer.offsets: __all__ lists exactly the public names."""

from __future__ import annotations

import parallel_consumer.offsets as offsets


def test_all_lists_every_public_name_and_only_those() -> None:
    # Only identifiers: pytest's assertion rewriting may add "@py_builtins" to modules it rewrote.
    public = {name for name in dir(offsets) if name.isidentifier() and not name.startswith("_")}
    modules = {"bitset", "codec", "commit_plan", "encoding", "errors", "run_length", "spill"}

    assert set(offsets.__all__) == public - modules
    assert len(offsets.__all__) == len(set(offsets.__all__))


def test_magic_bytes_match_the_java_enum() -> None:
    expected = {
        "BYTE_ARRAY": ord("L"),
        "BYTE_ARRAY_COMPRESSED": 0xEE,
        "BIT_SET": ord("l"),
        "BIT_SET_COMPRESSED": ord("a"),
        "RUN_LENGTH": ord("n"),
        "RUN_LENGTH_COMPRESSED": ord("J"),
        "BIT_SET_V2": ord("o"),
        "BIT_SET_V2_COMPRESSED": ord("s"),
        "RUN_LENGTH_V2": ord("e"),
        "RUN_LENGTH_V2_COMPRESSED": ord("p"),
        "KAFKA_STREAMS": 1,
        "KAFKA_STREAMS_V2": 2,
    }
    assert {e.name: e.magic for e in offsets.OffsetEncoding} == expected
    assert all(offsets.OffsetEncoding.from_magic(m).name == n for n, m in expected.items())
