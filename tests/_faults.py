"""Faults made for real in a child process: a full disk is a file-size limit (RLIMIT_FSIZE, with
SIGXFSZ ignored so that a write past it fails with EFBIG instead of killing the process), set and
lifted by the child itself while it runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

DISK = '''
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
_SOFT, _HARD = resource.getrlimit(resource.RLIMIT_FSIZE)


def disk_full(at):
    """From now on no file of this process grows beyond ``at`` bytes (a write past it: EFBIG)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (at, _HARD))


def disk_room():
    resource.setrlimit(resource.RLIMIT_FSIZE, (_SOFT, _HARD))
'''


def run_child(code: str, cwd: Path, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (with :data:`DISK`'s ``disk_full``/``disk_room`` defined) in a fresh interpreter
    that imports this worktree's package; fails the test with its output if it fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).parents[1]),
                                                                     os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run([sys.executable, "-c", DISK + textwrap.dedent(code)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc
