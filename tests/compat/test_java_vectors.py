"""Java → Python without Java: the committed vectors written by the real Java library decode here.

``java_vectors.json`` was produced by ``parallel-consumer-core`` 0.5.3.3 through the harness in
``java/`` (regenerate with ``python tests/compat/compat_support.py``). For every vector and every
encoding Java produced, our decoder must agree with Java's own decoding (and, read back with stray
characters as confluent-kafka returns it, be exact or, for plain RunLength, never finish more),
our forced encoding must be byte-identical (after decompression for the zstd kinds), and our
automatic choice must be no larger than Java's unless Java's does not read back exactly.
"""

from __future__ import annotations

import json

import pytest
from compat_support import VECTORS_FILE, check_java_encoded, encode_vectors, python_name

from parallel_consumer.offsets import OffsetEncoding

ENTRIES = json.loads(VECTORS_FILE.read_text())


def test_committed_vectors_cover_the_current_inputs() -> None:
    # Given the inputs defined in compat_support; when they change, regenerate the file.
    committed = [(e["name"], e["base"], e["highest"], e["incompletes"]) for e in ENTRIES]
    current = [(v["name"], v["base"], v["highest"], v["incompletes"]) for v in encode_vectors()]

    assert committed == current


def test_java_produced_every_decodable_encoding() -> None:
    seen = {python_name(name) for entry in ENTRIES for name in entry["encodings"]}

    assert seen == {e for e in OffsetEncoding if e.decodable}


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_java_vector_matches_our_codec(entry: dict[str, object]) -> None:
    assert check_java_encoded(entry) == []
