"""LIBERO from the supervised policy: does RL raise the tiny VLA's success on held-out initial states?

    python benchmarks/bench_libero_finetune.py --out runs/bench/libero_finetune.json   # PPO 3 seeds, GRPO 1, 30 min each
    python benchmarks/bench_libero_finetune.py --quick --out runs/bench/libero_finetune_quick.json   # 1 seed, 3 min
    python benchmarks/bench_libero_finetune.py --reuse --out F.json   # runs already evaluated under --runs-dir are read
    python benchmarks/bench_libero_finetune.py --seeds --grpo-seeds --ppo-large-batch-seeds 0 1 2 --out F.json   # PPO, 512-step

1. ``sft_heldout``: the policy ``make run`` starts from (``configs/libero_ppo.yaml``'s ``init_from``), deterministic
   actions, on the held-out initial states (40-49 of each task; demonstrations and RL use 0-39).
2. Per seed, ``launch/ds_libero_ppo.py --clip-mode soft_clip`` (``make run``'s command and config) for ``--minutes``
   from that policy, with PPO (GAE, the config's critic warm-up and KL to the supervised policy) and with GRPO
   (``--advantage grpo --group-size 8``: 8 episodes from one initial state), and with ``--naive-seeds``
   success-filtered (``--advantage naive``: only successful episodes push the policy; flags in ``ESTIMATORS``), and
   with ``--ppo-large-batch-seeds`` PPO on 512-step super-batches;
   then the same held-out evaluation of the run's newest weights. Each evaluation runs as two processes over halves of the states
   (``launch/eval_libero.py``), one training run at a time.
Keys (NAME: ppo, grpo, naive, ppo_large_batch): ``NAME_heldout_seed<S>`` and their mean ``NAME_heldout``, ``NAME_gain`` (mean minus
``sft_heldout``), the epochs and env steps of each run, and the load before and after each run. With 10 states
per task and two tasks, one evaluation is 20 episodes: a single rate moves in steps of 0.05 (binomial noise ~±0.1).
With ``--train-states FIRST-LAST`` the SFT policy and every run are also evaluated on those initial states of the
training range (``sft_train``, ``<ppo|grpo>_train_seed<S>``, ``<ppo|grpo>_train``, ``<ppo|grpo>_train_gain``): does RL
raise success where it trained, where the held-out states do not move?
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, libero_unavailable, machine, parser, report, scalars

PY = sys.executable
# naive: the outcome itself is the advantage (no baseline), so with LIBERO's 0/1 reward only successful episodes
# push the policy: success-filtered self-imitation under PPO's clipped loss. Groups of 2 are the smallest the
# group machinery takes (naive makes no use of the comparison); super-batches of 64 steps, since a draw takes as
# many steps from each member and a short successful episode bounds its group's share.
ESTIMATORS = {"ppo": [], "grpo": ["--advantage", "grpo", "--group-size", "8"],
              "naive": ["--advantage", "naive", "--group-size", "2",
                        "--super-batch-size", "64", "--train-batch-size", "32", "--accumulation-steps", "2",
                        "--lr-policy", "2e-5", "--actor-timeout-s", "600"],
              # PPO on super-batches of 512 steps (parts of several episodes, successes and failures, instead of one
              # episode's 32-step segment), one optimiser step per pass, the critic alone for the first 8 epochs
              # (~4,000 steps): RESULTS section 18.
              "ppo_large_batch": ["--super-batch-size", "512", "--train-batch-size", "32", "--accumulation-steps", "16",
                                  "--replay-capacity", "1024", "--critic-warmup-epochs", "8", "--lr-policy", "2e-5"]}


def halves(states: list[int]) -> list[str]:
    """A range of states as two ``--init-states`` ranges (one per evaluation process)."""
    mid = (len(states) + 1) // 2
    return [f"{part[0]}-{part[-1]}" for part in (states[:mid], states[mid:]) if part]


def parse_states(text: str) -> list[int]:
    """``FIRST-LAST`` (inclusive) or one state."""
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", text.strip())
    states = list(range(int(match[1]), int(match[2] or match[1]) + 1)) if match else []
    if not states:
        raise SystemExit(f"--init-states {text!r}: give a range FIRST-LAST such as 40-49")
    return states


def evaluate(policy_flags: list[str], states: list[int], out: Path) -> dict[str, Any]:
    """Deterministic success on ``states`` of every task (two processes), merged into ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    procs = []
    for k, part in enumerate(halves(states)):
        log = open(out.with_name(f"{out.stem}_{k}.log"), "w")  # closed below
        cmd = [PY, "launch/eval_libero.py", *policy_flags, "--init-states", part, "--json", str(out.with_name(f"{out.stem}_{k}.json"))]
        # One torch thread each: two processes with torch's default (a thread per core) each on 2 cores did 6 of 10
        # episodes in 14 min; with one thread each all 10 took 88 s (same episodes, same outcomes).
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs.append((subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env), log, k))
    episodes = []
    try:
        for proc, log, k in procs:
            code = proc.wait(timeout=3600)
            if code != 0:
                raise SystemExit(f"evaluation failed (exit {code}); see {out.with_name(f'{out.stem}_{k}.log')}")
            episodes += json.loads(out.with_name(f"{out.stem}_{k}.json").read_text())["episodes"]
    finally:  # a failed or hung half does not leave the other running
        for proc, log, _ in procs:
            if proc.poll() is None:
                proc.kill()
            log.close()
    tasks = sorted({e["task"] for e in episodes})
    merged = {"success_rate": sum(e["success"] for e in episodes) / len(episodes), "episodes": episodes,
              "per_task": {t: statistics.mean(e["success"] for e in episodes if e["task"] == t) for t in tasks},
              "init_states": states, "policy": policy_flags}
    out.write_text(json.dumps(merged, indent=2) + "\n")
    return merged


