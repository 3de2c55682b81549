"""PPO on MetaWorld with an MLP actor-critic; GAE advantages computed on the rollout workers.

    python launch/ds_metaworld_ppo_mlp.py --clip-mode soft_clip --max-minutes 3
"""
from pathlib import Path

from async_rl.driver import main

if __name__ == "__main__":
    config = Path(__file__).resolve().parents[1] / "configs" / "metaworld_mt1_ppo.yaml"
    main(str(config), __doc__)
