"""Test tiers: what ``pytest -m "not slow"`` (the fast tier) may not do, and the check that it doesn't.

A test is ``slow`` when it starts a server, a subprocess or a gloo world, or is long by itself. It
is marked here at collection, by the fixture it uses (``SLOW_FIXTURES``), a parameter
(``SLOW_PARAMS``) or its id (``SPAWNS``, ``LONG``); or by ``pytestmark = pytest.mark.slow`` in a
module whose tests all spawn; or by ``@pytest.mark.slow`` on the test.

The check: while a test that is not marked slow runs (setup, call and teardown), starting a process
(``subprocess.Popen``, ``os.fork``/``posix_spawn``/``system``/``exec*``, a ``multiprocessing``
process: torch.multiprocessing, ray, wandb-core, ``mlflow server``, our publisher process) raises,
and the test fails even if the code under test caught the error, with the fix: mark it slow. A
torch.distributed process group that the test initialised and left open fails it the same way. So
the fast tier starts nothing by construction, and a new test that spawns must say so. This file is
at the root (not in ``tests/``) so that it covers the package's doctests too.
"""

from __future__ import annotations

import multiprocessing.process
import platform
import sys
from collections.abc import Iterator
from typing import Any

import pytest

# platform.uname()'s processor runs `uname -p` once per process, on first use: MLflow's telemetry asks
# for it when mlflow is first imported, so whichever fast test imported mlflow first would be flagged.
# Asked here, before any test, the answer is cached.
platform.uname().processor  # noqa: B018

SLOW_FIXTURES = frozenset({"mlflow_server"})
"""Fixtures that start a server (or a process) for the test that uses them."""

SLOW_PARAMS = frozenset({("backend", "server"), ("mode", "process")})
"""Parameters that start one: a real ``mlflow server`` backend, the publisher process mode."""

