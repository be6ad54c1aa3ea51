"""``pc-bench latency`` (L1) end to end at its tiniest, ``pc`` alone: capacity, one load, the
JSON and the CDF chart. Figures are never asserted (docs/benchmarks.md carries them); what must
hold whatever the machine's speed is: every record produced was handled and committed, and no
latency is below the handler's 5 ms, nor a commit before its handler returned."""

from __future__ import annotations

import json

from parallel_consumer.bench import cli


def test_the_latency_workload_measures_pc_at_a_fraction_of_its_capacity(kafka, tmp_path, capsys):
    # Given L1 at its tiniest (2 s of producing) at 50 % of pc's capacity, pc alone
    argv = ["latency", "--scale", "tiny", "--loads", "0.5", "--repeat", "1", "--peers", "none"]
    argv += ["--bootstrap", kafka.bootstrap_servers, "--out", str(tmp_path)]

    # When it runs
    code = cli.main(argv)

    # Then it measured pc's capacity first and ran pc at half of it
    out = capsys.readouterr().out
    assert code == 0, out
    (results,) = tmp_path.glob("pc-bench-latency-*.json")
    document = json.loads(results.read_text())
    capacity = document["parameters"]["capacity"]
    assert capacity > 0
    (entry,) = document["loads"]
    assert entry["rate"] == capacity / 2
    pc = entry["results"]["pc"]
    assert pc["errors"] == []
    # And every record produced was handled and its commit acknowledged
    assert pc["produced"] == pc["handled"] == pc["committed"]
    assert pc["produced"][0] >= 1
    # And no record got through faster than its handler, nor committed before it was handled
    assert pc["done_ms"]["p50"] >= 5.0
    for q in ("p50", "p99", "p99.9"):
        assert pc["commit_ms"][q] >= pc["done_ms"]["p50"]
    assert pc["done_cdf_ms"][-1][1] == 1.0
    # And the commit observation is described, and the CDF chart drawn
    assert "on_commit" in document["parameters"]["commit_clocks"]["pc"]
    assert len(list(tmp_path.glob("*-L1-50pct.png"))) == 1
    assert "L1 latency" in out
