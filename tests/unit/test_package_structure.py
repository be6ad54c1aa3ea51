"""Claims about the package's shape that docs/architecture.md and the restructuring make:
every engine part is in the contributors' page, every thread the package starts is in its
table of threads, the runner seam is typed (no ``type: ignore`` where a runner reports), one
place unwraps a dead letter's cause, and the controller stays a few hundred lines."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "parallel_consumer"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _sources() -> dict[Path, str]:
    return {path: path.read_text() for path in PACKAGE.rglob("*.py")}


def test_every_engine_module_is_named_in_the_architecture_page() -> None:
    page = ARCHITECTURE.read_text()
    missing = [
        path.name
        for path in sorted((PACKAGE / "engine").glob("*.py"))
        if path.name != "__init__.py" and f"engine/{path.name}" not in page
    ]
    assert not missing, f"docs/architecture.md does not name engine/{missing}"


def test_every_thread_the_package_starts_is_in_the_threads_table() -> None:
    """Each ``name=f"{...}-<suffix>"`` of a long-lived library thread (not the runners' own
    workers, which the table names as a group) appears as ``<name>-<suffix>``."""
    page = ARCHITECTURE.read_text()
    suffixes = set()
    for path in (PACKAGE / "engine" / "controller.py", *(PACKAGE / "kafka").glob("*.py")):
        suffixes.update(re.findall(r'name=f"\{[^}]*\}-([a-z-]+)"', path.read_text()))
    assert suffixes, "no thread names found"
    missing = sorted(s for s in suffixes if f"<name>-{s}" not in page)
    assert not missing, f"threads missing from docs/architecture.md: {missing}"


def test_runners_report_through_a_typed_seam() -> None:
    """A runner reports WorkDone, WorkDoneMany and RunDone through the ``done`` callback the
    controller hands it: its type must accept all three, with no ``type: ignore`` at the
    call."""
    ignored = [
        f"{path.relative_to(ROOT)}:{number}"
        for path, text in _sources().items()
        if path.parent.name == "runners"
        for number, line in enumerate(text.splitlines(), 1)
        if re.search(r"\b_?done\(.*(WorkDone|RunDone).*type: ignore", line)
    ]
    assert not ignored, f"runner reports that need a type: ignore: {ignored}"


def test_one_place_unwraps_the_cause_of_a_dead_letter() -> None:
    pattern = re.compile(r"isinstance\((\w+), DeadLetter\) and \1\.__cause__ is not None")
    places = [
        f"{path.relative_to(ROOT)}:{number}"
        for path, text in _sources().items()
        for number, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]
    assert len(places) == 1, f"the cause of a DeadLetter is unwrapped in {places}"


def test_the_controller_is_a_few_hundred_lines() -> None:
    lines = len((PACKAGE / "engine" / "controller.py").read_text().splitlines())
    assert lines < 500, f"engine/controller.py has {lines} lines"
