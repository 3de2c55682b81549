"""Language-model RL with verifiable rewards: does GRPO improve the pretrained model on held-out problems?

    python benchmarks/bench_lm.py --quick --out runs/bench/lm.json                  # arithmetic, 3 seeds x 20 min
    python benchmarks/bench_lm.py --env humaneval --seeds 0 --minutes 20 --out runs/bench/lm_humaneval.json

1. ``base_accuracy``: the base model (SmolLM2-135M-Instruct) answers the env's held-out problems greedily,
   scored as the env scores them (arithmetic: exact last number; humaneval: fraction of asserts passing).
2. ``trained_accuracy``: per seed, ``launch/ds_lm_grpo.py`` trains for ``--minutes``, then the env's final
   evaluation answers the same held-out problems greedily with the final weights (mean and per seed).
3. Generation: ``tokens_per_sec`` of the InferenceActor (Ray, batching server) generating with transformers
   against a plain ``model.generate`` in this process with the same batch, lengths (min = max new tokens) and
   threads (``generation_actor_over_plain``), the same actor with the vLLM engine (``vllm_tokens_per_sec``,
   ``vllm_over_hf_actor``; ``bench_lm_engines.py`` compares the engines alone, with log-prob differences),
   and responses/s of the asynchronous against the synchronous schedule with equal actors (``async_over_sync_responses``, short runs of ``--schedule-minutes``).
Run it on an idle machine: figures are wall-clock; the machine's load is written with them.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, machine, parser, rate, report, scalars, start_local_ray, timed_run

CONFIGS = {"arithmetic": ROOT / "configs" / "lm_arithmetic.yaml", "humaneval": ROOT / "configs" / "lm_humaneval.yaml"}
GEN_BATCH, GEN_TOKENS, GEN_REPEATS = 16, 32, 3


def base_accuracy(env: str, config: Path) -> float:
    """The base model's greedy mean reward on the env's held-out problems, through the same final
    evaluation a trained run uses (no training: the run's weights are the base)."""
    import torch

    from async_rl.config import load_config
    from async_rl.driver import prepare
    from async_rl.policies.lm_checkpoint import load_lm_policy
    from envs import final_evaluation_for

    cfg = load_config(["--env", env, "--swanlab-mode", "disabled"], str(config))
    task_set = prepare(cfg)
    torch.set_num_threads(cfg.torch_threads)  # as the inference actor that answers after training
    policy, preprocess, _ = load_lm_policy(overrides={k: v for k, v in cfg.policy_kwargs.items() if k != "model_path"})

    def act(obs: Any, deterministic: bool) -> Any:
        with torch.inference_mode():
            return policy.act(obs, torch.full((obs.batch_size[0],), deterministic))["env_action"].numpy()

    return final_evaluation_for(env)(task_set, act, lambda obs, name="": preprocess(obs), cfg.seed)["heldout_reward"]


def generation_throughput(config: Path) -> dict[str, float]:
    """Generated tokens/s of a plain ``generate`` and of the InferenceActor, same batch and lengths."""
    import ray
    import torch

    from async_rl.config import load_config
    from async_rl.driver import prepare
    from async_rl.experience import to_wire
    from async_rl.orchestration.runtime import Runtime
    from async_rl.policies.lm_checkpoint import load_lm_policy
    from envs.arithmetic import heldout_problems

    cfg = load_config(["--policy-kwargs", f"{{max_new_tokens: {GEN_TOKENS}, min_new_tokens: {GEN_TOKENS}, "
                       "max_prompt_tokens: 64, temperature: 1.0}", "--swanlab-mode", "disabled"], str(config))
    task_set = prepare(cfg)
    policy, preprocess, _ = load_lm_policy(overrides={k: v for k, v in cfg.policy_kwargs.items() if k != "model_path"})
    obs = torch.stack([preprocess({"prompt": p["prompt"]}) for p in heldout_problems(GEN_BATCH, 2)])
    ids, mask = obs["input_ids"], obs["attention_mask"]
    torch.set_num_threads(cfg.torch_threads)  # the actor's threads
    with torch.inference_mode():
        policy.lm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=True)  # warm-up
        start = time.perf_counter()
        for _ in range(GEN_REPEATS):
            out = policy.lm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=GEN_TOKENS,
                                     min_new_tokens=GEN_TOKENS, do_sample=True, top_k=0, pad_token_id=policy.pad_id)
        plain_s = time.perf_counter() - start
    plain = GEN_REPEATS * GEN_BATCH * (out.shape[1] - ids.shape[1]) / plain_s
    del policy
    start_local_ray(2)
    served: dict[str, float] = {}
    try:
        from async_rl.actors.inference import InferenceActor

        for engine in ("hf", "vllm"):  # the config's inference actor with each generation engine, the same batch
            cfg.policy_kwargs = {**cfg.policy_kwargs, "generation_engine": engine}
            runtime = Runtime(cfg, task_set)
            actor = InferenceActor.options(num_cpus=0).remote(0, runtime.inference_factory, GEN_BATCH, 50.0, None, 0,
                                                              cfg.torch_threads, "fp32")
            ray.get(actor.serve_built_weights.remote(), timeout=600)
            wire = to_wire(obs)
            ray.get(actor.request.remote(wire), timeout=900)  # warm-up (vLLM: the engine's start)
            start = time.perf_counter()
            tokens = 0
            for _ in range(GEN_REPEATS):
                answer = ray.get(actor.request.remote(wire), timeout=600)
                tokens += int((answer["response"] >= 0).sum())
            served[engine] = tokens / (time.perf_counter() - start)
            ray.kill(actor)
    finally:
        ray.shutdown()
    return {"plain_generate_tokens_per_sec": plain, "tokens_per_sec": served["hf"], "vllm_tokens_per_sec": served["vllm"],
            "generation_actor_over_plain": served["hf"] / plain, "vllm_over_hf_actor": served["vllm"] / served["hf"]}


