"""Success of a LIBERO policy on chosen (e.g. held-out) initial states, deterministic actions, no Ray.

    python launch/eval_libero.py --init-from runs/libero_sft/policy --init-states 40-49 --json sft.json
    python launch/eval_libero.py --checkpoint runs/libero_ppo --init-states 40-49     # an RL run's newest weights
    python launch/eval_libero.py --checkpoint RUN --init-from EXPORT   # the export that run started from has moved

Every other flag is a config flag (--config, --env-kwargs, --policy-kwargs, ...; the default config is
configs/libero_ppo.yaml). Writes {"success_rate", "per_task", "episodes", "init_states"} with --json.
"""
import argparse
import json
import sys
from pathlib import Path

from async_rl.config import load_config
from async_rl.driver import prepare
from async_rl.errors import ConfigError, OneLineArgumentParser
from async_rl.orchestration.policy_evaluation import load_policy, local_act
from async_rl.policies.initial_weights import check_init_from
from envs.libero import LiberoTaskSet, parse_init_states
from envs.libero_evaluation import success_rates


def parse_init_states_flag(text: str) -> list[int]:
    """--init-states "40-49" or "0,3,7": the env's own ``init_states`` parser (one-line ValueErrors)."""
    if "," in text:
        try:
            return parse_init_states([int(x) for x in text.split(",")])
        except ValueError:
            raise ConfigError(f"--init-states {text!r}: give a range like 40-49 or a list like 0,3,7") from None
    return parse_init_states(text) or list(range(50))  # "all": LIBERO's 50 fixed initial states per task


def main(argv=None) -> dict:
    parser = OneLineArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init-from", help="a policy export (launch/sft.py); default: the config's init_from "
                        "(what its RL run starts from), else the policy as built; with --checkpoint: the export "
                        "that run started from, where it is now (default: where it was)")
    parser.add_argument("--checkpoint", help="an RL run's log dir or checkpoint: its newest weights")
    parser.add_argument("--init-states", default="40-49", help="initial states of every task (default 40-49)")
    parser.add_argument("--json", help="write the result here")
    own, rest = parser.parse_known_args(argv)
    config = Path(__file__).resolve().parents[1] / "configs" / "libero_ppo.yaml"
    try:
        states = parse_init_states_flag(own.init_states)
        cfg = load_config(rest, str(config), __doc__)
        task_set = prepare(cfg)
        init_from = own.init_from or (None if own.checkpoint else cfg.init_from)
        init_from = init_from and check_init_from(init_from, cfg.policy, cfg.env, cfg.policy_kwargs.get("model_path"))
        policy, preprocess = load_policy(cfg, task_set, init_from, own.checkpoint)
    except (ConfigError, ValueError) as exc:  # ValueError: weights that do not fit the configured policy
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    assert isinstance(task_set, LiberoTaskSet)  # the config's env
    result = success_rates(task_set, local_act(policy), preprocess, states, cfg.seed,
                           progress=lambda line: print(line, flush=True))
    result["policy"] = own.checkpoint or init_from or "as built (no init_from)"
    print(json.dumps({k: result[k] for k in ("success_rate", "per_task", "policy")}, indent=2))
    if own.json:
        Path(own.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
