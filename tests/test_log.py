"""Operational messages go through the ``posttrain_metrics`` logger (issue 26 item 7).

A script that configured no logging still sees them on stderr, one line each (the package's fallback
handler); once the application has a handler on the root logger, they go there only. Every message is
redacted on its way in, like a warning.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest

from posttrain_metrics.core.log import LOGGER, get_logger


@contextlib.contextmanager
def no_root_handlers() -> Iterator[None]:
    """The root logger as a script that never configured logging has it (pytest adds its own when the
    test's call starts, so this is entered in the test's body)."""
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()
    try:
        yield
    finally:
        root.handlers[:] = saved


def test_without_logging_configured_a_record_is_one_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    with no_root_handlers():
        get_logger("publication").warning("sink 'mlflow' failed in write() and is degraded: http://u:pw@host:5000")
    err = capsys.readouterr().err
    assert err == "posttrain-metrics: warning: sink 'mlflow' failed in write() and is degraded: " \
                  "http://u:***REDACTED***@host:5000\n", err


def test_with_a_root_handler_the_application_routes_the_records(caplog: pytest.LogCaptureFixture,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    get_logger("publication").warning("a tracker lags")
    assert capsys.readouterr().err == ""  # the fallback is silent: the root logger has a handler
    [record] = [r for r in caplog.records if r.getMessage() == "a tracker lags"]
    assert record.name == f"{LOGGER}.publication" and record.levelno == logging.WARNING


def test_get_logger_installs_one_fallback_however_often_it_is_called() -> None:
    for _ in range(3):
        get_logger("publication")
    assert len(logging.getLogger(LOGGER).handlers) == 1
