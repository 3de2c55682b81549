"""CTRL ("Teaching Language Models to Critic via Reinforcement Learning"): GRPO trains a critic LM (LoRA on
SmolLM2-135M-Instruct unless --model-path) whose critiques of an initial HumanEval solution make a frozen
reviser's revised code pass the tests (configs/ctrl_humaneval.yaml; async_rl/ctrl/env.py). The reviser is
the base model with its adapters never applied, or --reviser-model-path; it runs in its own Ray actor beside
the inference actor, batched per rollout worker. KL k3 to the reference, coefficient 0.001. After training,
the final weights critique a balanced set of held-out cases (eval/critic_pass, eval/judgment_accuracy, ...).

    python launch/ds_ctrl_grpo.py --max-minutes 30
    python launch/ds_ctrl_grpo.py --ctrl-reward pass_rate --reviser-model-path /models/bigger --clip-mode pacs

Shorthand flags of this launch (env options, also settable with --env-kwargs):
  --ctrl-reward all_pass|pass_rate   reward: the revision passes all tests (1/0), or the fraction passed
  --reviser-model-path PATH          the frozen reviser (a Hugging Face folder, .gguf file or a reviser's export)
  --missing-judgment-reward R        reward of a critique without its judgment line (0 or -1)
"""
import argparse
import sys
from pathlib import Path

from async_rl.driver import main
from async_rl.errors import OneLineArgumentParser

SHORTHANDS = {"ctrl_reward": str, "reviser_model_path": str, "missing_judgment_reward": float}


def split_shorthands(argv: list[str]) -> tuple[dict, list[str]]:
    """This launch's own flags (as env options) and the rest of the command line."""
    parser = OneLineArgumentParser(add_help=False, allow_abbrev=False)
    for key, kind in SHORTHANDS.items():
        parser.add_argument("--" + key.replace("_", "-"), dest=key, type=kind, default=argparse.SUPPRESS)
    known, rest = parser.parse_known_args(argv)
    return vars(known), rest


if __name__ == "__main__":
    options, rest = split_shorthands(sys.argv[1:])
    config = Path(__file__).resolve().parents[1] / "configs" / "ctrl_humaneval.yaml"

    def amend(cfg):
        cfg.env_kwargs = {**cfg.env_kwargs, **options}

    main(str(config), __doc__, rest, amend)
