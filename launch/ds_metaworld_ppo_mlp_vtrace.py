"""MetaWorld with an MLP actor-critic; the trainer recomputes log-probs and values on stored
segments and trains on V-trace targets and policy-gradient advantages (V-trace: "IMPALA: Scalable
Distributed Deep-RL with Importance Weighted Actor-Learner Architectures").

    python launch/ds_metaworld_ppo_mlp_vtrace.py --clip-mode sapo --max-minutes 3
"""
from pathlib import Path

from async_rl.driver import main

if __name__ == "__main__":
    config = Path(__file__).resolve().parents[1] / "configs" / "metaworld_mt1_vtrace.yaml"
    main(str(config), __doc__)
