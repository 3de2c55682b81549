"""Supervised fine-tuning (behaviour cloning) of a policy on recorded demonstrations, with the RL run's
trainer ranks (DeepSpeed ZeRO-2, LoRA, bf16 as configured); it exports the policy for --init-from.

    python -m async_rl.demos record --env libero --suite libero_spatial --tasks 0 1 --episodes 80 \\
        --init-states 0-39 --noise 0.3 --image-size 64 --cameras agentview --out demos/libero_spatial_t01
    python launch/sft.py --demos demos/libero_spatial_t01 --sft-export runs/libero_sft/policy
    python launch/ds_libero_ppo.py --init-from runs/libero_sft/policy

A language-model policy learns from text demonstrations (a JSONL file of {"prompt", "response"}), e.g.
the CTRL critic's format stage:

    python -m async_rl.ctrl.critique_sft --out demos/ctrl_critiques.jsonl
    python launch/sft.py --config configs/ctrl_sft.yaml
    python launch/ds_ctrl_grpo.py --init-from runs/ctrl_sft/policy --env-kwargs '{..., format_check: true}'

The config is an RL config (env, policy, LoRA, precision, train_batch_size, lr_policy) plus the
supervised keys (--demos, --sft-epochs, --sft-export); the default is configs/libero_sft.yaml.
"""
import sys
from pathlib import Path

import ray

from async_rl.config import load_config
from async_rl.driver import console, init_ray, prepare
from async_rl.errors import ActorFailedError, ActorTimeoutError, ConfigError
from async_rl.orchestration.supervised import check_demos, run_supervised, supervised_frames


def main(argv=None) -> dict:
    config = Path(__file__).resolve().parents[1] / "configs" / "libero_sft.yaml"
    try:
        cfg = load_config(argv, str(config), __doc__)
        task_set = prepare(cfg)
        frames = supervised_frames(cfg, task_set, check_demos(cfg))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    init_ray(cfg)
    try:
        return run_supervised(cfg, task_set, frames, console)
    except (ActorFailedError, ActorTimeoutError) as exc:
        console.print(f"supervised fine-tuning stopped: {exc}", style="red", markup=False, soft_wrap=True)
        raise SystemExit(1) from None
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
