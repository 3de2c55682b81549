"""MetricsReporter: names what the actors report and hands it to TensorBoard / SwanLab.

No whitelist: every number a trainer returns reaches TensorBoard under ``train/`` (a new loss
diagnostic needs no change here); only the few keys that describe something else are routed
to their own namespace."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Mapping

from rich.console import Console

from async_rl.logger import NONFINITE, MetricsLogger
from async_rl.media import log_videos

if TYPE_CHECKING:
    from async_rl.config.schema import RunConfig

# Trainer keys that are not training diagnostics: where they go instead of train/<key>.
TRAINER_ROUTES = {
    "policy_lag_mean": "rollout/policy_lag",
    "policy_lag_max": "rollout/policy_lag_max",
    "skipped_updates": "health/skipped_updates",
    "skipped_minibatches": "health/skipped_minibatches",
    "broadcast_seconds": "sync/broadcast_seconds",
    "data_waits": "health/data_waits",  # epochs whose super-batch was not ready (max_sample_reuse, slow workers)
    "data_wait_seconds": "health/data_wait_seconds",
}
# Health counters shown from the start (as 0) so that a dashboard has them before anything fails.
HEALTH_KEYS = ("worker_restarts", "inference_restarts", "evaluator_restarts", "replay_restarts", "dropped_episodes",
               "backpressure_waits", "backpressure_wait_ms")  # the last two: generation held back (actors/backpressure.py)
# The status line's success is the running one (last 100 episodes): a few seconds' window is 0 or 1 on LIBERO.
STATUS_FIELDS = (("rollout/env_steps_per_sec", "{:.0f} steps/s"), ("rollout/success_rate_recent", "success {:.2f}"),
                 ("eval/success_rate", "eval {:.2f}"), ("rollout/episode_return", "return {:.1f}"),
                 ("train/policy_loss", "pl {:.3f}"), ("rollout/policy_lag", "lag {:.1f}"))


# Trainer keys by prefix that are health counters too: the skipped optimiser steps by origin and in a row
# (actors/step_health.py), the non-finite values of each key (logger.mean_metrics).
HEALTH_PREFIXES = ("skipped_", NONFINITE)


def training_scalars(metrics: Mapping[str, Any], policy_version: int) -> dict[str, float]:
    """One epoch's trainer metrics (mean over ranks) as tags; ``health/nonfinite_values`` counts every non-finite
    value the epoch's metrics held (0 when none: the tag is there before anything goes wrong)."""
    def tag(key: str) -> str:
        return TRAINER_ROUTES.get(key) or (f"health/{key}" if key.startswith(HEALTH_PREFIXES) else f"train/{key}")

    out = {tag(k): v for k, v in metrics.items() if isinstance(v, (int, float))}
    out.setdefault("health/skipped_updates", 0)
    out["health/nonfinite_values"] = sum(v for k, v in metrics.items() if k.startswith(NONFINITE))
    out["sync/policy_version"] = policy_version
    return out


def snapshot_scalars(snap: Mapping[str, Any]) -> dict[str, float]:
    """Rollout statistics, replay counters, health, env counters, reward components and inference batching as tags."""
    stats, out = snap["stats"], {}
    out["rollout/env_steps_per_sec"] = stats["env_steps_per_sec"]
    out["rollout/total_env_steps"] = stats["total_env_steps"]
    for key in ("episode_return", "episode_length", "success_rate", "success_rate_recent", "recent_episodes",
                "completions_per_sec", "completion_tokens"):  # the last two: text envs (mean tokens per completion)
        if key in stats:
            out[f"rollout/{key}"] = stats[key]
    for task, row in stats["tasks"].items():
        out[f"rollout_task/{task}/success_rate"] = row["success_rate"]
        out[f"rollout_task/{task}/episode_return"] = row["episode_return"]
    out.update({f"replay/{k}": v for k, v in snap["replay"].items() if isinstance(v, (int, float))})
    health = {**dict.fromkeys(HEALTH_KEYS, 0), **stats.get("health", {})}
    out.update({f"health/{k}": v for k, v in health.items()})
    out.update({f"env/{k}": v for k, v in stats.get("env_counters", {}).items()})
    for name, row in stats.get("reward_components", {}).items():  # text envs: each reward function, and the total
        out[f"reward/{name}"], out[f"reward/{name}_std"] = row["mean"], row["std"]
    out.update({f"inference/{k}": v for k, v in snap["inference"].items()})
    return out


def eval_scalars(result: Mapping[str, Any]) -> dict[str, float]:
    """An evaluation's per-task and mean success rate and return."""
    tasks = result["tasks"]
    out = {f"eval_task/{t}/success_rate": r["success_rate"] for t, r in tasks.items()}
    out["eval/success_rate"] = sum(r["success_rate"] for r in tasks.values()) / len(tasks)
    out["eval/return"] = sum(r["return"] for r in tasks.values()) / len(tasks)
    return out


# Text envs (one step per completion): completions/s and their mean length in place of steps/s.
TEXT_STATUS_FIELDS = (("rollout/completions_per_sec", "{:.2f} completions/s"), ("rollout/completion_tokens", "{:.0f} tokens"))


def status_line(s: Mapping[str, Any]) -> str:
    fields: tuple[tuple[str, str], ...] = STATUS_FIELDS
    if "rollout/completions_per_sec" in s:
        fields = (*TEXT_STATUS_FIELDS, *(field for field in STATUS_FIELDS if field[0] != "rollout/env_steps_per_sec"))
    parts = [f"v{int(s.get('sync/policy_version', 0))}"]
    parts += [fmt.format(s[key]) for key, fmt in fields if key in s]
    return "  ".join(parts)


class MetricsReporter:
    """Logs scalars by epoch and keeps the latest value of every tag (the run's summary)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.logger = MetricsLogger(cfg.log_dir, cfg.swanlab_mode, cfg.model_dump())
        self.latest: dict[str, Any] = {}
        self.log_dir, self.video_fps = cfg.log_dir, cfg.video_fps

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.logger.log(scalars, step)
        self.latest.update(scalars)

    def log_before_training(self, scalars: Mapping[str, float]) -> None:
        """The initial weights' evaluation at step 0, kept out of ``latest``: a run's summary holds its trained
        policy's figures, never the initial ones in place of a final evaluation that did not happen."""
        self.logger.log(scalars, 0)

    def histogram(self, tag: str, values: Any, step: int) -> None:
        self.logger.histogram(tag, values, step)

    def evaluation(self, result: Mapping[str, Any], step: int) -> dict[str, float]:
        """An evaluation's scalars (``eval_scalars``); its episode videos, if any, go to TensorBoard
        and to <log_dir>/videos/ now, with what recording cost per episode (eval/media_seconds_*)."""
        scalars = eval_scalars(result)
        if result.get("videos"):
            began = time.perf_counter()
            try:
                log_videos(self.logger.tb, result["videos"], step, self.log_dir, self.video_fps)
            except Exception as exc:  # noqa: BLE001  (a video that cannot be written must not end the run)
                Console(stderr=True).print(f"episode videos not written: {exc!r}", style="yellow", markup=False)
            scalars["eval/media_seconds_render_per_episode"] = result["media_seconds_per_episode"]
            scalars["eval/media_seconds_write_per_episode"] = (time.perf_counter() - began) / len(result["videos"])
        return scalars

    def text(self, tag: str, text: str, step: int) -> None:
        """A text panel (e.g. an evaluation table; shown in TensorBoard's text tab as markdown)."""
        self.logger.tb.add_text(tag, text, step)

    def status(self) -> str:
        return status_line(self.latest)

    def close(self) -> None:
        self.logger.close()
