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

Shorthand flags of this launch (the prompts env's options data, heldout_data, rewards; also settable with
--env-kwargs):
  --data PATH                  training rows: JSONL, Parquet or a datasets save_to_disk folder; a "prompt" column
                               (text or chat messages) and any others, which the rewards receive
  --heldout-data PATH          held-out rows (no prompt in common with --data), answered greedily at the end
  --reward NAME_OR_PATH[=W]    a built-in (math, code_tests, format, length) or module:function with
                               f(prompts, completions, **columns) -> list[float]; repeat it for several, W weighs
                               one (default 1); each is logged as reward/<name>, their weighted sum trains
"""
import argparse
import sys
from pathlib import Path
from typing import Any, Optional

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.errors import ConfigError  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "lm_arithmetic.yaml"
SHORTHANDS = {"data": "data", "heldout_data": "heldout_data", "reward": "rewards"}  # flag -> env option


def split_shorthands(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """This launch's own flags (as prompts-env options) and the rest of the command line; with any of them and
    no --env, the rest selects --env prompts (whose config variant, configs/lm_prompts.yaml, then applies)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--data", default=argparse.SUPPRESS)
    parser.add_argument("--heldout-data", dest="heldout_data", default=argparse.SUPPRESS)
    parser.add_argument("--reward", action="append", default=argparse.SUPPRESS)
    known, rest = parser.parse_known_args(argv)
    options = {SHORTHANDS[key]: value for key, value in vars(known).items()}
    if options and not any(a == "--env" or a.startswith("--env=") for a in rest):
        rest = ["--env", "prompts", *rest]
    return options, rest


def amend_with(options: dict[str, Any]):
    """The driver's ``amend``: the shorthand flags into the prompts env's options."""
    def amend(cfg) -> None:
        if options and cfg.env != "prompts":
            raise ConfigError(f"--data, --heldout-data and --reward are options of --env prompts, not --env {cfg.env}")
        cfg.env_kwargs = {**cfg.env_kwargs, **options}
    return amend


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    from async_rl.driver import main as run_main  # noqa: PLC0415  (Ray and torch: after the flags are split)

    options, rest = split_shorthands(sys.argv[1:] if argv is None else argv)
    return run_main(str(CONFIG), __doc__, rest, amend_with(options))


if __name__ == "__main__":
    main()
