"""What a run keeps and shows, from made-up results (no broker): the JSON, the table, the charts."""

from __future__ import annotations

import json

from rich.console import Console

from parallel_consumer.bench import plot, report
from parallel_consumer.bench.measure import measure, summarise
from parallel_consumer.bench.model import Observation
from parallel_consumer.bench.runner import RowResult
from parallel_consumer.bench.workloads import WORKLOADS


def results() -> list[RowResult]:
    out = []
    for row in [*WORKLOADS["W1"].rows("full")[:2], *WORKLOADS["W2"].rows("tiny")]:
        n = row.data.records
        result = RowResult(row=row, topic="t", produce_seconds=0.1)
        for name, wall in (("pc", 2.0), ("java-pc", 3.0), ("raw", 0.5)):
            log = [(0, b"k%d" % (o % 10), o, 0.001) for o in range(n)]
            m = measure(row, Observation(0.0, 0.5, 0.5 + wall, log), {0: n})
            result.summaries[name] = summarise(row.label, name, [m])
        result.skipped["share"] = "a share group keeps no order; it runs UNORDERED rows only"
        result.failed["serial"] = "RuntimeError: boom"
        out.append(result)
    return out


def test_the_json_holds_machine_parameters_figures_ratios_skips_and_failures(tmp_path):
    path = report.write_json(
        tmp_path,
        results(),
        machine=report.machine_facts("LocalKafka", "4.3.1"),
        parameters={"scale": "full", "repeat": 1},
        skipped_contestants={"pyrallel": "not installed"},
    )
    document = json.loads(path.read_text())
    assert document["machine"]["kafka"] == "4.3.1"
    assert document["machine"]["cores"] >= 1
    assert document["skipped_contestants"] == {"pyrallel": "not installed"}
    first = document["rows"][0]
    assert first["workload"] == "W1"
    assert first["java_published"] == 22.2
    assert first["parameters"]["records"] == 10_000
    assert first["ratio_to_us"] == {"pc": 1.0, "java-pc": 1.5, "raw": 0.25}
    assert first["ratio_to_raw_records_per_s"]["pc"] == 0.25
    assert first["failed"] == {"serial": "RuntimeError: boom"}
    assert first["results"]["pc"]["runs"][0]["wall"] == 2.0


def test_the_table_has_a_line_per_contestant_and_marks_failures():
    console = Console(width=200, record=True)
    console.print(report.results_table(results()))
    text = console.export_text()
    assert "W1 PARTITION" in text
    assert "java-pc" in text
    assert "failed" in text
    assert "22.2" in text  # the published figure beside the full-size W1 row


def test_plot_writes_the_w1_and_w2_charts(tmp_path):
    path = report.write_json(
        tmp_path,
        results(),
        machine=report.machine_facts("LocalKafka", "4.3.1"),
        parameters={"scale": "full", "repeat": 1},
        skipped_contestants={},
    )
    written = plot.plot(path)
    assert [p.name for p in written] == [f"{path.stem}-W1.png", f"{path.stem}-W2.png"]
    assert all(p.stat().st_size > 10_000 for p in written)


def test_a_chart_names_the_garbage_collector_settings_of_its_run():
    document = {
        "machine": {"cores": 2, "python": "3.11.7", "confluent_kafka": "2.6", "kafka": "4.3.1"},
        "parameters": {"scale": "full", "repeat": 3, "gc": {"mode": "tuned"}},
    }
    assert plot._subtitle(document).endswith("median of 3; garbage collector tuned")
    # Files written before pc-bench recorded the collector say nothing of it.
    del document["parameters"]["gc"]
    assert "garbage collector" not in plot._subtitle(document)