def train(name: str, seed: int, minutes: float, run_dir: Path) -> dict[str, Any]:
    """One ``make run``-style training run; what it did, read back from its TensorBoard events."""
    load_before = os.getloadavg()[0]
    cmd = [PY, "launch/ds_libero_ppo.py", "--clip-mode", "soft_clip", "--max-minutes", str(minutes), "--seed", str(seed),
           "--log-dir", str(run_dir), "--swanlab-mode", "disabled", *ESTIMATORS[name]]
    with open(run_dir.with_name(run_dir.name + ".log"), "w") as log:
        code = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=minutes * 60 + 1800).returncode
    if code != 0:
        raise SystemExit(f"{name} seed {seed} failed (exit {code}); see {run_dir.name}.log")
    return {"load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}


def evaluated(policy_flags: list[str], states: list[int], out: Path, reuse: bool) -> dict[str, Any]:
    """``evaluate``, or its earlier result with ``reuse`` (unless it names other initial states)."""
    if reuse and out.is_file():
        earlier = json.loads(out.read_text())
        if earlier.get("init_states", states) == states:
            return earlier
    return evaluate(policy_flags, states, out)


def run_figures(run_dir: Path) -> dict[str, float]:
    """Epochs (policy versions) and env steps of a finished run ({} where its directory is gone)."""
    if not run_dir.is_dir():
        return {}
    versions, steps = scalars(run_dir, "sync/policy_version"), scalars(run_dir, "rollout/total_env_steps")
    return {"epochs": versions[-1][1] if versions else 0, "env_steps": steps[-1][1] if steps else 0}


def main() -> None:
    ap = parser(__doc__, "1 PPO seed and 1 GRPO seed of 3 minutes, held-out states 40-44")
    ap.add_argument("--minutes", type=float, default=None, help="training minutes per run (default 30; quick 3)")
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="PPO seeds (default 0 1 2; quick 0; none: skip)")
    ap.add_argument("--grpo-seeds", type=int, nargs="*", default=[0], help="GRPO seeds (default 0; none: skip)")
    ap.add_argument("--naive-seeds", type=int, nargs="*", default=[],
                    help="seeds of success-filtered runs (--advantage naive, groups of 2; default none)")
    ap.add_argument("--ppo-large-batch-seeds", type=int, nargs="*", default=[],
                    help="seeds of PPO runs on 512-step super-batches (flags in ESTIMATORS; default none)")
    ap.add_argument("--init-states", default=None, help="held-out states, FIRST-LAST (default 40-49; quick 40-44)")
    ap.add_argument("--train-states", default=None, help="also evaluate on these training states, FIRST-LAST (e.g. 0-19)")
    ap.add_argument("--runs-dir", default="runs/bench/libero_finetune", help="run dirs and evaluations go here")
    ap.add_argument("--reuse", action="store_true", help="read a run or evaluation whose heldout JSON exists")
    args = ap.parse_args()
    minutes = args.minutes or (3.0 if args.quick else 30.0)
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    states = parse_states(args.init_states or ("40-44" if args.quick else "40-49"))
    train_states = parse_states(args.train_states) if args.train_states else []
    unavailable = libero_unavailable()
    if unavailable:
        raise SystemExit(f"LIBERO is not available here: {unavailable}")
    runs = ROOT / args.runs_dir
    started = time.time()
    figures: dict[str, Any] = {"minutes": minutes, "heldout_states": f"{states[0]}-{states[-1]}", **machine()}
    if train_states:
        figures["train_states"] = f"{train_states[0]}-{train_states[-1]}"

    figures["sft_heldout"] = evaluated([], states, runs / "sft_heldout.json", args.reuse)["success_rate"]
    if train_states:
        figures["sft_train"] = evaluated([], train_states, runs / "sft_train.json", args.reuse)["success_rate"]
    for name, name_seeds in (("ppo", seeds), ("grpo", args.grpo_seeds), ("naive", args.naive_seeds),
                             ("ppo_large_batch", args.ppo_large_batch_seeds)):
        rates, train_rates = [], []
        for seed in name_seeds:
            run_dir, held_json = runs / f"{name}_seed{seed}", runs / f"{name}_seed{seed}_heldout.json"
            if not (args.reuse and held_json.is_file()):
                facts = train(name, seed, minutes, run_dir)
                figures.update({f"{name}_{k}_seed{seed}": v for k, v in facts.items()})
                evaluate(["--checkpoint", str(run_dir)], states, held_json)
            held = json.loads(held_json.read_text())
            rates.append(held["success_rate"])
            figures[f"{name}_heldout_seed{seed}"] = held["success_rate"]
            figures.update({f"{name}_{k}_seed{seed}": v for k, v in run_figures(run_dir).items()})
            print(f"{name} seed {seed}: held-out {held['success_rate']:.2f} (SFT {figures['sft_heldout']:.2f})", flush=True)
            if train_states:
                trained = evaluated(["--checkpoint", str(run_dir)], train_states, runs / f"{name}_seed{seed}_train.json",
                                    args.reuse)
                train_rates.append(trained["success_rate"])
                figures[f"{name}_train_seed{seed}"] = trained["success_rate"]
                print(f"{name} seed {seed}: training states {trained['success_rate']:.2f} (SFT {figures['sft_train']:.2f})",
                      flush=True)
        if rates:
            # rounded: rates are multiples of 1/episodes, and 0.6 - 0.5 must read 0.1, not 0.09999999999999998
            figures[f"{name}_heldout"] = round(statistics.mean(rates), 6)
            figures[f"{name}_gain"] = round(figures[f"{name}_heldout"] - figures["sft_heldout"], 6)
        if train_rates:
            figures[f"{name}_train"] = round(statistics.mean(train_rates), 6)
            figures[f"{name}_train_gain"] = round(figures[f"{name}_train"] - figures["sft_train"], 6)
    figures["bench_seconds"] = round(time.time() - started, 1)
    report(figures, args, headline=("sft_heldout", "ppo_heldout", "ppo_gain", "grpo_heldout", "grpo_gain",
                                    "naive_heldout", "naive_gain", "ppo_large_batch_heldout", "ppo_large_batch_gain",
                                    "sft_train", "ppo_train", "ppo_train_gain", "grpo_train", "grpo_train_gain"))


if __name__ == "__main__":
    main()
