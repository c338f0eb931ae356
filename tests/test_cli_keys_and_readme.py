"""The command line's help and `keys` listing (run in-process), and the README blocks generated from
them. ruff and mypy run from scripts/test (the README's test command), not from pytest."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from posttrain_metrics.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``posttrain-metrics ARGV`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exc:  # --help
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_help_for_every_subcommand(capsys):
    for sub in ("demo", "export", "doctor", "plot", "keys"):
        code, out, err = run_cli(capsys, sub, "--help")
        assert code == 0 and "usage:" in out, err


def test_cli_with_no_arguments_lists_the_commands(capsys):
    assert main([]) == 0  # argparse alone exits 2 with "the following arguments are required: COMMAND"
    out = capsys.readouterr().out
    for sub in ("demo", "export", "publish", "doctor", "plot", "keys"):
        assert f"    {sub} " in out, out


def test_keys_markdown_lists_every_declared_key(capsys):
    from posttrain_metrics.core.catalog import BUILTIN
    from posttrain_metrics.core.keys import describe

    code, out, err = run_cli(capsys, "keys", "--markdown")
    assert code == 0, err
    for key in describe(BUILTIN):
        assert f"`{key}`" in out, key


def test_keys_shows_the_source_name_to_pass_beside_the_published_key(capsys):
    code, out, err = run_cli(capsys, "keys", "--markdown")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("| adapter | source name (pass this) | published key | reduction | weight / count |")
    # what on_chunk_end takes, beside what trackers show: the grpo_ prefix, bare reward/trainer names
    for row in ("| grpo | `grpo_clip_frac` | `train/clip_frac` | weighted_mean | train/valid_token_count | fraction |",
                "| grpo | `grpo_loss` | `train/loss_avg` | weighted_mean | train/weight_sum |",
                "| reward | `reward_mean` | `train/reward_mean` | weighted_mean | train/rollout_count |",
                "| reward | `reward_min` | `train/reward_min` | min | train/rollout_count > 0 |",
                "| trainer | `grad_norm` | `train/grad_norm` | last |",
                "| dpo | `dpo_accuracy` | `val/dpo_accuracy` | mean |"):
        assert any(line.startswith(row) for line in lines), row
    plain = run_cli(capsys, "keys", "reward")[1]
    assert "rollout_count" in plain and "train/rollout_count" in plain and "source name" in plain


def test_readme_examples_are_the_example_files():
    """The README's config and loop are examples/grpo_callback.yaml and examples/grpo_loop.py, copied
    by scripts/sync_readme.py (one source: the README cannot drift from the files CI runs)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import sync_readme
    finally:
        sys.path.pop(0)
    readme = (ROOT / "README.md").read_text()
    for name in ("example-yaml", "example-loop"):
        start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
        block = readme[readme.index(start) + len(start): readme.index(end)]
        assert block == sync_readme.blocks()[name], "regenerate with: python scripts/sync_readme.py"
    loop = sync_readme.example_loop()
    assert '"grpo_weight_sum"' in loop and "on_validation_end" in loop  # nothing required hidden


def test_readme_catalogue_is_the_generated_one(capsys):
    """The catalogue's key table (docs/semantics.md, linked from the README) is generated:
    `posttrain-metrics keys --markdown` between markers."""
    code, out, err = run_cli(capsys, "keys", "--markdown")
    assert code == 0, err
    assert "(docs/semantics.md)" in (ROOT / "README.md").read_text()
    readme = (ROOT / "docs" / "semantics.md").read_text()
    start, end = "<!-- keys:start -->\n", "<!-- keys:end -->"
    block = readme[readme.index(start) + len(start): readme.index(end)]
    assert block == out, "regenerate with: python scripts/sync_readme.py"
