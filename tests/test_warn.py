"""core/warn.py: our warnings show as one line of ours and stay ordinary warnings for filters and
pytest (issue 30, item 11: ``publisher.py:507: UserWarning:`` then the calling code was shown)."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from posttrain_metrics.core.warn import PosttrainMetricsWarning, one_line, warn

ROOT = Path(__file__).resolve().parent.parent


def shown(record: warnings.WarningMessage) -> str:
    """What Python prints for a recorded warning (``showwarning`` formats with ``formatwarning``)."""
    return warnings.formatwarning(str(record.message), record.category, record.filename, record.lineno, record.line)


def test_ours_is_one_line_of_ours_and_anyone_elses_keeps_pythons_form() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn("mlflow: the server at http://u:hunter2@h:5000 is down")
        warnings.warn("a library's own warning", UserWarning, stacklevel=1)
    ours, theirs = caught
    assert shown(ours) == "posttrain-metrics: mlflow: the server at http://u:***REDACTED***@h:5000 is down\n"
    assert theirs.category is UserWarning
    text = shown(theirs)
    assert text.startswith(f"{__file__}:") and ": UserWarning: a library's own warning\n" in text


def test_filters_on_user_warning_its_message_or_our_category_select_ours() -> None:
    for spec in ({"category": UserWarning}, {"message": "disk"}, {"category": PosttrainMetricsWarning},
                 {"module": __name__}):  # module: the caller's, as stacklevel says
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", **spec)
            warn("disk full")
        assert caught == [], spec
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        with pytest.raises(UserWarning, match=r"^disk full$"):
            warn("disk full")


def test_pytest_warns_catches_ours_by_user_warning_and_by_the_given_category() -> None:
    with pytest.warns(UserWarning, match="redacted"):
        warn("redacted")
    with pytest.warns(RuntimeWarning, match="clock") as record:
        warn("clock went back", RuntimeWarning)
    (got,) = record
    assert issubclass(got.category, PosttrainMetricsWarning) and issubclass(got.category, RuntimeWarning)
    assert shown(got) == "posttrain-metrics: clock went back\n"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=RuntimeWarning)
        warn("clock went back", RuntimeWarning)
        warn("still shown")
    assert [str(w.message) for w in caught] == ["still shown"]


def test_the_stack_level_still_names_the_callers_line() -> None:
    """The one-line form hides the place, but a filter by module and a log handler still get it."""
    def helper() -> None:
        warn("from the helper's caller", stacklevel=2)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        helper(); line = sys._getframe().f_lineno  # noqa: E702  (the caller's line)
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_one_line_leaves_a_formatter_set_before_us_to_format_the_rest() -> None:
    assert one_line("x", DeprecationWarning, "f.py", 3) == "f.py:3: DeprecationWarning: x\n"
    assert one_line("x", PosttrainMetricsWarning, "f.py", 3, "source line") == "posttrain-metrics: x\n"


@pytest.mark.slow  # a child Python: what a user's terminal shows
def test_a_users_terminal_shows_one_line_per_warning(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("from posttrain_metrics.core.warn import warn\n\n"
                      "def publish():\n    warn('sink mlflow failed in write()')\n\npublish()\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stderr == "posttrain-metrics: sink mlflow failed in write()\n"
    quiet = subprocess.run([sys.executable, "-W", "ignore::UserWarning", str(script)], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert quiet.returncode == 0 and quiet.stderr == ""
