"""PPO on CompilerGym LLVM pass ordering: --policy mlp (one pass per step, the default) or
--policy passformer (a seq2seq model writes a whole pass sequence; configs/compilergym_passformer.yaml,
chosen by the variant in configs/compilergym_mlp.yaml). After training, the final weights are
evaluated on held-out programs against -Oz and random search (table, eval/ scalars, eval_programs.json).

    python launch/ds_compilergym_ppo.py --policy passformer --max-minutes 5
"""
from pathlib import Path

from async_rl.driver import main

if __name__ == "__main__":
    config = Path(__file__).resolve().parents[1] / "configs" / "compilergym_mlp.yaml"
    main(str(config), __doc__)
