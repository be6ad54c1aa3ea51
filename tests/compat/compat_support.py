"""Shared by the Java compatibility tests: the vectors, the Java harness runner, and the checks.

Regenerate the committed Java vectors (needs Java 17 and Maven) with::

    .venv/bin/python tests/compat/compat_support.py
"""

from __future__ import annotations

import base64
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import zstandard

from parallel_consumer.offsets import (
    DecodedOffsetMap,
    OffsetEncoding,
    decode_offset_map,
    encode_offset_map,
)

HERE = Path(__file__).resolve().parent
JAVA_PROJECT = HERE / "java"
VECTORS_FILE = HERE / "java_vectors.json"
HARNESS_CLASS = "io.confluent.parallelconsumer.offsets.CompatHarness"
DECODABLE = [e for e in OffsetEncoding if e.decodable]

Vector = dict[str, Any]


def python_name(java_name: str) -> OffsetEncoding:
    """``BitSetV2Compressed`` -> ``OffsetEncoding.BIT_SET_V2_COMPRESSED``."""
    return OffsetEncoding[re.sub(r"(?<!^)(?=[A-Z])", "_", java_name).upper()]


def vector(name: str, base: int, highest: int, incompletes: list[int]) -> Vector:
    return {"name": name, "base": base, "highest": highest, "incompletes": incompletes}


def encode_vectors() -> list[Vector]:
    """The inputs Java encodes: Java's own test cases, every boundary, and seeded random sets."""
    rng = random.Random(20240611)
    vectors = [
        vector("worked_example", 100, 105, [100, 103]),
        vector("java_bitset_test", 0, 11, [0, 4, 6, 7, 8, 10]),
        vector("empty_range", 7, 3, [7]),
        vector("highest_is_base_minus_one", 7, 6, [7]),
        vector("highest_minus_one", 7, -1, [7]),
        vector("base_zero_single", 0, 1, [0]),
        vector("base_zero_all_incomplete", 0, 5, [0, 1, 2, 3, 4]),
        vector("gaps_at_both_ends", 1000, 1100, [1000, 1001, 1050, 1098, 1099]),
        vector("incompletes_at_and_above_highest", 50, 60, [50, 55, 60, 61, 70]),
        vector("bitset_v1_max_length", 0, 32_766, [0, 100]),
        vector("bitset_v1_overflow", 0, 32_767, [0, 100]),
        vector("run_v1_max", 0, 32_767, [0]),
        vector("run_v1_overflow", 0, 32_768, [0]),
        vector("v2_only_70k", 10_000, 80_000, [10_000, 45_000, 79_999]),
        vector("near_2_62", 2**62, 2**62 + 40_000, [2**62, 2**62 + 3, 2**62 + 39_999]),
        vector("near_int64_max", 2**63 - 1000, 2**63 - 2, [2**63 - 1000, 2**63 - 990]),
        vector("periodic_every_7th", 0, 2_100, list(range(0, 2_100, 7))),
        vector(
            "sparse_100k",
            5_000_000,
            5_100_000,
            [5_000_000, *sorted(rng.sample(range(5_000_001, 5_100_000), 199))],
        ),
        vector(
            "dense_random",
            1_000_000,
            1_000_600,
            sorted(rng.sample(range(1_000_000, 1_000_600), 300)),
        ),
    ]
    for index in range(40):
        length = rng.randint(1, 120)
        base = rng.choice([0, 1, rng.randint(2, 10**6), rng.randint(2**40, 2**50)])
        chosen = sorted(rng.sample(range(base, base + length), rng.randint(0, length)))
        incompletes = sorted({base, *chosen})
        vectors.append(vector(f"random_{index}", base, base + length, incompletes))
    return vectors


def truth(base: int, highest: int, incompletes: list[int]) -> tuple[int, ...]:
    """The incomplete offsets a map must carry: those in ``[base, highest)``."""
    return tuple(o for o in incompletes if base <= o < highest)


def plain_bytes(metadata: str) -> bytes:
    """The uncompressed encoder data of a payload (decompressing the zstd variants)."""
    raw = base64.b64decode(metadata)
    encoding = OffsetEncoding.from_magic(raw[0])
    assert encoding is not None
    if encoding.compressed:
        return zstandard.ZstdDecompressor().decompressobj().decompress(raw[1:])
    return raw[1:]


