"""pc-bench's garbage-collector modes: applied for the run only, and recorded."""

from __future__ import annotations

import gc
import json

import pytest

from parallel_consumer.bench import cli
from parallel_consumer.bench.gc_mode import TUNED_YOUNG_THRESHOLD, gc_mode


@pytest.fixture
def interpreter_settings():
    before = gc.get_threshold(), gc.get_freeze_count()
    yield before
    assert gc.get_threshold() == before[0]
    if before[1] == 0:
        assert gc.get_freeze_count() == 0
    else:  # (objects the caller froze stay frozen; see the test below)
        assert gc.get_freeze_count() >= before[1]


def test_default_leaves_the_collector_as_it_is(interpreter_settings):
    thresholds, frozen = interpreter_settings
    with gc_mode("default") as applied:
        assert gc.get_threshold() == thresholds
        assert gc.get_freeze_count() == frozen
    assert applied == {
        "mode": "default",
        "enabled": gc.isenabled(),
        "thresholds": list(thresholds),
        "frozen_objects": frozen,
    }


def test_tuned_freezes_start_up_and_raises_the_young_threshold_for_the_block_only(
    interpreter_settings,
):
    thresholds, _ = interpreter_settings
    with gc_mode("tuned") as applied:
        assert gc.get_threshold() == (TUNED_YOUNG_THRESHOLD, *thresholds[1:])
        assert gc.get_freeze_count() > 1000  # this interpreter's modules, at least
        assert applied["thresholds"] == [TUNED_YOUNG_THRESHOLD, *thresholds[1:]]
        assert applied["frozen_objects"] > 1000  # (a frozen object may still be freed)
    # (the fixture checks that both came back)


def test_tuned_gives_the_settings_back_when_the_run_fails(interpreter_settings):
    with pytest.raises(RuntimeError), gc_mode("tuned"):
        raise RuntimeError("a run failed")


def test_tuned_leaves_what_the_caller_froze_frozen():
    # Given an interpreter whose owner froze its start-up objects already
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()

        # When a tuned run comes and goes
        with gc_mode("tuned"):
            pass

        # Then those objects are still frozen
        assert gc.get_freeze_count() >= frozen
    finally:
        gc.unfreeze()


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown GC mode 'off'; known: default, tuned"):
        gc_mode("off").__enter__()


def test_the_command_line_offers_only_the_known_modes(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "W6", "--gc", "off"])
    assert exited.value.code == 2
    assert "invalid choice: 'off'" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["default", "tuned"])
def test_the_rows_run_under_the_chosen_settings_and_the_file_records_them(
    mode, monkeypatch, tmp_path, interpreter_settings
):
    # Given a run whose broker and rows are stand-ins that note the collector's settings
    from parallel_consumer.bench import kafka_io, runner

    seen = {}

    def run_rows(env, rows, contestants, repeat, progress):
        seen["thresholds"] = gc.get_threshold()
        seen["frozen"] = gc.get_freeze_count()
        return []

    monkeypatch.setattr(kafka_io, "check_reachable", lambda bootstrap: None)
    monkeypatch.setattr(runner, "run_rows", run_rows)

    # When pc-bench runs with --gc <mode>
    argv = ["run", "W6", "--peers", "none", "--bootstrap", "127.0.0.1:1", "--out", str(tmp_path)]
    assert cli.main([*argv, "--gc", mode]) == 0

    # Then the rows ran under that mode's settings, and the results file says so
    thresholds, frozen = interpreter_settings
    if mode == "tuned":
        assert seen["thresholds"] == (TUNED_YOUNG_THRESHOLD, *thresholds[1:])
        assert seen["frozen"] > 1000
    else:
        assert seen == {"thresholds": thresholds, "frozen": frozen}
    (results,) = tmp_path.glob("pc-bench-*.json")
    recorded = json.loads(results.read_text())["parameters"]["gc"]
    assert recorded["mode"] == mode
    assert tuple(recorded["thresholds"]) == seen["thresholds"]