SPAWNS = frozenset({
    # a test id without [params] covers all its parameters
    "tests/test_counters_in_step.py::test_gloo_ranks_raise_together_and_stay_in_step",
    "tests/test_run_folder.py::test_a_resumed_run_waits_for_its_previous_attempts_publisher_instead_of_failing",
    "tests/test_export.py::test_export_to_mlflow_and_wandb_is_as_quiet_as_a_live_run",
    "tests/test_integrations_mlflow.py::test_the_run_spans_the_training_not_the_publishers_drain",
    "tests/test_redaction.py::test_the_publisher_process_log_is_private_and_holds_no_uri_password",
    "tests/test_redaction.py::test_what_trackers_store_besides_the_config_is_redacted_and_read_back",
    "tests/test_run_aggregates.py::test_every_tracker_shows_the_declared_run_aggregates",
    "tests/test_samples_trust.py::test_four_gloo_ranks_choose_as_one_process_would",
    "tests/test_samples_trust.py::test_two_gloo_ranks_choose_over_the_whole_batch_and_fail_together",
    "tests/test_bad_input.py::test_a_collective_that_fails_says_which_the_step_and_the_fix",
    "tests/test_bad_input.py::test_an_empty_window_is_in_the_journal_only",
    "tests/test_bad_input.py::test_export_to_a_dead_mlflow_server_fails_within_the_live_sinks_retries",
    "tests/test_bad_input.py::test_names_a_backend_rejects_are_mapped_by_mlflow_only_and_kept_elsewhere",
    "tests/test_bad_input.py::test_reduce_called_by_only_some_ranks_times_out_with_a_clear_error",
    "tests/test_bad_input.py::test_steps_that_go_backwards_or_repeat_are_kept_by_every_sink",
    "tests/test_callbacks_lightning.py::test_ddp_two_gloo_ranks_token_weighted_key_is_exact_where_sync_dist_is_not",
    "tests/test_callbacks_transformers.py::test_missing_transformers_names_the_install_line",
    "tests/test_callbacks_transformers.py::test_trainer_two_gloo_ranks_maps_logged_keys_and_reduces_micro_batches_exactly",
    "tests/test_callbacks_transformers.py::test_trl_grpo_trainer_publishes_headline_keys_under_our_names",
    "tests/test_console.py::test_demo_help_states_the_demos_defaults",
    "tests/test_console.py::test_publisher_process_output_goes_to_its_log_and_our_warnings_to_stderr",
    "tests/test_console.py::test_version",
    "tests/test_export.py::test_a_run_that_never_closed_exports_as_killed_everywhere",
    "tests/test_export.py::test_a_torn_journal_exports_its_complete_lines",
    "tests/test_export.py::test_export_finds_what_the_live_sinks_already_wrote",
    "tests/test_export.py::test_export_is_resumable_after_a_partial_export",
    "tests/test_export.py::test_export_to_tensorboard_equals_live_and_is_idempotent",
    "tests/test_export.py::test_export_to_wandb_equals_live_and_is_idempotent",
    "tests/test_export.py::test_export_to_wandb_takes_project_and_entity",
    "tests/test_extra.py::test_two_gloo_ranks_reduce_user_keys_exactly_and_refuse_different_declarations",
    "tests/test_fuzz.py::test_with_ci_set_the_profile_is_derandomized_in_a_fresh_process",
    "tests/test_import_light.py::test_import_loads_no_heavy_module",
    "tests/test_integrations_mlflow.py::test_dpo_train_and_val",
    "tests/test_integrations_mlflow.py::test_ppo_critic_warmup_has_no_policy_points",
    "tests/test_integrations_mlflow.py::test_resumed_run_continues_the_same_mlflow_run",
    "tests/test_integrations_mlflow.py::test_run_aggregates_are_logged_at_close",
    "tests/test_integrations_mlflow.py::test_secrets_are_nowhere",
    "tests/test_integrations_tensorboard.py::test_a_full_disk_that_clears_leaves_each_step_once_in_the_event_file",
    "tests/test_integrations_tensorboard.py::test_a_killed_run_is_readable_up_to_its_last_step",
    "tests/test_integrations_tensorboard.py::test_constructing_the_sink_imports_no_tensorboard",
    "tests/test_publication.py::test_interpreter_exit_after_a_crash_records_a_failed_run",
    "tests/test_tracker_failures.py::test_a_killed_mlflow_server_restarted_later_holds_every_step_once",
    "tests/test_tracker_failures.py::test_a_killed_publisher_is_restarted_and_every_tracker_ends_complete",
    "tests/test_tracker_failures.py::test_a_trainer_killed_at_a_random_step_leaves_every_tracker_complete_and_the_run_killed",
    "tests/test_tracker_failures.py::test_the_publisher_process_yields_the_cores_to_the_trainer",
    "tests/test_run_folder.py::test_a_killed_runs_publisher_still_draining_holds_the_folder_until_it_exits",
    "tests/test_run_folder.py::test_a_second_trainer_is_refused_while_a_run_is_live_and_a_killed_run_frees_the_folder",
    "tests/test_run_folder.py::test_a_users_tensorboard_py_and_mlflow_py_in_the_working_directory_do_not_stop_the_trackers",
    "tests/test_run_folder.py::test_in_thread_mode_the_run_holds_its_folder_until_the_follower_thread_is_done",
    "tests/test_samples.py::test_a_samples_file_that_cannot_be_written_is_logged_once_and_training_goes_on",
    "tests/test_samples.py::test_two_gloo_ranks_send_their_rows_to_rank_0",
})
"""Tests that start a process or a gloo world themselves (modules where all do say so in ``pytestmark``).
Kept here rather than as decorators so that the marks live in one place; the guard below keeps it true."""

