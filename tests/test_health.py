"""The doctor: each check fires on a journal built to show its pathology and stays silent on a healthy
one; exit status, --json, and the command line's errors on bad journals."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from _runs import GRPO_ADAPTERS, grpo_run, nonfinite_frame, ppo_run

from posttrain_metrics import Frame
from posttrain_metrics.cli import main
from posttrain_metrics.doctor import (
    CHECKS,
    Doctor,
    Finding,
    Severity,
    config_int,
    exit_status,
    format_findings,
    run_checks,
    step_ranges,
)
from posttrain_metrics.journal import JournalSink, open_journal, read_journal
from posttrain_metrics.publication import Publisher

HEALTHY_CONFIG = {"rl": {"n_mini": 2}, "rollout": {"max_tokens": 16}}


# -- helpers -------------------------------------------------------------------------------------------


def write_journal(
    path: Path,
    frames: Iterable[Frame],
    *,
    adapters: object = GRPO_ADAPTERS,
    config: Mapping[str, object] | None = None,
    failed: bool = False,
) -> Path:
    pub = Publisher([JournalSink(path)], adapters=adapters, run_name="doctor-test", run_id="feedc0de")
    pub.start(dict(HEALTHY_CONFIG if config is None else config))
    for frame in frames:
        pub.publish(frame)
    pub.close(failed=failed)
    return path


def edit(
    frames: list[Frame], changes: Mapping[int, Mapping[str, object]], drop: Iterable[str] = ()
) -> list[Frame]:
    """Copies of ``frames`` with ``changes[step]`` applied to that step's metrics and ``drop`` removed
    everywhere (never mutating the originals)."""
    dropped = set(drop)
    out = []
    for frame in frames:
        metrics = {k: v for k, v in frame.metrics.items() if k not in dropped}
        metrics.update(changes.get(frame.step, {}))
        out.append(Frame(frame.step, metrics, frame.phase, frame.wall_time))
    return out


def every(steps: Iterable[int], **values: object) -> dict[int, dict[str, object]]:
    return {s: {k.replace("__", "/"): v for k, v in values.items()} for s in steps}


def doctor(tmp_path: Path, frames: list[Frame], **kw: object) -> list[Finding]:
    """The findings of the doctor reading the journal held in memory; reading it from disk pass by pass
    (what the run's record does at close) must find the same."""
    path = write_journal(tmp_path / "journal.jsonl", frames, **kw)
    findings = run_checks(read_journal(path))
    assert run_checks(open_journal(path)) == findings
    return findings


def fired(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


def only(findings: list[Finding], check: str) -> Finding:
    hits = fired(findings, check)
    assert len(hits) == 1, (check, findings)
    return hits[0]


def healthy() -> list[Frame]:
    return grpo_run(steps=12)


# -- the healthy run ---------------------------------------------------------------------------------------


def test_healthy_grpo_run_has_only_the_expected_zero_gradient_skip(tmp_path):
    findings = doctor(tmp_path, healthy())
    assert [(f.check, f.severity, f.steps) for f in findings] == [("zero_grad_skips", Severity.INFO, (3,))]
    assert exit_status(findings) == 0


def test_check_table_ids_are_unique_and_documented():
    ids = [c.id for c in CHECKS]
    assert len(ids) == len(set(ids))
    assert all(c.reads and c.threshold for c in CHECKS)


def test_the_doctor_takes_frames_one_at_a_time_and_may_be_asked_after_any(tmp_path):
    # What a live doctor needs (issue 27): fed a frame at a time and asked after each, it ends with
    # the offline doctor's findings, and each finding is there from the frame that fires it on.
    frames = [*nonfinite_skips(healthy(), [5, 6, 7, 8]), nonfinite_frame(13)]
    journal = read_journal(write_journal(tmp_path / "journal.jsonl", frames))
    live = Doctor(journal, CHECKS)
    # truncation and the logprob gap are causal (a baseline of their first 8 points): no first pass;
    # the gap's data and DPO accuracy judge the whole run and still count it first
    assert live.counting == ("logprob_gap_no_data", "dpo_accuracy_flat")
    for frame in journal.frames:
        live.count(frame)
    first: dict[str, int] = {}
    for frame in journal.frames:
        live.see(frame)
        for finding in live.findings():
            first.setdefault(finding.check, frame.step)
    assert live.findings() == run_checks(journal)
    # zero-gradient skip at 3 (the healthy run's); skips with an infinite grad_norm from 5, the third
    # in a row at 7; a NaN loss on an applied update at 13
    assert first == {"zero_grad_skips": 3, "update_skipped": 5, "nonfinite_values": 5,
                     "nonfinite_in_a_row": 7, "nonfinite_applied": 13}


# -- one test per check: fires on the pathology, silent on the healthy run ----------------------------------


def test_clip_frac_nonzero_at_one_minibatch_is_an_error(tmp_path):
    findings = doctor(tmp_path, healthy(), config={"rl": {"n_mini": 1}})
    finding = only(findings, "clip_at_single_minibatch")
    assert finding.severity is Severity.ERROR and finding.steps == tuple(range(1, 13))
    assert "a bug, not tighter training" in finding.explanation and "rl/n_mini = 1" in finding.explanation
    assert exit_status(findings) == 1


def test_zero_clip_at_one_minibatch_is_healthy_and_noise_is_forgiven(tmp_path):
    frames = edit(healthy(), every(range(1, 13), train__clip_frac=0.0, train__ratio_absdev=1e-9))
    findings = doctor(tmp_path, frames, config={"trainer": {"n_minibatches": 1}})
    assert not fired(findings, "clip_at_single_minibatch")


def test_clip_check_is_reported_as_info_when_the_minibatch_count_is_unknown(tmp_path):
    finding = only(doctor(tmp_path, healthy(), config={}), "clip_at_single_minibatch")
    assert finding.severity is Severity.INFO and finding.steps == ()
    assert "not checked" in finding.explanation


def test_ratio_absdev_alone_fires_at_one_minibatch(tmp_path):
    frames = edit(healthy(), {**every(range(1, 13), train__clip_frac=0.0, train__ratio_absdev=0.0),
                              7: {"train/ratio_absdev": 0.01}})
    assert only(doctor(tmp_path, frames, config={"rl": {"n_mini": 1}}), "clip_at_single_minibatch").steps == (7,)


def test_config_int_convention():
    assert config_int({"rl/n_mini": 1}, ("n_mini",)) == (1, "rl/n_mini")
    assert config_int({"a/n_mini": "2", "rl/n_mini": 2.0}, ("n_mini",))[0] == 2
    assert config_int({"a/max_tokens": 64, "rollout/max_tokens": 512}, ("max_tokens",), prefer="rollout") == (
        512, "rollout/max_tokens")
    value, why = config_int({"a/max_tokens": 64, "b/max_tokens": 512}, ("max_tokens",))
    assert value is None and "disagree" in why
    assert config_int({"rl/n_mini": "None"}, ("n_mini",))[0] is None


def test_informative_groups_near_zero(tmp_path):
    frames = edit(healthy(), every([5, 6, 7], train__grpo_informative_group_count=0,
                                   train__grpo_all_zero_group_count=8, optim__zero_grad_skips_total=2))
    finding = only(doctor(tmp_path, frames), "informative_groups_low")
    assert finding.severity is Severity.WARNING and finding.steps == (5, 6, 7)
    assert "zero_grad_skips_total" in finding.explanation and "all 0" in finding.explanation
    assert "not an optimizer" in finding.next_step


def test_a_cold_start_and_solved_prompts_are_info_and_a_run_that_stays_cold_is_a_warning(tmp_path):
    # 8 groups a step (2 ranks x 4): low is <= 0.8 informative, warm is >= 2 (25%)
    cold = {1: {"train/grpo_informative_group_count": 0, "train/grpo_all_zero_group_count": 8},
            2: {"train/grpo_informative_group_count": 0, "train/grpo_all_zero_group_count": 8},
            11: {"train/grpo_informative_group_count": 0, "train/grpo_all_one_group_count": 8}}
    findings = fired(doctor(tmp_path, edit(healthy(), cold)), "informative_groups_low")
    assert [(f.severity, f.steps) for f in findings] == [(Severity.INFO, (1, 2)), (Severity.INFO, (11,))]
    assert "cold start" in findings[0].explanation and "all 1" in findings[1].explanation
    never_warm = {s: {"train/grpo_informative_group_count": 0, "train/grpo_all_zero_group_count": 8}
                  for s in range(1, 26)}
    frames = edit(grpo_run(steps=25), never_warm)
    findings = fired(doctor(tmp_path / "b", frames), "informative_groups_low")
    assert [(f.severity, f.steps) for f in findings] == [(Severity.WARNING, tuple(range(21, 26))),
                                                         (Severity.INFO, tuple(range(1, 21)))]


def test_kl_max_spike_with_a_grad_norm_jump(tmp_path):
    frames = edit(healthy(), {9: {"train/kl_mean": 1e-3, "train/kl_max": 5.0, "train/grad_norm": 40.0}})
    finding = only(doctor(tmp_path, frames), "kl_spike")
    assert finding.severity is Severity.WARNING and finding.steps == (9,)
    assert "rl.kl_coeff_clamp" in finding.next_step


def test_kl_spike_without_a_grad_jump_is_not_the_signature(tmp_path):
    frames = edit(healthy(), {9: {"train/kl_mean": 1e-3, "train/kl_max": 5.0}})
    assert not fired(doctor(tmp_path, frames), "kl_spike")
    no_grad = edit(frames, {}, drop=["train/grad_norm"])
    assert only(doctor(tmp_path / "b", no_grad), "kl_spike").severity is Severity.INFO


def test_truncation_rising_with_response_len_pinned_at_the_budget(tmp_path):
    rising = {s: {"train/rollout_truncated_frac": 0.0 if s <= 3 else 0.05 * s, "train/response_len_max": 16}
              for s in range(1, 13)}
    finding = only(doctor(tmp_path, edit(healthy(), rising)), "length_budget")
    # the baseline is steps 1-8 (TREND_BASELINE), not judged: mean (0*3 + 0.05*(4+5+6+7+8)) / 8 = 0.1875;
    # steps 9-12 read 0.45-0.6 >= 0.1875 + 0.1, at the budget 16 (the first-quarter baseline named 4-12)
    assert finding.severity is Severity.WARNING and finding.steps == tuple(range(9, 13))
    assert "budget 16" in finding.explanation and "rollout/max_tokens" in finding.explanation


def test_truncation_below_the_budget_or_falling_does_not_fire(tmp_path):
    rising = {s: {"train/rollout_truncated_frac": 0.05 * s, "train/response_len_max": 12} for s in range(1, 13)}
    assert not fired(doctor(tmp_path, edit(healthy(), rising)), "length_budget")  # budget is 16
    falling = {s: {"train/rollout_truncated_frac": 0.6 - 0.05 * s, "train/response_len_max": 16}
               for s in range(1, 13)}
    assert not fired(doctor(tmp_path / "b", edit(healthy(), falling)), "length_budget")


def test_truncation_budget_falls_back_to_the_runs_longest_response(tmp_path):
    rising = {s: {"train/rollout_truncated_frac": 0.0 if s <= 3 else 0.3, "train/response_len_max": 20}
              for s in range(1, 13)}
    finding = only(doctor(tmp_path, edit(healthy(), rising), config={"rl": {"n_mini": 2}}), "length_budget")
    # baseline steps 1-8: (0*3 + 0.3*5) / 8 = 0.1875; steps 9-12 read 0.3 >= 0.2875 at the longest so far (20)
    assert finding.steps == tuple(range(9, 13))
    assert "budget 20" in finding.explanation and "longest response" in finding.explanation


def test_rising_logprob_gap(tmp_path):
    frames = edit(healthy(), {s: {"train/logprob_gap_mean": 0.005 * 1.5 ** s} for s in range(1, 13)})
    finding = only(doctor(tmp_path, frames), "logprob_gap_rising")
    assert finding.severity is Severity.WARNING and 12 in finding.steps and 1 not in finding.steps
    # the baseline: the median of steps 1-8, 0.005 x (1.5^4 + 1.5^5) / 2 = 0.005 x 6.328 = 0.03164; the
    # floor max(3 x 0.03164, 0.03164 + 0.02) = 0.09492; step 9 reads 0.005 x 1.5^9 = 0.1922, above it, so
    # steps 9-12 (the baseline's own steps are not judged)
    assert finding.steps == tuple(range(9, 13))
    assert "routing" in finding.explanation


def test_logprob_gap_without_data_is_not_no_gap(tmp_path):
    frames = edit(healthy(), every(range(1, 13), train__logprob_gap_token_count=0, train__logprob_gap_mean=0.0))
    finding = only(doctor(tmp_path, frames), "logprob_gap_no_data")
    assert finding.severity is Severity.INFO and "not for lack of a gap" in finding.explanation
    some = edit(healthy(), every([4, 5], train__logprob_gap_token_count=0))
    finding = only(doctor(tmp_path / "b", some), "logprob_gap_no_data")
    assert finding.severity is Severity.WARNING and finding.steps == (4, 5)
    # a step without loss tokens has nothing to compare: no finding
    masked = edit(healthy(), every([4], train__logprob_gap_token_count=0, train__valid_token_count=0))
    assert not fired(doctor(tmp_path / "c", masked), "logprob_gap_no_data")


def nonfinite_skips(frames: list[Frame], steps: list[int]) -> list[Frame]:
    changes = {}
    total = 0
    for step in range(1, len(frames) + 1):
        if step in steps:
            total += 1
            changes[step] = {"optim/update_outcome": "skipped", "optim/skip_reason": "nonfinite_gradient",
                             "optim/step_skipped": True, "train/grad_norm": math.inf,
                             "optim/nonfinite_skips_consecutive": steps.index(step) + 1}
        changes.setdefault(step, {})["optim/nonfinite_skips_total"] = total
    return edit(frames, changes)


def test_skipped_update_is_an_error_in_grpo(tmp_path):
    findings = doctor(tmp_path, nonfinite_skips(healthy(), [6]))
    finding = only(findings, "update_skipped")
    assert finding.severity is Severity.ERROR and finding.steps == (6,)  # step 3 is a zero-gradient skip
    assert "nonfinite_gradient" in finding.explanation and "fatal" in finding.explanation
    assert only(findings, "zero_grad_skips").steps == (3,)
    assert not fired(findings, "nonfinite_in_a_row")
    assert exit_status(findings) == 1


def test_skip_without_a_zero_gradient_or_reason_is_rejected(tmp_path):
    frames = edit(healthy(), {7: {"optim/update_outcome": "skipped"}})
    assert only(doctor(tmp_path, frames), "update_skipped").steps == (7,)


def test_skipped_update_outside_grpo_is_a_warning(tmp_path):
    frames = []
    for step in range(1, 6):
        metrics: dict[str, object] = {"train/dpo_accuracy": 0.5 + step / 20, "optim/update_outcome": "applied"}
        if step == 2:
            metrics.update({"optim/update_outcome": "skipped", "optim/skip_reason": "nonfinite_loss"})
        frames.append(Frame(step, metrics, "train"))
    finding = only(doctor(tmp_path, frames, adapters=["dpo", "trainer"]), "update_skipped")
    assert finding.severity is Severity.WARNING and finding.steps == (2,)


def test_non_finite_skips_in_a_row(tmp_path):
    findings = doctor(tmp_path, nonfinite_skips(healthy(), [5, 6, 7, 8]))
    finding = only(findings, "nonfinite_in_a_row")
    assert finding.severity is Severity.ERROR and finding.steps == (7, 8)
    assert only(findings, "update_skipped").steps == (5, 6, 7, 8)


def test_non_finite_loss_on_an_applied_update_and_non_finite_values(tmp_path):
    findings = doctor(tmp_path, [*healthy(), nonfinite_frame(13)])
    applied = only(findings, "nonfinite_applied")
    assert applied.severity is Severity.ERROR and applied.steps == (13,) and "train/loss_avg" in applied.keys
    values = only(findings, "nonfinite_values")
    assert values.severity is Severity.WARNING and values.steps == (13,)
    assert set(values.keys) == {"train/loss_avg", "train/kl_max", "train/kl_mean"}


def test_ppo_counters_in_step_and_out_of_step(tmp_path):
    frames = ppo_run(steps=8, warmup=2)
    healthy_findings = doctor(tmp_path, frames, adapters="ppo", config={})
    assert not [f for f in healthy_findings if f.severity is not Severity.INFO], healthy_findings
    broken = edit(frames, {s: {"optim/critic_optimizer_step": s * 2 + (1 if s >= 6 else 0)} for s in range(1, 9)})
    finding = only(doctor(tmp_path / "b", broken, adapters="ppo", config={}), "ppo_counter_mismatch")
    assert finding.severity is Severity.ERROR and finding.steps == (6,)
    assert "policy +2, critic +3" in finding.explanation


def dpo_frames(accuracies: list[float]) -> list[Frame]:
    frames = []
    for step, accuracy in enumerate(accuracies, 1):
        frames.append(Frame(step, {"train/loss_avg": 0.69, "train/dpo_accuracy": accuracy}, "train"))
        frames.append(Frame(step, {"val/loss_avg": 0.69, "val/dpo_accuracy": accuracy}, "val"))
    return frames


def test_dpo_accuracy_not_rising_from_chance(tmp_path):
    flat = doctor(tmp_path, dpo_frames([0.5, 0.52, 0.49, 0.51, 0.5, 0.5, 0.52, 0.51]), adapters="dpo", config={})
    finding = only(flat, "dpo_accuracy_flat")
    assert finding.severity is Severity.WARNING and finding.steps == (7, 8)
    below = only(doctor(tmp_path / "b", dpo_frames([0.5, 0.45, 0.4, 0.35]), adapters="dpo", config={}),
                 "dpo_accuracy_flat")
    assert "swapped" in below.next_step
    rising = doctor(tmp_path / "c", dpo_frames([0.5 + s / 20 for s in range(8)]), adapters="dpo", config={})
    assert rising == []  # train and val frames share steps: that is not a repeated step


def test_large_sc_rho_max(tmp_path):
    quiet = every(range(1, 13), train__sc_rho_max=1.5, train__sc_token_count=100)
    assert not fired(doctor(tmp_path, edit(healthy(), quiet)), "sc_rho_max_large")
    loud = {**quiet, 4: {"train/sc_rho_max": 5e3, "train/sc_token_count": 100}}
    finding = only(doctor(tmp_path / "b", edit(healthy(), loud)), "sc_rho_max_large")
    assert finding.severity is Severity.WARNING and finding.steps == (4,)


def test_steps_that_go_backwards_or_repeat(tmp_path):
    frames = healthy()
    replayed = [*frames[:6], *frames[3:]]  # a resume from step 4's checkpoint
    finding = only(doctor(tmp_path, replayed), "step_order")
    assert finding.severity is Severity.WARNING and finding.steps == (4, 5, 6)
    assert "train step 4 after 6" in finding.explanation


def test_failed_and_unfinished_runs(tmp_path):
    failed = only(doctor(tmp_path, healthy(), failed=True), "run_end")
    assert failed.severity is Severity.WARNING and "failed" in failed.explanation
    path = write_journal(tmp_path / "open.jsonl", healthy())
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))  # no end record: still running, or killed
    assert only(run_checks(read_journal(path)), "run_end").severity is Severity.INFO


