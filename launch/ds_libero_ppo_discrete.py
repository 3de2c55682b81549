"""PPO on LIBERO with a VLA emitting OpenVLA's discrete action tokens; GAE on the workers; an evaluation worker.

    python launch/ds_libero_ppo_discrete.py --clip-mode soft_clip              # tiny VLA, ~5 min on CPU
    python launch/ds_libero_ppo_discrete.py --config configs/libero_ppo_discrete_gpu_preset.yaml --model-path /path/to/openvla-7b
"""
from pathlib import Path

from async_rl.driver import main

if __name__ == "__main__":
    config = Path(__file__).resolve().parents[1] / "configs" / "libero_ppo_discrete.yaml"
    main(str(config), __doc__)