def check_java_encoded(entry: Vector) -> list[str]:
    """Compare one Java-encoded vector with our codec; returns the differences found."""
    problems: list[str] = []
    name, base, highest = entry["name"], entry["base"], entry["highest"]
    expected = truth(base, highest, entry["incompletes"])
    java_encodings = {python_name(k): v for k, v in entry["encodings"].items()}
    for encoding in DECODABLE:
        ours = encode_offset_map(base, highest, entry["incompletes"], force=encoding)
        java = java_encodings.get(encoding)
        if (ours is None) != (java is None):
            problems.append(f"{name}/{encoding.name}: Java {java is not None}, ours {ours}")
            continue
        if ours is None or java is None:
            continue
        decoded = decode_offset_map(base, java["metadata"], exact=True)
        java_decoded = java["java_decoded"]
        if "error" in java_decoded:
            problems.append(f"{name}/{encoding.name}: Java cannot decode its own output")
            continue
        if (
            decoded.incomplete != tuple(java_decoded["incompletes"])
            or decoded.incomplete != expected
        ):
            problems.append(f"{name}/{encoding.name}: incompletes differ from Java's decoding")
        if decoded.highest_seen != java_decoded["highest_seen"]:
            problems.append(
                f"{name}/{encoding.name}: highest_seen {decoded.highest_seen} "
                f"!= Java {java_decoded['highest_seen']}"
            )
        problems += check_read_back(name, encoding, base, java["metadata"], decoded)
        if encoding.compressed:
            if plain_bytes(ours.metadata) != plain_bytes(java["metadata"]):
                problems.append(f"{name}/{encoding.name}: decompressed bytes differ from Java's")
        elif ours.metadata != java["metadata"]:
            problems.append(
                f"{name}/{encoding.name}: {ours.metadata!r} != Java {java['metadata']!r}"
            )
    chosen = encode_offset_map(base, highest, entry["incompletes"])
    if entry["java_choice"] is None:
        if chosen is not None:
            problems.append(f"{name}: Java could not encode, we chose {chosen.encoding.name}")
    elif chosen is None:
        problems.append(f"{name}: Java chose {entry['java_choice']}, we could not encode")
    elif chosen.size > len(entry["java_choice_metadata"]) and reads_back_exactly(
        base, entry["java_choice_metadata"]
    ):
        # Larger than Java's pick only where Java's is a plain RunLength map that a reader
        # allowing for stray characters cannot tell from its own prefix (we never pick those).
        problems.append(f"{name}: our choice {chosen} is larger than Java's {entry['java_choice']}")
    return problems


def reads_back_exactly(base: int, metadata: str) -> bool:
    """True when the map decodes the same read back (stray characters allowed) as exactly."""
    return decode_offset_map(base, metadata) == decode_offset_map(base, metadata, exact=True)


def check_read_back(
    name: str, encoding: OffsetEncoding, base: int, metadata: str, exact: DecodedOffsetMap
) -> list[str]:
    """Java's map read back as confluent-kafka returns it, followed by stray characters: exact for
    everything but plain RunLength, and never more finished than Java wrote."""
    problems = []
    for tail in ("", "\x00", "!", "AAAA", "\x01\x02"):
        decoded = decode_offset_map(base, metadata + tail)
        if not encoding.plain.is_bitset and not encoding.compressed:
            within = {o for o in exact.incomplete if o <= decoded.highest_seen}
            if decoded.highest_seen > exact.highest_seen or not within <= set(decoded.incomplete):
                problems.append(f"{name}/{encoding.name}: read back with {tail!r} finishes more")
        elif decoded != exact:
            problems.append(f"{name}/{encoding.name}: read back with {tail!r} is not exact")
    return problems


def decode_requests() -> list[Vector]:
    """Strings from our encoder for Java to decode: every vector with each encoding and auto."""
    rng = random.Random(7)
    inputs = encode_vectors()
    for index in range(300):
        length = rng.randint(0, 5_000)
        base = rng.choice([0, rng.randint(1, 2**62)])
        count = rng.randint(0, min(length, 50))
        incompletes = sorted({base, *rng.sample(range(base, base + length + 1), count)})
        highest = rng.choice([base + length, base - 1, -1])
        inputs.append(vector(f"py_random_{index}", base, highest, incompletes))
    requests = []
    for item in inputs:
        for force in [None, *DECODABLE]:
            encoded = encode_offset_map(
                item["base"], item["highest"], item["incompletes"], force=force
            )
            if encoded is None:
                continue
            decoded = decode_offset_map(item["base"], encoded.metadata, exact=True)
            requests.append(
                {
                    "name": f"{item['name']}/{encoded.encoding.name}",
                    "committed": item["base"],
                    "metadata": encoded.metadata,
                    "highest_seen": decoded.highest_seen,
                    "incompletes": list(decoded.incomplete),
                    "expected_incompletes": list(
                        truth(item["base"], item["highest"], item["incompletes"])
                    ),
                }
            )
    return requests


