"""The README's main job works against a real broker and checks its own result.

``scripts/demo`` is set-up followed by ``pc-bench run --quick``; here the same code path runs a
tiny W1 and W2 with two contestants beside this library, so CI stays fast. ``pc demo`` (the
guided single-consumer example) keeps its own test.
"""

from __future__ import annotations

import gc
import json
import logging
import re

import pytest

from parallel_consumer.bench import cli
from parallel_consumer.cli import demo

#: The library's warning for one failed attempt of one record: "<topic>[<p>]@<o> failed (attempt
#: <n>), retrying in ...".
PER_RECORD_RETRY = re.compile(r"\(attempt \d+\)")


@pytest.mark.kafka_requires("commit_metadata")
def test_the_quick_benchmark_runs_end_to_end_and_checks_every_row(kafka, tmp_path, capsys):
    # Given the demo's benchmark at its tiniest, with the serial loop and the raw client as peers
    argv = ["run", "W1", "W2", "--scale", "tiny", "--peers", "serial,raw"]
    argv += ["--bootstrap", kafka.bootstrap_servers, "--out", str(tmp_path)]

    # When it runs
    code = cli.main(argv)

    # Then every row ran with every contestant that applies, and every check held
    out = capsys.readouterr().out
    assert code == 0, out
    (results,) = tmp_path.glob("pc-bench-*.json")
    document = json.loads(results.read_text())
    rows = {f"{r['workload']} {r['row']}": r for r in document["rows"]}
    assert set(rows) == {"W1 KEY-10", "W1 UNORDERED", "W2 KEY", "W2 UNORDERED"}
    for name, row in rows.items():
        expected = {"pc", "serial"} | ({"raw"} if name.startswith("W2") else set())
        assert set(row["results"]) == expected, name
        assert not row["failed"], name
        for contestant, result in row["results"].items():
            assert result["missing"] == 0, (name, contestant)
            assert result["order_ok"], (name, contestant)
            assert result["duplicates"] == 0, (name, contestant)
            assert result["wall"] > 0, (name, contestant)
        assert row["ratio_to_us"]["pc"] == 1.0
    assert rows["W1 KEY-10"]["skipped"]["raw"].startswith("raw does no work")
    # And the run is described: machine facts and parameters
    assert document["machine"]["cores"] >= 1
    assert document["machine"]["librdkafka"]
    assert document["parameters"]["contestants"] == ["pc", "serial", "raw"]
    # And the table was printed, and the charts can be drawn from the file
    assert "pc-bench results" in out
    assert cli.main(["plot", str(results)]) == 0
    assert sorted(p.name.rsplit("-", 1)[1] for p in tmp_path.glob("*.png")) == ["W1.png", "W2.png"]


@pytest.mark.kafka_requires("commit_metadata")
def test_pc_demo_processes_everything_in_order_and_commits_to_the_end(kafka, capsys, caplog):
    # Given a demo whose handler fails the first attempt of about 120 of its 600 records
    caplog.set_level(logging.WARNING)

    # When it runs
    code = demo.main(
        [
            "--bootstrap",
            kafka.bootstrap_servers,
            "--records",
            "600",
            "--keys",
            "20",
            "--failure-rate",
            "0.2",
        ]
    )

    # Then everything was processed in key order and committed
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, out
    assert "per-key order kept: True" in out
    assert out.rstrip().endswith("OK")
    # And the retries were counted, not printed one line per record: none failed twice, so not
    # one of the ~120 per-attempt warnings is shown (whether printed or sent to logging)
    retried = int(re.search(r"retried after failures: (\d+)", out).group(1))
    assert retried > 20, out
    assert re.search(r"retries +\d+", out), out
    shown = [
        line
        for line in [*out.splitlines(), *captured.err.splitlines(), *caplog.messages]
        if PER_RECORD_RETRY.search(line)
    ]
    assert len(shown) < 5, "\n".join(shown[:20])


@pytest.mark.kafka_requires("accurate_high_watermark")  # (pc-bench reads the end offsets)
def test_the_event_loop_floor_runs_beside_pc_on_the_async_rows(kafka, tmp_path, capsys):
    # Given W6 at its tiniest with the asyncio floor as the peer
    argv = ["run", "W6", "--scale", "tiny", "--repeat", "1", "--peers", "asyncio"]
    argv += ["--bootstrap", kafka.bootstrap_servers, "--out", str(tmp_path)]

    # When it runs
    code = cli.main(argv)

    # Then both ran every row (uvloop's only where uvloop is installed), and the floor read
    # every record once, each lane in order
    out = capsys.readouterr().out
    assert code == 0, out
    (results,) = tmp_path.glob("pc-bench-*.json")
    rows = {r["row"]: r for r in json.loads(results.read_text())["rows"]}
    assert {"UNORDERED C=5000", "KEY-10000 C=5000"} <= set(rows)
    for name, row in rows.items():
        assert not row["failed"], name
        if row["skipped"]:  # the uvloop rows without uvloop: both skipped, and said why
            assert set(row["skipped"]) == {"pc", "asyncio"}, name
            assert all("uvloop" in why for why in row["skipped"].values()), name
            continue
        assert set(row["results"]) == {"pc", "asyncio"}, name
        floor = row["results"]["asyncio"]
        assert (floor["missing"], floor["duplicates"], floor["order_ok"]) == (0, 0, True), name
        assert [run["records"] for run in floor["runs"]] == [200], name
        assert floor["wall"] > 0, name


def test_a_run_with_the_tuned_collector_says_so_and_records_it(kafka, tmp_path, capsys):
    # Given a tiny W6 run with the garbage collector tuned
    thresholds = gc.get_threshold()
    argv = ["run", "W6", "--scale", "tiny", "--repeat", "1", "--peers", "none", "--gc", "tuned"]
    argv += ["--bootstrap", kafka.bootstrap_servers, "--out", str(tmp_path)]

    # When it runs
    code = cli.main(argv)

    # Then it ran, said how the collector was set, recorded it, and set it back afterwards
    out = capsys.readouterr().out
    assert code == 0, out
    assert "garbage collector tuned: thresholds [10000," in out
    (results,) = tmp_path.glob("pc-bench-*.json")
    recorded = json.loads(results.read_text())["parameters"]["gc"]
    assert recorded["mode"] == "tuned"
    assert recorded["thresholds"] == [10_000, *thresholds[1:]]
    assert recorded["frozen_objects"] > 0
    assert gc.get_threshold() == thresholds
    assert gc.get_freeze_count() == 0
