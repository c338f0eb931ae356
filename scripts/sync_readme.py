"""Regenerate the README's catalogue table from `posttrain-metrics keys --markdown`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- keys:start -->\n", "<!-- keys:end -->"

table = subprocess.run([sys.executable, "-m", "posttrain_metrics.cli", "keys", "--markdown"],
                       capture_output=True, text=True, check=True).stdout
text = README.read_text()
head, rest = text.split(START, 1)
README.write_text(head + START + table + END + rest.split(END, 1)[1])
print(f"README catalogue: {table.count(chr(10)) - 2} keys")
