"""The runnable examples under ``examples/`` (the README's and getting-started's code) stay correct:
they pass ``mypy --strict``, and the one that needs no broker passes as a test."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_every_example_passes_mypy_strict():
    # Given every example file
    files = sorted(str(path) for path in EXAMPLES.glob("*.py"))
    assert files
    # When mypy --strict checks them (with the project's configuration)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", *files],
        cwd=EXAMPLES.parent,
        capture_output=True,
        text=True,
        timeout=90,
    )
    # Then it finds nothing
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_getting_started_handler_test_passes_on_the_fakes():
    # Given the handler test that docs/getting-started.md shows
    spec = importlib.util.spec_from_file_location("handler_test", EXAMPLES / "handler_test.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # When it runs, then it passes
    module.test_a_failed_record_is_retried_after_the_delay()


def test_the_readme_shows_the_quickstart_example_as_it_is():
    # Given the README's Python block and examples/quickstart.py
    readme = (EXAMPLES.parent / "README.md").read_text()
    shown = readme.split("```python\n", 1)[1].split("```\n", 1)[0]
    example = (EXAMPLES / "quickstart.py").read_text()
    # Then the README shows the file's code (all but its docstring and __future__ import)
    code = example.split('"""', 2)[2].replace("from __future__ import annotations\n\n", "")
    assert shown.strip() == code.strip()


def test_the_async_handlers_page_shows_the_fastapi_example_as_it_is():
    # Given the FastAPI block of docs/async-handlers.md and examples/fastapi_service.py
    page = (EXAMPLES.parent / "docs" / "async-handlers.md").read_text()
    shown = page.split("### FastAPI", 1)[1].split("```python\n", 1)[1].split("```\n", 1)[0]
    example = {line.strip() for line in (EXAMPLES / "fastapi_service.py").read_text().splitlines()}
    # Then every line the page shows is a line of the example (indentation aside)
    missing = [line for line in shown.splitlines() if line.strip() not in example]
    assert missing == []