def java_tools_missing() -> str | None:
    """Why the Java harness cannot run here, or None when it can."""
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    return f"{' and '.join(missing)} not on PATH" if missing else None


def build_harness() -> str:
    """Build the harness when its sources changed (``mvn -q package``); returns the classpath."""
    classes = JAVA_PROJECT / "target" / "classes"
    classpath_file = JAVA_PROJECT / "target" / "classpath.txt"
    built = classes / HARNESS_CLASS.replace(".", "/")
    sources = [JAVA_PROJECT / "pom.xml", *JAVA_PROJECT.glob("src/**/*.java")]
    class_file = built.with_suffix(".class")
    stale = not class_file.exists() or not classpath_file.exists()
    if not stale:
        newest = max(source.stat().st_mtime for source in sources)
        stale = newest > min(class_file.stat().st_mtime, classpath_file.stat().st_mtime)
    if stale:
        subprocess.run(
            ["mvn", "-q", "-B", "package", "-DskipTests"],
            cwd=JAVA_PROJECT,
            check=True,
            capture_output=True,
            timeout=600,
        )
    return f"{classes}:{classpath_file.read_text().strip()}"


def run_harness(mode: str, items: list[Vector]) -> list[Vector]:
    """Run the Java harness in ``encode`` or ``decode`` mode over ``items``."""
    classpath = build_harness()
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "in.json", Path(tmp) / "out.json"
        source.write_text(json.dumps(items))
        subprocess.run(
            ["java", "-cp", classpath, HARNESS_CLASS, mode, str(source), str(target)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        result: list[Vector] = json.loads(target.read_text())
    return result


HAND_OVER_CLASS = "io.confluent.parallelconsumer.offsets.HandOverRunner"


def run_java_consumer(
    bootstrap: str,
    topic: str,
    group: str,
    *,
    ordering: str,
    failing: Iterable[tuple[int, int]] = (),
    until_succeeded: int | None = None,
    timeout: float = 45.0,
    force_codec: str | None = None,
) -> tuple[Vector, str]:
    """Run the real Java Parallel Consumer (``HandOverRunner``) on ``topic`` for ``group``.

    Its handler throws for every (partition, offset) in ``failing``, so those stay unfinished.
    It closes (committing the offset and the offset map) once ``until_succeeded`` records
    succeeded, or, when that is None, once the group's commit reached the end of every
    partition with no work left. ``force_codec``: the Java name of the encoding every map it
    commits is in (the Java library's test knob), else the smallest. Returns its report
    (``processed``: [partition, offset] in the order they succeeded; ``committed_before`` /
    ``committed``: the group's commit as the Java client reads it, with Java's decoding) and
    its log (warnings and errors).
    """
    classpath = build_harness()
    with tempfile.TemporaryDirectory() as tmp:
        fail_file, out = Path(tmp) / "fail.txt", Path(tmp) / "out.json"
        fail_file.write_text("".join(f"{p} {o}\n" for p, o in sorted(failing)))
        command = [
            "java",
            "-Xmx256m",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp",
            classpath,
            HAND_OVER_CLASS,
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            "--ordering",
            ordering,
            "--fail",
            str(fail_file),
            "--timeout",
            str(int(timeout)),
            "--out",
            str(out),
        ]
        if force_codec is not None:
            command += ["--force-codec", force_codec]
        command += (
            ["--until-committed-end"]
            if until_succeeded is None
            else ["--until-succeeded", str(until_succeeded)]
        )
        # The runner stops itself at its own timeout; this one only guards against a hung JVM
        # (subprocess.run kills it on expiry).
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 60)
        if done.returncode != 0:
            raise RuntimeError(f"HandOverRunner failed ({done.returncode}): {done.stderr[-3000:]}")
        report: Vector = json.loads(out.read_text())
    return report, done.stderr


def dump_vectors(entries: list[Vector]) -> str:
    """One vector per line, so regenerating shows a readable diff."""
    lines = ",\n".join(json.dumps(entry, separators=(",", ":")) for entry in entries)
    return f"[\n{lines}\n]\n"


def main() -> None:
    reason = java_tools_missing()
    if reason:
        sys.exit(f"cannot regenerate: {reason}")
    VECTORS_FILE.write_text(dump_vectors(run_harness("encode", encode_vectors())))
    print(f"wrote {VECTORS_FILE}")


if __name__ == "__main__":
    main()
