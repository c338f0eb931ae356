"""Regenerate the README's generated blocks: the catalogue table (`posttrain-metrics keys --markdown`)
and the two example blocks (examples/grpo_callback.yaml, the loop of examples/grpo_loop.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def example_loop() -> str:
    text = (ROOT / "examples" / "grpo_loop.py").read_text()
    return text.split("# --8<-- [start:loop]\n", 1)[1].split("# --8<-- [end:loop]", 1)[0]


def blocks() -> dict[str, str]:
    """What belongs between each pair of markers, by marker name."""
    table = subprocess.run([sys.executable, "-m", "posttrain_metrics.cli", "keys", "--markdown"],
                           capture_output=True, text=True, check=True).stdout
    yaml_text = (ROOT / "examples" / "grpo_callback.yaml").read_text()
    yaml_body = "".join(line for line in yaml_text.splitlines(keepends=True) if not line.startswith("#"))
    return {
        "keys": table,
        "example-yaml": f"```yaml\n{yaml_body}```\n",
        "example-loop": f"```python\n{example_loop()}```\n",
    }


def sync(text: str) -> str:
    for name, body in blocks().items():
        start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
        head, rest = text.split(start, 1)
        text = head + start + body + end + rest.split(end, 1)[1]
    return text


if __name__ == "__main__":
    README.write_text(sync(README.read_text()))
    print("README: catalogue and examples regenerated")
