"""PPO on CompilerGym LLVM pass ordering: --policy mlp (one pass per step, the default) or
--policy passformer (a seq2seq model writes a whole pass sequence). After training, the final
weights are evaluated on held-out programs against random search (table + eval/ scalars).

    python launch/ds_compilergym_ppo.py --policy passformer --max-minutes 5
"""
import sys
from pathlib import Path

from async_rl.driver import main
from envs.compiler_gym import held_out_evaluation, policy_from_argv

if __name__ == "__main__":
    config = Path(__file__).resolve().parents[1] / "configs" / f"compilergym_{policy_from_argv(sys.argv[1:])}.yaml"
    main(str(config), __doc__, inspect=held_out_evaluation)