def test_journal_with_unregistered_adapter_is_still_checked(tmp_path):
    path = write_journal(tmp_path / "j.jsonl", healthy())
    lines = path.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    header["adapters"] = [*header["adapters"], "my_custom_adapter"]
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    assert [f.check for f in run_checks(read_journal(path))] == ["zero_grad_skips"]


# -- the demo's own trainer: no error-level finding ----------------------------------------------------------


def test_a_real_toy_grpo_run_has_no_error_level_finding(tmp_path):
    from posttrain_metrics.callbacks.generic import MetricsCallback
    from posttrain_metrics.demo.grpo_toy import ToyConfig, train

    callback = MetricsCallback(adapters=["grpo", "reward", "trainer", "validation"], sinks=[{"type": "journal"}],
                               out_dir=tmp_path, run_name="toy")
    train(ToyConfig(steps=24, reward_outage_step=12, val_every=8), callback)
    findings = run_checks(read_journal(tmp_path / "journal.jsonl"))
    assert not [f for f in findings if f.severity is Severity.ERROR], findings
    warnings = [f for f in findings if f.severity is Severity.WARNING]  # the cold start is info
    assert 12 in only(warnings, "informative_groups_low").steps  # the verifier outage
    assert not fired(findings, "clip_at_single_minibatch")  # n_minibatches = 2 is in the config


