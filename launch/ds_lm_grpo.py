"""GRPO on a pretrained causal language model with verifiable rewards: your own prompts and reward functions
(--data, --heldout-data, --reward: the prompts env, configs/lm_prompts.yaml), or the built-in tasks --env
arithmetic (the default, configs/lm_arithmetic.yaml) and --env humaneval (code run against the problem's asserts
in a sandbox, configs/lm_humaneval.yaml). The model is SmolLM2-135M-Instruct unless --model-path names a Hugging
Face folder or a .gguf file; LoRA on the attention and MLP projections, the reference is the model with its
adapters off, and the inference actors receive only the adapters. After training, the final weights answer the
held-out prompts greedily (eval/ scalars, eval_problems.json).

    python launch/ds_lm_grpo.py --data train.jsonl --heldout-data heldout.jsonl --reward math
    python launch/ds_lm_grpo.py --data train.jsonl --heldout-data heldout.jsonl --reward math --reward my_rewards:brevity=0.2
    python launch/ds_lm_grpo.py --max-minutes 20
    python launch/ds_lm_grpo.py --env humaneval --clip-mode pacs

Shorthand flags of this launch (the prompts env's options data, heldout_data, rewards: --env.data, --env.heldout-data,
--env.rewards, which they become before the config loads; also settable with --env-kwargs):
  --data PATH                  training rows: JSONL, Parquet or a datasets save_to_disk folder; a "prompt" column
                               (text or chat messages) and any others, which the rewards receive
  --heldout-data PATH          held-out rows (no prompt in common with --data), answered greedily at the end
  --reward NAME_OR_PATH[=W]    a built-in ({builtin_rewards}) or module:function called as TRL calls it:
                               f(prompts, completions, completion_ids, trainer_state, **columns) -> a float (or
                               None: does not apply) per completion; repeat it for several, W weighs one
                               (default 1); each is logged as reward/<name>, their weighted sum trains
"""
import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.errors import ConfigError, OneLineArgumentParser

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "lm_arithmetic.yaml"
SHORTHANDS = {"data": "data", "heldout_data": "heldout-data", "reward": "rewards"}  # flag -> its --env.KEY flag


def expand_shorthands(argv: list[str]) -> list[str]:
    """The command line with this launch's own flags written as the prompts env's option flags (``--data X``:
    ``--env.data X``; every ``--reward``: one ``--env.rewards`` list), so the env's options schema checks them
    with the rest of env_kwargs as the config loads; with any of them and no --env, --env prompts is added (its
    config variant, configs/lm_prompts.yaml, then applies). ConfigError if they come with another --env."""
    parser = OneLineArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--data", default=argparse.SUPPRESS)
    parser.add_argument("--heldout-data", dest="heldout_data", default=argparse.SUPPRESS)
    parser.add_argument("--reward", action="append", default=argparse.SUPPRESS)
    parser.add_argument("--env", default=None)
    known, rest = parser.parse_known_args(argv)
    env = vars(known).pop("env")
    if not vars(known):
        return argv
    if env not in (None, "prompts"):
        raise ConfigError(f"--data, --heldout-data and --reward are options of --env prompts, not --env {env}")
    # JSON values are YAML the loader reads back as given: a path stays a string whatever it looks like.
    options = [part for flag, value in vars(known).items() for part in (f"--env.{SHORTHANDS[flag]}", json.dumps(value))]
    return ["--env", "prompts", *rest, *options]


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    try:
        rest = expand_shorthands(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:  # the driver's convention for bad input: one line, exit code 2
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    from async_rl.driver import main as run_main  # Ray and torch: after this launch's own flags are checked

    return run_main(str(CONFIG), usage(), rest)


def usage() -> str:
    """This file's docstring with the built-in rewards as the registry has them (one list: the registry's)."""
    from async_rl.rewards import builtin_rewards

    return (__doc__ or "").replace("{builtin_rewards}", ", ".join(builtin_rewards()))


if __name__ == "__main__":
    main()
