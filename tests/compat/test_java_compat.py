"""Both directions against the real Java library (``compat`` marker; needs Java 17 and Maven).

The harness in ``java/`` depends on ``parallel-consumer-core`` 0.5.3.3 and is built once with
``mvn -q package`` (rebuilt only when its sources change), then run with ``java`` directly.
"""

from __future__ import annotations

import pytest
from compat_support import (
    check_java_encoded,
    decode_requests,
    encode_vectors,
    java_tools_missing,
    run_harness,
)

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(
        java_tools_missing() is not None,
        reason=f"Java compatibility harness needs java and mvn: {java_tools_missing()}",
    ),
]


def test_java_encodings_decode_identically_here() -> None:
    # Given fresh output of the Java encoder for every vector and every encoding
    entries = run_harness("encode", encode_vectors())

    # Then our codec agrees with every one of them
    problems = [problem for entry in entries for problem in check_java_encoded(entry)]
    assert problems == []


def test_java_decodes_our_encodings_identically() -> None:
    # Given our encoding of every vector, forced to each encoding and chosen automatically
    requests = decode_requests()

    # When Java decodes them
    answers = {answer["name"]: answer for answer in run_harness("decode", requests)}

    # Then Java reads exactly what we read, and that is the set we encoded
    problems = []
    for request in requests:
        answer = answers[request["name"]]
        if "error" in answer:
            problems.append(f"{request['name']}: Java failed: {answer['error']}")
        elif (answer["highest_seen"], answer["incompletes"]) != (
            request["highest_seen"],
            request["incompletes"],
        ):
            problems.append(f"{request['name']}: Java decoded {answer} differently")
        elif request["incompletes"] != request["expected_incompletes"]:
            problems.append(f"{request['name']}: the decoded set is not the encoded one")
    assert problems == [], f"{len(problems)} of {len(requests)} differ: {problems[:5]}"
    assert len(requests) > 2_000
