"""The run report's tables: the final metrics as windowed means beside the last value, and each evaluation's
first and last figure. Event files are written here through the project's logger; every expected figure is
computed by hand for a window of 10 points."""
from pathlib import Path

from async_rl.logger import MetricsLogger
from async_rl.report import WINDOW, write_report


def _write_run(log_dir: Path, successes: list[float], evaluations: dict[str, list[tuple[int, float]]]) -> None:
    logger = MetricsLogger(str(log_dir), "disabled", {})
    for step, success in enumerate(successes):
        logger.log({"rollout/success_rate": success, "rollout/episode_return": float(step),
                    "rollout/total_env_steps": 100.0 * (step + 1)}, step)
    for step, loss in ((17, 0.3), (18, 0.2), (19, 0.1)):  # a metric with fewer points than the window
        logger.log({"train/policy_loss": loss}, step)
    for tag, points in evaluations.items():
        for step, value in points:
            logger.log({tag: value}, step)
    logger.close()


EVALUATIONS = {"eval/success_rate": [(5, 0.5), (10, 0.7), (15, 0.65)], "eval/heldout_reward": [(0, 0.25), (19, 0.5)],
               "eval/heldout_reward/format": [(0, 1.0), (19, 0.75)], "eval/final_only": [(19, 0.75)]}


def test_final_metrics_are_the_mean_of_the_last_points_with_their_epochs_beside_the_last_value(tmp_path):
    assert WINDOW == 10  # the figures below are for a window of 10 points
    # 20 epochs (0-19) of success 1, 0, 1, 0, ...: the last window (epochs 10-19) means 0.5, the last point reads 0.
    _write_run(tmp_path, [1.0, 0.0] * 10, EVALUATIONS)
    text = write_report([tmp_path]).read_text()
    assert "| metric | mean of the last 10 points | their epochs | last value |" in text, text
    assert "| rollout/success_rate | 0.5 | 10-19 (10 points) | 0 (epoch 19) |" in text, text
    assert "| rollout/episode_return | 14.5 | 10-19 (10 points) | 19 (epoch 19) |" in text, text  # (10 + ... + 19) / 10
    assert "| train/policy_loss | 0.2 | 17-19 (3 points) | 0.1 (epoch 19) |" in text, text
    assert "| rollout/total_env_steps | - | - | 2000 (epoch 19) |" in text, text  # a running total: never a mean


def test_evaluations_show_the_first_and_the_last_figure_and_the_change(tmp_path):
    _write_run(tmp_path, [1.0, 0.0] * 10, EVALUATIONS)
    text = write_report([tmp_path]).read_text()
    rows = [line for line in text.splitlines() if line.startswith("| eval/")]
    assert rows == ["| eval/final_only | - | 0.75 (epoch 19) | - |",  # evaluated once: no earlier figure
                    "| eval/heldout_reward | 0.25 (epoch 0) | 0.5 (epoch 19) | +0.25 |",
                    "| eval/success_rate | 0.5 (epoch 5) | 0.65 (epoch 15) | +0.15 |",
                    "| eval/heldout_reward/format | 1 (epoch 0) | 0.75 (epoch 19) | -0.25 |"], text
    assert "| metric | first (epoch) | last (epoch) | change |" in text


def test_several_runs_have_a_row_each_named_by_a_run_column(tmp_path):
    _write_run(tmp_path / "a", [1.0, 0.0] * 10, EVALUATIONS)
    _write_run(tmp_path / "b", [0.0] * 5 + [1.0] * 3, {"eval/success_rate": [(0, 0.2), (7, 0.4)]})
    text = write_report([tmp_path / "a", tmp_path / "b"], tmp_path / "cmp").read_text()
    assert "| metric | run | mean of the last 10 points | their epochs | last value |" in text, text
    assert "| rollout/success_rate | a | 0.5 | 10-19 (10 points) | 0 (epoch 19) |" in text, text
    # run b logged 8 points (epochs 0-7): all of them, 3 successes in 8
    assert "| rollout/success_rate | b | 0.375 | 0-7 (8 points) | 1 (epoch 7) |" in text, text
    assert "| eval/success_rate | b | 0.2 (epoch 0) | 0.4 (epoch 7) | +0.2 |" in text, text
    assert "| eval/final_only | a | - | 0.75 (epoch 19) | - |" in text and "| eval/final_only | b |" not in text, text
