"""Scalars to TensorBoard (always) and SwanLab (offline by default; never a login prompt)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from torch.utils.tensorboard import SummaryWriter


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """{"a": {"b": 1}} -> {"a/b": 1.0}; drops values that are not numbers."""
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[name] = float(value)
    return flat


NONFINITE = "nonfinite/"  # the prefix of a key that counts another key's non-finite values


def mean_metrics(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per-key means over the finite values, and for a key that had non-finite values (a minibatch skipped for a
    NaN loss reports its terms as they came) their count as ``nonfinite/<key>``: nothing is dropped unseen. Keys
    that are such counts already (rows that are means themselves, e.g. one per trainer rank) are summed."""
    out: dict[str, float] = {}
    for key in {k for row in rows for k in row}:
        present = [r[key] for r in rows if key in r]
        if key.startswith(NONFINITE):
            out[key] = out.get(key, 0.0) + sum(present)
            continue
        values = [v for v in present if math.isfinite(v)]
        if values:
            out[key] = sum(values) / len(values)
        if len(values) < len(present):
            out[NONFINITE + key] = out.get(NONFINITE + key, 0.0) + len(present) - len(values)
    return out


# TensorBoard's custom-scalars layout (the "Custom Scalars" tab), written once per run: the tags grouped
# by namespace, several related tags on one chart. Patterns are regular expressions over tag names.
TB_LAYOUT = {
    "train": {"losses": ["Multiline", [r"train/.*loss$"]],
              "clip, ratio, ESS": ["Multiline", [r"train/(clip_frac|ess|ratio_(mean|min|max)|approx_kl)$"]],
              "entropy": ["Multiline", [r"train/entropy"]], "learning rates": ["Multiline", [r"train/lr_"]]},
    "rollout": {"return": ["Multiline", [r"rollout/episode_return$", r"rollout_task/.*/episode_return"]],
                "success": ["Multiline", [r"rollout/success_rate(_recent)?$", r"rollout_task/.*/success_rate"]],
                "env steps/s": ["Multiline", [r"rollout/env_steps_per_sec"]],
                "policy lag": ["Multiline", [r"rollout/policy_lag"]]},
    "eval": {"success": ["Multiline", [r"eval/success_rate", r"eval_task/.*/success_rate"]],
             "return": ["Multiline", [r"eval/return"]], "recording cost (s/episode)": ["Multiline", [r"eval/media_"]]},
    "health": {"restarts, drops, skips": ["Multiline", [r"health/(?!nonfinite/)"]],
               "non-finite values": ["Multiline", [r"health/nonfinite"]]},
    "sync": {"broadcast seconds": ["Multiline", [r"sync/broadcast"]], "policy version": ["Multiline", [r"sync/policy_version"]]},
    "replay": {"buffer": ["Multiline", [r"replay/"]]},
}


class MetricsLogger:
    def __init__(self, log_dir: str, swanlab_mode: str = "offline", config: Mapping[str, Any] | None = None,
                 project: str = "async_rl") -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.tb = SummaryWriter(str(self.log_dir))
        self.tb.add_custom_scalars(TB_LAYOUT)
        self._swanlab = None
        if swanlab_mode != "disabled":
            import swanlab  # noqa: PLC0415 (optional: only runs that log to SwanLab)

            self._swanlab = swanlab.init(project=project, mode=swanlab_mode, logdir=str(self.log_dir / "swanlab"),
                                         config=dict(config or {}))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        flat = flatten(metrics)
        for tag, value in flat.items():
            self.tb.add_scalar(tag, value, step)
        if self._swanlab is not None and flat:
            self._swanlab.log(flat, step=step)

    def histogram(self, tag: str, values: Any, step: int) -> None:
        """A TensorBoard histogram (skipped when there are no values)."""
        if len(values):
            self.tb.add_histogram(tag, np.asarray(values), step)

    def close(self) -> None:
        self.tb.flush()
        self.tb.close()
        if self._swanlab is not None:
            self._swanlab.finish()
            self._swanlab = None