def stored_over_real(checkpoint: Path) -> dict[str, float]:
    """Replay memory per stored response against the bytes its real tokens need: a stored response keeps
    ``max_prompt_tokens`` prompt slots (ids + mask) and ``max_new_tokens`` response slots (ids + log-prob),
    its real tokens only some of them; per-response scalars count on both sides."""
    from async_rl import checkpoint as ckpt

    items = ckpt.load_tensordict(checkpoint / "replay.safetensors")
    rows = items.batch_size[0]
    if rows == 0:  # every item was trained on before the run ended (a generation batch of one super-batch)
        return {key: float("nan") for key in ("replay_bytes_per_response", "replay_real_token_bytes_per_response",
                                              "replay_stored_over_real", "response_tokens_mean")}
    leaves = list(items.items(include_nested=True, leaves_only=True))
    stored = sum(v.numel() * v.element_size() for _, v in leaves) / rows
    width_p, width_r = items["obs", "input_ids"].shape[1], items["response"].shape[1]
    prompt_slot = sum(v.element_size() for k, v in leaves if isinstance(k, tuple) and k[0] == "obs")
    response_slot = sum(v.element_size() for k, v in leaves if v.dim() == 2 and v.shape[1] == width_r and k != ("obs",))
    scalars = stored - width_p * prompt_slot - width_r * response_slot
    real_p = float(items["obs", "attention_mask"].sum(1).float().mean())
    real_r = float((items["response"] >= 0).sum(1).float().mean())
    real = real_p * prompt_slot + real_r * response_slot + scalars
    return {"replay_bytes_per_response": stored, "replay_real_token_bytes_per_response": real,
            "replay_stored_over_real": stored / real, "response_tokens_mean": real_r}


def responses_per_sec(config: Path, env: str, minutes: float, sync: bool, log_dir: Path) -> float:
    timed_run(config, log_dir, minutes, ["--env", env, "--seed", "0", *(["--sync"] if sync else [])])
    return rate(scalars(log_dir, "rollout/total_env_steps"))


def checkpoint_figures(figures: dict[str, Any], out: str | None) -> None:
    """What is measured so far, written after each stage (a long benchmark stopped early keeps it)."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).with_suffix(".partial.json").write_text(json.dumps(figures, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "the issue's run: 3 seeds x 20 minutes of GRPO, 2-minute schedule runs")
    ap.add_argument("--env", choices=sorted(CONFIGS), default="arithmetic")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--minutes", type=float, default=20.0, help="training minutes per seed")
    ap.add_argument("--schedule-minutes", type=float, default=2.0, help="minutes of each async / sync run")
    ap.add_argument("--skip", nargs="*", default=[], choices=["generation", "schedules", "training"])
    ap.add_argument("--order", nargs="+", default=["training", "generation", "schedules"],
                    choices=["training", "generation", "schedules"], help="the stages after the base model's accuracy")
    ap.add_argument("--log-root", default=str(ROOT / "runs" / "bench" / "lm"))
    args = ap.parse_args(argv)
    config, root = CONFIGS[args.env], Path(args.log_root) / args.env
    figures: dict[str, Any] = {"env": args.env, "minutes_per_seed": args.minutes, "load_avg_1min_start": machine()["load_avg_1min"]}
    figures["base_accuracy"] = base_accuracy(args.env, config)
    print(f"base held-out accuracy {figures['base_accuracy']:.3f}", flush=True)
    checkpoint_figures(figures, args.out)
    for stage in [s for s in args.order if s not in args.skip]:
        if stage == "generation":
            figures.update(generation_throughput(config))
        elif stage == "schedules":
            fast = {mode: responses_per_sec(config, args.env, args.schedule_minutes, mode == "sync", root / f"schedule-{mode}")
                    for mode in ("async", "sync")}
            figures.update({"async_responses_per_sec": fast["async"], "sync_responses_per_sec": fast["sync"],
                            "async_over_sync_responses": fast["async"] / fast["sync"]})
        else:
            trained = []
            for seed in args.seeds:
                run = timed_run(config, root / f"seed-{seed}", args.minutes, ["--env", args.env, "--seed", str(seed)])
                final = run.summary.get("final_evaluation") or {}
                trained.append(float(final.get("heldout_reward", float("nan"))))
                figures[f"trained_accuracy_seed{seed}"] = trained[-1]
                figures[f"epochs_seed{seed}"] = run.summary.get("epochs")
                if run.summary.get("checkpoint"):
                    figures.update({f"{k}_seed{seed}": v for k, v in stored_over_real(Path(run.summary["checkpoint"])).items()})
                print(f"seed {seed}: held-out accuracy {trained[-1]:.3f}", flush=True)
                checkpoint_figures(figures, args.out)
            figures["trained_accuracy"] = statistics.fmean(trained)
            figures["trained_minus_base"] = figures["trained_accuracy"] - figures["base_accuracy"]
        checkpoint_figures(figures, args.out)
    figures.update({k: v for k, v in machine().items() if k != "load_avg_1min"})
    figures["load_avg_1min_end"] = machine()["load_avg_1min"]
    report(figures, args, headline=["base_accuracy", "trained_accuracy", "trained_minus_base", "tokens_per_sec",
                                    "vllm_tokens_per_sec", "generation_actor_over_plain", "async_over_sync_responses"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
