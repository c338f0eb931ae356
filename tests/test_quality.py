"""The linter and the type checker run inside the test command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1100)


def test_ruff_is_clean():
    result = run(sys.executable, "-m", "ruff", "check", ".")
    assert result.returncode == 0, f"ruff found problems (pip install ruff if missing):\n{result.stdout}{result.stderr}"


@pytest.mark.timeout(1200)  # a cold mypy run (no cache) exceeds the suite's 300 s on a loaded 2-core machine
def test_mypy_strict_is_clean():
    result = run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, f"mypy found problems:\n{result.stdout}{result.stderr}"


def test_cli_help_for_every_subcommand():
    for sub in ("demo", "export", "doctor", "plot", "keys"):
        result = run(sys.executable, "-m", "posttrain_metrics.cli", sub, "--help")
        assert result.returncode == 0 and "usage:" in result.stdout, result.stderr


def test_keys_markdown_lists_every_declared_key():
    from posttrain_metrics.core.catalog import BUILTIN
    from posttrain_metrics.core.keys import describe

    result = run(sys.executable, "-m", "posttrain_metrics.cli", "keys", "--markdown")
    assert result.returncode == 0, result.stderr
    for key in describe(BUILTIN):
        assert f"`{key}`" in result.stdout, key


def test_readme_catalogue_is_the_generated_one():
    """The README's key table is generated: `posttrain-metrics keys --markdown` between markers."""
    result = run(sys.executable, "-m", "posttrain_metrics.cli", "keys", "--markdown")
    readme = (ROOT / "README.md").read_text()
    start, end = "<!-- keys:start -->\n", "<!-- keys:end -->"
    block = readme[readme.index(start) + len(start): readme.index(end)]
    assert block == result.stdout, "regenerate with: python scripts/sync_readme.py"
