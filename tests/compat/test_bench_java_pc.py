"""pc-bench's ``java-pc`` contestant: the Java Parallel Consumer runs a benchmark row through a
real broker and reports on the same clock, and its run passes the same checks as ours (``compat``
marker; needs java and mvn, builds ``benchmarks/java`` on first use)."""

from __future__ import annotations

import json

import pytest
from compat_support import java_tools_missing

from parallel_consumer.bench import cli

pytestmark = [
    pytest.mark.compat,
    pytest.mark.kafka_requires("commit_metadata"),
    pytest.mark.skipif(
        java_tools_missing() is not None,
        reason=f"the Java Parallel Consumer needs java and mvn: {java_tools_missing()}",
    ),
    pytest.mark.timeout(600),  # the first Maven build resolves from Maven Central
]


def test_java_pc_runs_a_tiny_w1_beside_us_and_passes_the_checks(kafka, tmp_path, capsys):
    # Given the tiny W1 (KEY-10 and UNORDERED, 200 records each) with java-pc as the only peer
    argv = ["run", "W1", "--scale", "tiny", "--peers", "java-pc"]
    argv += ["--bootstrap", kafka.bootstrap_servers, "--out", str(tmp_path)]

    # When it runs
    code = cli.main(argv)

    # Then the Java library processed every record once, in key order, on our clock
    out = capsys.readouterr().out
    assert code == 0, out
    (results,) = tmp_path.glob("pc-bench-*.json")
    for row in json.loads(results.read_text())["rows"]:
        java = row["results"]["java-pc"]
        assert java["missing"] == 0, row["row"]
        assert java["duplicates"] == 0, row["row"]
        assert java["order_ok"], row["row"]
        # Its wall is on the same clock as ours: positive, and not absurdly far from it
        assert 0 < java["wall"] < 60 * row["results"]["pc"]["wall"], row["row"]