# -- report, exit status, JSON ------------------------------------------------------------------------------


def test_step_ranges():
    assert step_ranges([40, 12, 13, 14, 15, 16, 17, 18]) == "12-18, 40"
    assert step_ranges([]) == ""
    assert step_ranges([5, 5, 6]) == "5-6"


def test_text_report_groups_findings_by_severity(tmp_path):
    path = write_journal(tmp_path / "j.jsonl", nonfinite_skips(healthy(), [5, 6, 7]), config={"rl": {"n_mini": 1}})
    journal = read_journal(path)
    text = format_findings(run_checks(journal), as_json=False, journal=journal)
    head = text.splitlines()[0]
    assert "doctor-test" in head and "feedc0de" in head and "12 train frames (steps 1-12)" in head
    assert "grpo, reward, trainer" in text
    assert text.index("ERROR (") < text.index("WARNING (") < text.index("INFO (")
    assert "[update_skipped] at steps 5-7" in text and "[clip_at_single_minibatch] at steps 1-12" in text
    assert "next: " in text


def test_healthy_text_report_says_so(tmp_path):
    frames = edit(healthy(), {3: {"optim/update_outcome": "applied", "optim/zero_grad_skips_total": 0}})
    journal = read_journal(write_journal(tmp_path / "j.jsonl", frames))
    assert "healthy: none of the" in format_findings(run_checks(journal), as_json=False, journal=journal)


