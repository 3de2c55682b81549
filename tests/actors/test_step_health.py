"""Every skipped optimiser step is counted with its origin, non-finite metric values are counted per key, and a run
whose steps are all skipped for ``max_skipped_updates_in_a_row`` steps stops with one line and exit code 1
(``actors/step_health.py``, ``orchestration/metrics.py``, ``driver.main``). The same counters from real DeepSpeed
ranks: tests/actors/test_trainer_skips.py."""
import pytest

from async_rl import driver
from async_rl.actors.step_health import (
    SkipNotes,
    SkippedUpdatesError,
    StepHealth,
    check_skipped_updates,
    skipped_updates_line,
)
from async_rl.config import load_config
from async_rl.errors import ConfigError
from async_rl.orchestration.metrics import training_scalars


def test_each_skipped_step_has_its_origin_and_an_applied_step_ends_the_run_of_skips():
    health = StepHealth()
    health.minibatch("ratio_guard"), health.minibatch("ratio_guard")
    assert not health.window_used()
    health.step_done(applied=False, used_by_a_rank=False)  # the trainer's NaN fill: the guard's skip
    health.minibatch("ratio_guard"), health.minibatch("nonfinite_loss")
    health.step_done(applied=False, used_by_a_rank=False)
    health.minibatch(None), health.minibatch("nonfinite_loss")
    assert health.window_used()
    health.step_done(applied=False, used_by_a_rank=True)  # a minibatch trained, DeepSpeed still skipped: gradients
    m = health.metrics()
    assert m["skipped_updates_in_a_row"] == 3
    assert [m[f"skipped_updates_{o}"] for o in ("ratio_guard", "nonfinite_loss", "gradient_overflow")] == [1, 1, 1]
    assert [m[f"skipped_in_a_row_{o}"] for o in ("ratio_guard", "nonfinite_loss", "gradient_overflow")] == [1, 1, 1]
    health.minibatch(None)
    health.step_done(applied=True, used_by_a_rank=True)
    m = health.metrics()
    assert m["skipped_updates_in_a_row"] == 0 and m["skipped_updates_gradient_overflow"] == 1  # totals stay


def test_an_fp16_loss_scale_overflow_is_counted_but_neither_extends_nor_ends_a_run_of_skips():
    health = StepHealth()
    health.minibatch("ratio_guard")
    health.step_done(applied=False, used_by_a_rank=False, loss_scaling=True)  # the guard's skip counts in fp16 too
    health.minibatch(None)
    health.step_done(applied=False, used_by_a_rank=True, loss_scaling=True)
    m = health.metrics()
    assert m["skipped_updates_loss_scale"] == 1 and m["skipped_updates_in_a_row"] == 1


def test_the_run_stops_at_the_limit_with_one_line_naming_the_origins_and_the_key():
    metrics = {"skipped_updates_in_a_row": 5.0, "skipped_in_a_row_gradient_overflow": 4.0,
               "skipped_in_a_row_ratio_guard": 1.0, "skipped_in_a_row_nonfinite_loss": 0.0}
    assert skipped_updates_line(metrics, 6) is None and skipped_updates_line(metrics, 0) is None  # 0: never stops
    line = skipped_updates_line(metrics, 5)
    assert "\n" not in line and "last 5 optimiser steps were all skipped" in line
    assert "4 by DeepSpeed's overflow check" in line and "1 by the ratio guard" in line and "non-finite loss" not in line
    assert "--max-skipped-updates-in-a-row" in line
    with pytest.raises(SkippedUpdatesError, match="max_skipped_updates_in_a_row=5"):
        check_skipped_updates(metrics, 5)
    check_skipped_updates({"skipped_updates_in_a_row": 0.0}, 1)  # nothing skipped: goes on


def test_the_limit_is_a_config_key_with_a_flag_and_a_default():
    assert load_config([]).max_skipped_updates_in_a_row == 5
    assert load_config(["--max-skipped-updates-in-a-row", "0"]).max_skipped_updates_in_a_row == 0
    with pytest.raises(ConfigError, match="max_skipped_updates_in_a_row"):
        load_config(["--max-skipped-updates-in-a-row", "-1"])


def test_main_ends_a_stopped_run_with_exit_code_1_and_no_traceback(monkeypatch, capsys):
    def stopped(cfg, task_set):  # what run() re-raises once it has printed the line and shut the run down
        raise SkippedUpdatesError(skipped_updates_line({"skipped_updates_in_a_row": 2.0,
                                                        "skipped_in_a_row_ratio_guard": 2.0}, 2))

    monkeypatch.setattr(driver, "prepare", lambda cfg: None)
    monkeypatch.setattr(driver, "run", stopped)
    with pytest.raises(SystemExit) as exit_:
        driver.main("configs/metaworld_mt1_ppo.yaml", argv=["--swanlab-mode", "disabled"])
    assert exit_.value.code == 1 and exit_.value.__suppress_context__
    assert "Traceback" not in capsys.readouterr().err


def test_counters_reach_the_health_namespace_and_the_console_names_new_skips():
    metrics = {"loss": 0.5, "skipped_updates": 3.0, "skipped_updates_in_a_row": 2.0,
               "skipped_updates_gradient_overflow": 2.0, "nonfinite/loss": 2.0, "nonfinite/kl": 1.0}
    tags = training_scalars(metrics, 7)
    assert tags["health/skipped_updates_in_a_row"] == 2 and tags["health/skipped_updates_gradient_overflow"] == 2
    assert tags["health/nonfinite/loss"] == 2 and tags["health/nonfinite_values"] == 3 and tags["train/loss"] == 0.5
    assert training_scalars({"loss": 0.5}, 7)["health/nonfinite_values"] == 0  # there before anything goes wrong
    notes = SkipNotes()
    line = notes.line(metrics, 4)
    assert line.startswith("epoch 4: 2 optimiser step(s) skipped by DeepSpeed's overflow check")
    assert "non-finite values: kl x1, loss x2" in line
    assert notes.line({**metrics, "nonfinite/loss": 0.0, "nonfinite/kl": 0.0}, 5) is None  # nothing new
    assert notes.line({"skipped_updates_gradient_overflow": 3.0, "nonfinite/kl": 1.0}, 6) == \
        "epoch 6: 1 optimiser step(s) skipped by DeepSpeed's overflow check (finite loss, non-finite gradients); " \
        "non-finite values: kl x1"
