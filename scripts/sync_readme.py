"""Regenerate the generated blocks: the catalogue table (`posttrain-metrics keys --markdown`) in
docs/semantics.md, and the README's two example blocks (examples/grpo_callback.yaml, the loop of
examples/grpo_loop.py)."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SEMANTICS = ROOT / "docs" / "semantics.md"
FILES = (README, SEMANTICS)  # each holds the markers of some blocks


def example_loop() -> str:
    text = (ROOT / "examples" / "grpo_loop.py").read_text()
    return text.split("# --8<-- [start:loop]\n", 1)[1].split("# --8<-- [end:loop]", 1)[0]


def keys_table() -> str:
    """`posttrain-metrics keys --markdown`, run in this process (the tests call it: no subprocess)."""
    from posttrain_metrics.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["keys", "--markdown"])
    if code != 0:
        raise SystemExit(f"posttrain-metrics keys --markdown exited with {code}")
    return out.getvalue()


def blocks() -> dict[str, str]:
    """What belongs between each pair of markers, by marker name."""
    table = keys_table()
    yaml_text = (ROOT / "examples" / "grpo_callback.yaml").read_text()
    yaml_body = "".join(line for line in yaml_text.splitlines(keepends=True) if not line.startswith("#"))
    return {
        "keys": table,
        "example-yaml": f"```yaml\n{yaml_body}```\n",
        "example-loop": f"```python\n{example_loop()}```\n",
    }


def sync(text: str) -> str:
    """``text`` with every block whose markers it holds regenerated."""
    for name, body in blocks().items():
        start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
        if start not in text:
            continue
        head, rest = text.split(start, 1)
        text = head + start + body + end + rest.split(end, 1)[1]
    return text


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this checkout's package, as `python -m` from the root would import
    for path in FILES:
        path.write_text(sync(path.read_text()))
    print("README examples and docs/semantics.md catalogue regenerated")