def test_cli_doctor_exit_status_and_json(tmp_path, capsys):
    good = write_journal(tmp_path / "good.jsonl", healthy())
    assert main(["doctor", str(good)]) == 0
    assert "zero_grad_skips" in capsys.readouterr().out
    bad = write_journal(tmp_path / "bad.jsonl", nonfinite_skips(healthy(), [6]))
    assert main(["doctor", str(bad)]) == 1
    assert "ERROR (1)" in capsys.readouterr().out
    assert main(["doctor", "--json", str(bad)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["exit_status"] == 1 and report["counts"]["error"] >= 1
    assert report["run"]["id"] == "feedc0de" and report["run"]["adapters"] == GRPO_ADAPTERS
    skipped = next(f for f in report["findings"] if f["check"] == "update_skipped")
    assert skipped == {**skipped, "severity": "error", "steps": [6], "step_ranges": "6"}
    assert {c["id"] for c in report["checks"]} == {c.id for c in CHECKS}


# -- the command line on bad journals ----------------------------------------------------------------------


@pytest.mark.parametrize("command", [["doctor"], ["doctor", "--json"], ["plot", "-o", "out.png"]])
def test_cli_missing_file_is_a_clear_error(tmp_path, capsys, command):
    assert main([*command, str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "nope.jsonl" in err and "fix:" in err


@pytest.mark.parametrize("command", [["doctor"], ["plot", "-o", "out.png"]])
def test_cli_unknown_format_version_is_a_clear_error(tmp_path, capsys, command):
    path = write_journal(tmp_path / "j.jsonl", healthy())
    lines = path.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    header["version"] = 99
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    assert main([*command, str(path)]) == 2
    err = capsys.readouterr().err
    assert "version 99" in err and "upgrade posttrain-metrics" in err


def test_cli_torn_last_line_is_reported_and_the_complete_lines_used(tmp_path, capsys):
    path = write_journal(tmp_path / "j.jsonl", healthy())
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-2]) + "\n" + lines[-2][: len(lines[-2]) // 2])  # killed mid-frame
    status = main(["doctor", str(path)])
    assert status == 0  # a warning, not a failure
    captured = capsys.readouterr()
    assert "warning:" in captured.err and "torn last line" in captured.err  # said on stderr
    out = captured.out
    assert "11 train frames (steps 1-11)" in out and "[journal_integrity]" in out and "torn" in out
    assert main(["doctor", "--json", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert any(f["check"] == "journal_integrity" and f["severity"] == "warning" for f in report["findings"])


def test_cli_damaged_journal_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "j.jsonl"
    path.write_text("this is not json\n")
    assert main(["doctor", str(path)]) == 2
    assert "not a journal line" in capsys.readouterr().err


def test_cli_keys_with_an_unknown_adapter_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["keys", "no_such_adapter"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# -- a long run, read pass by pass -----------------------------------------------------------------------


class LongRun:
    """A healthy GRPO-shaped run of ``steps`` frames made on the fly (never held): every key the doctor's
    checks read, the three trend keys (truncation, logprob gap, DPO accuracy) among them, and a logprob
    gap that rises tenfold over the last ``rise`` steps. Counts the passes made over it."""

    def __init__(self, steps: int, rise: int = 5, spikes_without_logprobs: bool = False) -> None:
        self.steps, self.rise, self.passes = steps, rise, 0
        self.spikes_without_logprobs = spikes_without_logprobs  # every step: a KL spike, no jump; a gap count of 0

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        self.passes += 1
        for step in range(1, self.steps + 1):
            gap = 0.05 if step > self.steps - self.rise else 0.005 + (step % 7) * 1e-4
            odd = self.spikes_without_logprobs
            yield Frame(step, {
                "train/clip_frac": 0.1, "train/ratio_absdev": 0.02, "train/grpo_group_count": 8,
                "train/grpo_informative_group_count": 6, "train/grpo_all_zero_group_count": 1,
                "train/grpo_all_one_group_count": 1, "optim/zero_grad_skips_total": 0,
                "train/kl_mean": 1e-3 if odd else 0.01, "train/kl_max": 2.0 if odd else 0.5,
                "train/grad_norm": 1.0 + (step % 5) * 0.1,
                "train/loss_avg": 0.1, "train/rollout_truncated_frac": 0.0, "train/response_len_max": 12,
                "train/logprob_gap_mean": 0.0 if odd else gap, "train/logprob_gap_token_count": 0 if odd else 100,
                "train/valid_token_count": 100, "optim/update_outcome": "applied",
                "optim/nonfinite_skips_total": 0, "optim/nonfinite_skips_consecutive": 0,
                "train/dpo_accuracy": 0.8, "train/sc_rho_max": 1.5, "train/sc_token_count": 10,
                **{f"train/other_{i}": step * 0.5 + i for i in range(30)},  # keys no check reads
            }, "train", 1_700_000_000.0 + step)


class LongJournal:
    """The journal-like shape the doctor reads, around a :class:`LongRun`."""

    def __init__(self, frames: LongRun) -> None:
        self.frames = frames
        self.path = Path("long.jsonl")
        self.header = {"run_id": "long", "name": "long", "adapters": list(GRPO_ADAPTERS)}
        self.end = {"kind": "end", "status": "finished"}
        self.warnings: list[str] = []
        self.run_id, self.adapters = "long", list(GRPO_ADAPTERS)
        self.config = {"rl/n_mini": 2, "rollout/max_tokens": 16}
        self.phases = {}


def doctor_peak(steps: int, **kw: bool) -> tuple[int, list[Finding], int]:
    import tracemalloc

    run = LongRun(steps, **kw)
    journal = LongJournal(run)
    tracemalloc.start()
    try:
        findings = run_checks(journal)  # type: ignore[arg-type]  (the protocol, not the class)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, findings, run.passes


def test_the_doctor_reads_a_long_run_in_two_passes_and_memory_that_grows_only_with_a_quarter_of_its_trends():
    # Held frames would cost ~2 KB a step here (55 keys). The checks keep what they remember: truncation
    # and the gap their first 8 points (TREND_BASELINE: a constant), DPO accuracy its last quarter (16
    # bytes a point of a quarter, 4 a step) and the steps of their findings. 60,000 more steps may then
    # cost 60,000 x 4 bytes, with room for the arrays' growth (x1.25) and a few hundred KB of anything else.
    # (With a first-quarter baseline for truncation and the gap it was 18 bytes a step.)
    short_peak, short, passes = doctor_peak(20_000)
    long_peak, long, long_passes = doctor_peak(80_000)
    assert passes == long_passes == 2  # DPO accuracy and the gap's data count their series first
    assert long_peak - short_peak <= 60_000 * 4 * 1.25 + 300_000, (short_peak, long_peak)
    # ...and the trend series read to the end: the gap's rise over the last five steps is found, there only
    for steps, findings in ((20_000, short), (80_000, long)):
        assert [(f.check, f.steps) for f in findings] == [
            ("logprob_gap_rising", tuple(range(steps - 4, steps + 1)))
        ]
        # the median of steps 1-8, 0.005 + (step % 7) x 1e-4 for step % 7 = 1..6, 0, 1: sorted 0.0050,
        # 0.0051, 0.0051, 0.0052 | 0.0053, ..., so (0.0052 + 0.0053) / 2 = 0.00525 (was the first quarter's
        # 0.0053); the floor max(3 x 0.00525, 0.00525 + 0.02) = 0.02525: only the last five (0.05) exceed it
        assert "rose from 0.00525 to 0.05 nats" in findings[0].explanation


def test_the_doctor_keeps_no_step_a_finding_will_not_name():
    # A KL spike at every step that no grad_norm jump confirms, and a rollout without logprobs (a count
    # of 0 at every step): neither finding names steps, so neither check may keep them (it would cost
    # 8-100 bytes a step); what grows is DPO accuracy's last quarter (16 bytes a point: 4 a step; truncation
    # keeps its first 8 points only, where it kept its first quarter).
    short_peak, short, _ = doctor_peak(20_000, spikes_without_logprobs=True)
    long_peak, long, _ = doctor_peak(80_000, spikes_without_logprobs=True)
    assert long_peak - short_peak <= 60_000 * 4 * 1.25 + 300_000, (short_peak, long_peak)
    for findings in (short, long):
        assert [(f.check, f.severity, f.steps) for f in findings] == [("logprob_gap_no_data", Severity.INFO, ())]
