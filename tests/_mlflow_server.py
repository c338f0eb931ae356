"""A real ``mlflow server`` for the tests: SQLite store in a temporary directory, 127.0.0.1, a free port.

Import the fixture where it is used (``from _mlflow_server import mlflow_server  # noqa: F401``) or
from ``tests/conftest.py``; ``tests/`` is on ``sys.path`` under pytest's default import mode.

The server runs in its own process group (``mlflow server`` starts a uvicorn child), so stopping
it terminates the whole group and nothing outlives the session. A server that does not answer
``/health`` within 60 s fails the test with its stderr: it is never skipped.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["HTTP_ENV", "SERVER_STORES", "clean_mlflow_env", "free_port", "mlflow_server", "start_server",
           "stop_server"]

STARTUP_TIMEOUT_S = 60.0
HTTP_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
            "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR")
"""The MLflow variables the MLflow sink reads or sets for its process."""
SERVER_STORES: dict[str, Path] = {}
"""The directory holding each running server's SQLite store, by URI (tests search it for secrets)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, limit: int = 6000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<no stderr: {exc}>"
    return text[-limit:] or "<empty>"


def start_server(root: Path, port: int | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``mlflow server`` with its store, artifacts and logs under ``root``; wait for ``/health``.
    Raises ``RuntimeError`` with the server's stderr when it does not come up."""
    root.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    uri = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        env.pop(var, None)
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{(root / 'mlflow.db').as_posix()}",
        "--default-artifact-root", (root / "artifacts").as_uri(),
        "--artifacts-destination", (root / "mlartifacts").as_uri(),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]
    stderr_path = root / "server.stderr"
    with open(root / "server.stdout", "wb") as out, open(stderr_path, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=err, start_new_session=True)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(
                f"mlflow server exited with code {proc.returncode} before answering {uri}/health.\n"
                f"command: {' '.join(cmd)}\nstderr:\n{_tail(stderr_path)}"
            )
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
                if response.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            stop_server(proc)
            raise RuntimeError(
                f"mlflow server did not answer {uri}/health within {STARTUP_TIMEOUT_S:.0f} s.\n"
                f"command: {' '.join(cmd)}\nstderr:\n{_tail(stderr_path)}"
            )
        time.sleep(0.25)
    SERVER_STORES[uri] = root
    return proc, uri


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_server(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """Terminate the server's process group (the CLI and its uvicorn workers), then kill what is
    left; returns once no process of the group remains."""
    pgid = proc.pid  # start_new_session=True: the server leads its own group
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader so the group can disappear
            if not _group_alive(pgid):
                break
            time.sleep(0.1)
        if not _group_alive(pgid):
            break
    proc.poll()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URI (``http://127.0.0.1:<port>``) of a real MLflow tracking server for the session."""
    root = tmp_path_factory.mktemp("mlflow-server")
    try:
        proc, uri = start_server(root)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield uri
    finally:
        stop_server(proc)
        SERVER_STORES.pop(uri, None)


@pytest.fixture
def clean_mlflow_env() -> Iterator[None]:
    """The MLflow sink sets MLflow's HTTP variables for the process: a test using this starts and ends
    without them (``pytestmark = pytest.mark.usefixtures("clean_mlflow_env")``)."""
    saved = dict(os.environ)
    for var in HTTP_ENV:
        os.environ.pop(var, None)
    yield
    os.environ.clear()
    os.environ.update(saved)
