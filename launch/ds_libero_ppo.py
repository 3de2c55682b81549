"""PPO on LIBERO with a VLA actor-critic (Gaussian head, LoRA on the language model); GAE on the workers.

    python launch/ds_libero_ppo.py --clip-mode soft_clip                       # tiny VLA, ~5 min on CPU
    python launch/ds_libero_ppo.py --config configs/libero_ppo_gpu_preset.yaml --model-path /path/to/openvla-7b
"""
from pathlib import Path

from async_rl.driver import main

if __name__ == "__main__":
    config = Path(__file__).resolve().parents[1] / "configs" / "libero_ppo.yaml"
    main(str(config), __doc__)