LONG = frozenset({
    # in-process but long (> ~3 s on a loaded 2-core machine): long runs, big journals, many examples
    "tests/test_health.py::test_the_doctor_reads_a_long_run_in_two_passes_and_memory_that_grows_only_with_a_quarter_of_its_trends",
    "tests/test_health.py::test_the_doctor_keeps_no_step_a_finding_will_not_name",
    "tests/test_export.py::test_export_reads_the_journal_a_batch_at_a_time_whatever_its_length",
    "tests/test_export.py::test_publish_by_hand_finishes_what_a_stopped_publisher_left",
    "tests/test_export.py::test_an_export_into_mlflow_larger_than_the_sinks_live_backlog_loses_nothing",
    "tests/test_export.py::test_a_long_journal_exports_every_frame_and_label_only_frames_once",
    "tests/test_bad_input.py::test_a_relative_mlflow_uri_resolves_under_out_dir_and_an_absolute_one_is_kept",
    "tests/test_integrations_mlflow.py::test_a_store_locked_by_another_writer_is_waited_for",
    "tests/test_extra.py::test_export_and_doctor_rebuild_user_keys_from_the_journal",
    "tests/test_callback.py::test_the_callback_reports_the_trackers_run_handles",
    "tests/test_fuzz.py::test_random_windows_raise_only_metrics_error_and_lose_nothing",
    "tests/test_fuzz.py::test_random_journal_lines_raise_only_metrics_error",
    "tests/test_fuzz.py::test_the_inline_fast_path_packs_exactly_what_the_general_path_packs",
    "tests/test_plot.py::test_the_dashboards_data_takes_memory_bounded_whatever_the_runs_length",
    "tests/test_reduction_oracle.py::test_repartition_does_not_change_invariant_reductions",
    "tests/test_bad_input.py::test_redaction_is_linear_time_on_hostile_and_plain_text",
    "tests/test_fuzz.py::test_journal_frames_read_as_json_reads_them_whichever_parser_reads",
    "tests/test_plot.py::test_grpo_dashboard_with_findings_and_non_finite_points",
    "tests/test_tracker_failures.py::test_the_publishers_report_says_recording_while_it_writes_the_runs_record",
    "tests/test_tracker_failures.py::test_a_hostile_journal_is_refused_or_harmless_and_writes_nothing_outside[name traversal]",
})

_SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                           "os.system", "os.exec", "pty.spawn"})


class _Guard:
    """On while a test that is not slow runs; records what it tried to start."""

    on = False
    attempts: list[str] = []  # noqa: RUF012  (one guard per session, reset per test phase)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _Guard.on and event in _SPAWN_EVENTS:
        what = f"{event}{args[:2]!r}"
        _Guard.attempts.append(what)
        raise RuntimeError(f"a test not marked slow started a process ({what}); mark it @pytest.mark.slow")


sys.addaudithook(_audit)  # multiprocessing's spawn raises no audit event: its start() is patched below
_start = multiprocessing.process.BaseProcess.start


def _guarded_start(self: multiprocessing.process.BaseProcess) -> None:
    if _Guard.on:
        what = f"multiprocessing {type(self).__name__}({self.name})"
        _Guard.attempts.append(what)
        raise RuntimeError(f"a test not marked slow started a process ({what}); mark it @pytest.mark.slow")
    _start(self)


multiprocessing.process.BaseProcess.start = _guarded_start  # type: ignore[method-assign]


def _is_slow(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    params = callspec.params.items() if callspec is not None else ()
    return bool(SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ()))
                or SLOW_PARAMS.intersection((k, v) for k, v in params if isinstance(v, str))
                or {item.nodeid, item.nodeid.split("[")[0]} & (SPAWNS | LONG))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)


def _guarded(item: pytest.Item) -> Iterator[None]:
    _Guard.on = item.get_closest_marker("slow") is None
    try:
        yield
    finally:
        _Guard.on = False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _guarded(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    grouped = _group_open()
    yield from _guarded(item)
    if item.get_closest_marker("slow") is None and not grouped and _group_open():
        _Guard.attempts.append("it initialised a torch.distributed process group")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _guarded(item)


def _group_open() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if item.get_closest_marker("slow") is not None:
        _Guard.attempts.clear()
        return
    problems = list(_Guard.attempts)
    _Guard.attempts.clear()
    if problems:
        report.outcome = "failed"
        report.longrepr = (f"{report.longrepr or ''}\n[tiers] this test is not marked slow but: "
                           + "; ".join(problems) + ". Mark it @pytest.mark.slow (see conftest.py).")


class _PackageRecords(__import__("logging").Handler):
    """Every record of the ``posttrain_metrics`` loggers, in order (:func:`package_log`)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[Any] = []

    def emit(self, record: Any) -> None:
        self.records.append(record)

    @property
    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@pytest.fixture
def package_log() -> Iterator[_PackageRecords]:
    """The package's log records from INFO up, captured on the ``posttrain_metrics`` logger itself.
    pytest's ``caplog`` listens on the root logger, whose handlers a library may replace: MLflow 3.5
    runs alembic's ``fileConfig`` when it creates a SQLite store, which drops every root handler,
    caplog's among them. A handler on our own logger sees our records whatever the root does."""
    import logging

    logger = logging.getLogger("posttrain_metrics")
    handler, level = _PackageRecords(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
