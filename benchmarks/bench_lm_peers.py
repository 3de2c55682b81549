"""This project's GRPO against TRL's GRPOTrainer on the same work and machine, one after the other.

    make peers                                                        # TRL into .venv-peers (once; or --setup)
    python benchmarks/bench_lm_peers.py --quick --out runs/bench/lm_peers_quick.json   # 1 seed x 4 updates
    python benchmarks/bench_lm_peers.py --out runs/bench/lm_peers.json                 # 3 seeds x 15 min
    python benchmarks/bench_lm_peers.py --gpu --quick --out runs/bench/lm_peers_gpu_quick.json   # on a GPU machine

Per seed: ``launch/ds_lm_grpo.py``'s run (configs/lm_arithmetic.yaml, asynchronous), the same with ``--sync``, and
TRL (benchmarks/peers_trl_grpo.py, its own process, 2 torch threads); each trained for ``--minutes``. Then
``launch/eval_lm.py`` scores each final model greedily on the same held-out problems (ours: the run's
checkpoint; TRL: its merged model folder). Figures per system: completions trained per second between the
first and the last update (``*_completions_per_sec``; start-up excluded for both), updates, completions
generated and evicted untrained, generated and trained tokens/s, held-out accuracy, peak memory and the
CPU seconds of each process (ours: every Ray actor by name) with its threads. Wall-clock figures: take
them on an idle machine (the 1-minute load is written with them).

``--gpu``: the same work on CUDA (see ``GPU_HELP``); ``device`` in the JSON says where each run was. Exits 3 with
one line, before anything starts, where no CUDA GPU is visible.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_lm import checkpoint_figures, stored_over_real
from benchmarks.common import ROOT, machine, parser, rate, report, scalars, timed_run

CONFIG = ROOT / "configs" / "lm_arithmetic.yaml"
GPU_CONFIG = ROOT / "configs" / "lm_arithmetic_gpu_preset.yaml"
# The keys that define the work (what is generated and how it is trained): the GPU preset's values of these are
# replaced by CONFIG's, so both presets run the same work and differ in devices and generation batching only.
WORK_KEYS = ("group_size", "policy_kwargs", "num_trainers", "train_batch_size", "accumulation_steps",
             "super_batch_size", "updates_per_epoch", "replay_capacity", "lr_policy", "warmup_steps", "kl_ref_coef",
             "kl_ref_estimator", "loss_agg", "clip_mode", "normalize_group_advantages")
GPU_HELP = (f"the same work on CUDA. This project: {GPU_CONFIG.relative_to(ROOT)} (ZeRO-2 bf16 trainer, bf16 "
            f"generation in batches of up to 128) with {CONFIG.name}'s work keys (group 8, 24 new tokens, one trainer "
            "of 16 x 2 = 32 completions per update, replay 256, lr, KL); where 2+ GPUs are visible the trainer has "
            "GPU 0 and generation GPU 1, on one GPU both share it (Ray: 0.75 trainer, 0.25 generation). TRL: one "
            "process on the first GPU only (fp32 weights, bf16 autocast; it generates and trains on that device)")
PEERS = ROOT / ".venv-peers" / "site-packages"  # `make peers` (the folder must be named site-packages: RECIPES)
PER_UPDATE = 32  # completions per update in both systems (16 x 2 accumulation)
HELDOUT, DIFFICULTY, NEW_TOKENS = 80, 1, 24


class ProcessSampler:
    """CPU seconds, threads and memory of a process tree, sampled every ``period_s`` in a thread (Ray's
    actors end with the run: their last sample is what counts). Processes are named by their command
    line's first word (``ray::TrainerActor``) and summed by name."""

    def __init__(self, root_pid: int, period_s: float = 2.0) -> None:
        import psutil

        self._root, self._period = psutil.Process(root_pid), period_s
        self._cpu: dict[int, tuple[str, float]] = {}
        self._threads: dict[str, int] = defaultdict(int)
        self.peak_rss_gib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "ProcessSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        import psutil

        while not self._stop.wait(self._period):
            rss = 0
            for proc in [self._root, *self._root.children(recursive=True)]:
                try:
                    with proc.oneshot():
                        name = (proc.cmdline() or [proc.name()])[0].split("/")[-1]
                        times = proc.cpu_times()
                        self._cpu[proc.pid] = (name, times.user + times.system)
                        self._threads[name] = max(self._threads[name], proc.num_threads())
                        rss += proc.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            self.peak_rss_gib = max(self.peak_rss_gib, rss / 2**30)

    def figures(self, prefix: str) -> dict[str, Any]:
        """``{prefix}cpu_s/<name>``, ``{prefix}threads/<name>`` for the busy processes, and peak memory."""
        by_name: dict[str, float] = defaultdict(float)
        for name, seconds in self._cpu.values():
            by_name[name] += seconds
        out: dict[str, Any] = {f"{prefix}peak_rss_gib": round(self.peak_rss_gib, 2)}
        for name, seconds in sorted(by_name.items(), key=lambda kv: -kv[1]):
            if seconds >= 1.0:
                out[f"{prefix}cpu_s/{name}"] = round(seconds, 1)
                out[f"{prefix}threads/{name}"] = self._threads[name]
        return out


def per_second(amount: float, seconds: float) -> float:
    """``amount / seconds``; nan where no time was measured (nan or 0 seconds)."""
    return amount / seconds if seconds > 0 else float("nan")


def trained_rate(update_times: list[float]) -> float:
    """Completions trained per second from the first update to the last (start-up excluded)."""
    if len(update_times) < 2 or update_times[-1] <= update_times[0]:
        return float("nan")
    return (len(update_times) - 1) * PER_UPDATE / (update_times[-1] - update_times[0])


def heldout_file(path: Path, count: int = HELDOUT) -> Path:
    """The held-out problems both systems answer (the arithmetic env's fixed list), as eval_lm reads them."""
    from envs.arithmetic import heldout_problems

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": p["prompt"], "answer": p["answer"]}) + "\n"
                            for p in heldout_problems(count, DIFFICULTY)))
    return path


def eval_threads(gpu: bool) -> int:
    """eval_lm.py's torch threads: the 2-core machine's 2; a GPU machine's CPUs are idle by then (eval_lm runs on
    CPU), so up to 8 of them (greedy answers do not depend on the count)."""
    return min(8, os.cpu_count() or 2) if gpu else 2


def heldout_accuracy(source: list[str], problems: Path, out: Path, threads: int = 2) -> float:
    """``launch/eval_lm.py`` (greedy, 24 new tokens) on ``problems``; ``source``: its model flags."""
    subprocess.run([sys.executable, str(ROOT / "launch" / "eval_lm.py"), *source, "--problems", str(problems),
                    "--out", str(out), "--max-new-tokens", str(NEW_TOKENS), "--threads", str(threads)], check=True)
    return float(json.loads(out.read_text())["accuracy"])


def cuda_gpu_count() -> int:
    """CUDA GPUs torch sees here (0 without a GPU or without torch's CUDA build)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_layout(gpus: int) -> str:
    """Where the GPU preset's trainer and generation actor run with ``gpus`` visible (Ray's shares of
    async_rl/orchestration/placement.py for one trainer and one inference actor)."""
    if gpus >= 2:
        return f"cuda: trainer GPU 0, generation GPU 1 ({gpus} visible); TRL GPU 0"
    return "cuda: trainer and generation share GPU 0 (0.75 / 0.25); TRL GPU 0"


def same_work_flags() -> list[str]:
    """Flags that set the GPU preset's WORK_KEYS to CONFIG's values (flow YAML, as the config flags read them)."""
    import yaml

    from async_rl.config import read_config_file

    values, flags = read_config_file(CONFIG).values, []
    for key in WORK_KEYS:
        flag = key.replace("_", "-")
        if isinstance(values[key], bool):  # boolean keys are --key / --no-key switches
            flags.append(f"--{flag}" if values[key] else f"--no-{flag}")
        else:
            text = yaml.safe_dump(values[key], default_flow_style=True, sort_keys=False, width=10_000)
            flags += [f"--{flag}", text.strip().removesuffix("...").strip()]
    return flags


def ours_run_args(seed: int, sync: bool, updates: Optional[int], flags: list[str], gpu: bool) -> tuple[Path, list[str]]:
    """The config and command line of one of this project's runs (``timed_run`` adds minutes and log dir)."""
    # The run's own final evaluation answers a few held-out problems only: eval_lm's score is the figure.
    argv = ["--seed", str(seed), "--checkpoint-interval-epochs", "1000",
            "--env-kwargs", f"{{difficulty: {DIFFICULTY}, heldout_size: 8}}", *(["--sync"] if sync else []),
            *(["--max-epochs", str(updates)] if updates else [])]
    if gpu:  # the preset's devices and generation batching, CONFIG's work; explicit so a changed preset cannot drift
        argv += [*same_work_flags(), "--device", "cuda", "--precision", "auto"]
    return (GPU_CONFIG if gpu else CONFIG), [*argv, *flags]


def last(log_dir: Path, tag: str, default: float = float("nan")) -> float:
    points = scalars(log_dir, tag)
    return points[-1][1] if points else default


def mean_of(log_dir: Path, tag: str) -> float:
    points = scalars(log_dir, tag)
    return statistics.fmean(v for _, v in points) if points else float("nan")


def run_ours(seed: int, minutes: float, sync: bool, root: Path, problems: Path, flags: list[str],
             updates: Optional[int], gpu: bool = False) -> dict[str, Any]:
    """One run of launch/ds_lm_grpo.py's config (+ ``flags``); its figures (``ours_`` or ``ours_sync_`` keys)."""
    name = "ours_sync" if sync else "ours"
    log_dir = root / f"{name}-seed{seed}"
    config, argv = ours_run_args(seed, sync, updates, flags, gpu)
    with ProcessSampler(os.getpid()) as sampler:
        run = timed_run(config, log_dir, minutes, argv)
    updates = [t for t, _ in scalars(log_dir, "sync/policy_version")]
    generated = last(log_dir, "rollout/total_env_steps", 0.0)
    # between the first and the last log point: an --updates run ends long before its --minutes cap
    generated_per_sec = rate(scalars(log_dir, "rollout/total_env_steps"))
    # mean real tokens of the run's completions (the mean over its log intervals, as TRL's figure is its run's
    # mean); the final buffer's responses only where the run logged none
    tokens = mean_of(log_dir, "rollout/completion_tokens")
    if math.isnan(tokens) and run.summary.get("checkpoint"):
        tokens = stored_over_real(Path(run.summary["checkpoint"]))["response_tokens_mean"]
    out = {"completions_per_sec": trained_rate(updates), "updates": len(updates),
           "completions_generated": generated, "completions_trained": len(updates) * PER_UPDATE,
           "evicted": last(log_dir, "replay/evicted", 0.0), "evicted_untrained": last(log_dir, "replay/evicted_untrained", 0.0),
           "backpressure_waits": last(log_dir, "health/backpressure_waits", 0.0),
           "backpressure_wait_s": last(log_dir, "health/backpressure_wait_ms", 0.0) / 1000,
           "epoch_seconds_mean": mean_of(log_dir, "train/epoch_seconds"),
           "data_wait_seconds": last(log_dir, "health/data_wait_seconds", 0.0),
           "broadcast_seconds_mean": mean_of(log_dir, "sync/broadcast_seconds"),
           "inference_forward_ms_mean": mean_of(log_dir, "inference/forward_ms"),
           "inference_batch_mean": mean_of(log_dir, "inference/batch_size"),
           "generated_per_sec": generated_per_sec, "response_tokens_mean": tokens,
           "generated_tokens_per_sec": generated_per_sec * tokens,
           "trained_tokens_per_sec": trained_rate(updates) * tokens,
           "epochs": run.summary.get("epochs")}
    # the generation actor's own rate: real response tokens of a batched generate call over its time
    out["generation_phase_tokens_per_sec"] = per_second(out["inference_batch_mean"] * tokens,
                                                        out["inference_forward_ms_mean"] / 1000)
    out["heldout_accuracy"] = heldout_accuracy(["--checkpoint", str(log_dir)], problems, log_dir / "heldout.json",
                                               eval_threads(gpu))
    out.update(sampler.figures(""))
    return {f"{name}_{k}": v for k, v in out.items()}


def trl_command(seed: int, minutes: float, out_dir: Path, updates: Optional[int], model_path: str,
                gpu: bool) -> tuple[list[str], dict[str, str]]:
    """peers_trl_grpo.py's command line and environment (TRL from PEERS)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PEERS), str(ROOT)])}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "peers_trl_grpo.py"), "--model-path", model_path,
           "--out-dir", str(out_dir), "--stats", str(out_dir / "stats.json"), "--minutes", str(minutes),
           "--seed", str(seed), *(["--max-steps", str(updates)] if updates else [])]
    if gpu:
        cmd += ["--device", "cuda"]
        # One GPU: with several visible, the Trainer of a process not started by a distributed launcher wraps the
        # model in DataParallel, splitting each batch of 16 over the GPUs: other work than the issue's.
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[0].strip() if visible else "0"
    return cmd, env


def run_trl(seed: int, minutes: float, root: Path, problems: Path, updates: Optional[int],
            model_path: Optional[str] = None, gpu: bool = False) -> dict[str, Any]:
    """TRL's GRPOTrainer in its own process (peers_trl_grpo.py); its figures (``trl_`` keys)."""
    from async_rl.policies.lm_loading import resolve_lm_path

    out_dir = root / f"trl-seed{seed}"
    out_dir.mkdir(parents=True, exist_ok=True)
    stats_file = out_dir / "stats.json"
    cmd, env = trl_command(seed, minutes, out_dir, updates, str(resolve_lm_path(model_path)), gpu)
    proc = subprocess.Popen(cmd, env=env)
    with ProcessSampler(proc.pid) as sampler:
        if proc.wait() != 0:
            raise SystemExit(f"TRL's run failed (exit {proc.returncode}): {' '.join(cmd)}")
    stats = json.loads(stats_file.read_text())
    out = {"completions_per_sec": trained_rate(stats["update_times"]), "updates": stats["updates"],
           "completions_generated": stats["completions_trained"], "completions_trained": stats["completions_trained"],
           "evicted_untrained": 0, "generate_and_score_seconds": round(stats["generate_and_score_seconds"], 1),
           "loss_and_backward_seconds": round(stats["loss_and_backward_seconds"], 1),
           "response_tokens_mean": stats["completion_tokens_mean"], "torch_threads": stats["threads"]}
    tokens = stats["completion_tokens_mean"] or float("nan")
    out["trained_tokens_per_sec"] = out["completions_per_sec"] * tokens
    out["generated_tokens_per_sec"] = out["trained_tokens_per_sec"]  # TRL trains every completion it generates
    # TRL's generation phase holds its reward and reference log-probs too: a lower bound of its sampling rate
    out["generation_phase_tokens_per_sec"] = per_second(stats["completions_trained"] * tokens,
                                                        stats["generate_and_score_seconds"])
    out["heldout_accuracy"] = heldout_accuracy(["--model-path", str(out_dir / "merged")], problems,
                                               out_dir / "heldout.json", eval_threads(gpu))
    out.update(sampler.figures(""))
    return {f"trl_{k}": v for k, v in out.items()}


def set_up() -> None:
    """Install the peers' lock (TRL) with `make peers`: never part of `make setup` / `make run`."""
    subprocess.run(["make", "-C", str(ROOT), "peers"], check=True)


def missing_peers() -> Optional[str]:
    return None if (PEERS / "trl").is_dir() else f"TRL is not installed in {PEERS}: run `make peers` or pass --setup"


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "1 seed x 4 updates per system (a few minutes each on 2 cores)")
    ap.add_argument("--setup", action="store_true", help="install TRL (requirements/peers.lock.txt) first")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 2 (quick: 0)")
    ap.add_argument("--minutes", type=float, default=None,
                    help="training minutes per run (default 15; with --updates a cap: default 20)")
    ap.add_argument("--updates", type=int, default=None,
                    help="stop each run after this many updates (quick: 4): a fixed count, for a busy machine")
    ap.add_argument("--systems", nargs="+", default=["ours", "trl", "ours_sync"], choices=["ours", "trl", "ours_sync"])
    ap.add_argument("--log-root", default=str(ROOT / "runs" / "bench" / "lm_peers"))
    ap.add_argument("--ours-flags", default="", help="extra flags for this project's runs, e.g. \"--torch-threads 2\"")
    ap.add_argument("--gpu", action="store_true", help=GPU_HELP)
    ap.add_argument("--heldout", type=int, default=HELDOUT,
                    help=f"held-out problems each final model answers (default {HELDOUT}; fewer: a check's time budget)")
    ap.add_argument("--model-path", default=None,
                    help="a Hugging Face folder or .gguf file for both systems (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--generation-engine", choices=["auto", "vllm", "hf"], default="auto",
                    help="what generates this project's responses (--policy.generation-engine; auto: vllm where installed)")
    args = ap.parse_args(argv)
    if args.heldout < 1:
        ap.error(f"--heldout {args.heldout}: give at least 1 problem")
    gpus = cuda_gpu_count() if args.gpu else 0
    if args.gpu and not gpus:  # before the set-up, the log folder or any run
        print("bench_lm_peers: --gpu needs a CUDA GPU and torch sees none here; run it on a GPU machine "
              "(without --gpu it runs on CPU)", file=sys.stderr)
        return 3
    if args.setup:
        set_up()
    if "trl" in args.systems and missing_peers():
        print(f"error: {missing_peers()}", file=sys.stderr)
        return 2
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    updates = args.updates or (4 if args.quick else None)
    minutes = args.minutes or (20.0 if updates else 15.0)
    root = Path(args.log_root)
    model_flags = ["--model-path", args.model_path] if args.model_path else []
    if args.generation_engine != "auto":  # auto is the policy's default: nothing to pass
        model_flags += ["--policy.generation-engine", args.generation_engine]
    problems = heldout_file(root / "heldout.jsonl", args.heldout)
    figures: dict[str, Any] = {"minutes": minutes, "updates_per_run": updates or "until minutes",
                               "seeds": ",".join(map(str, seeds)), "heldout_problems": args.heldout,
                               "ours_flags": args.ours_flags, "generation_engine": args.generation_engine, "device": gpu_layout(gpus) if args.gpu else "cpu",
                               "load_avg_1min_start": machine()["load_avg_1min"]}
    per_seed: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for seed in seeds:
        for system in args.systems:  # one after the other: never two systems on the machine at once
            load = machine()["load_avg_1min"]
            got = run_trl(seed, minutes, root, problems, updates, args.model_path, args.gpu) if system == "trl" else \
                run_ours(seed, minutes, system == "ours_sync", root, problems, [*args.ours_flags.split(), *model_flags],
                         updates, args.gpu)
            got[f"{system}_load_avg_1min_before"] = load
            per_seed[system].append(got)
            figures.update({f"{k}_seed{seed}": v for k, v in got.items()})
            print(f"seed {seed} {system}: {got[f'{system}_completions_per_sec']:.3f} completions/s, held-out "
                  f"{got[f'{system}_heldout_accuracy']:.3f} (load {load})", flush=True)
            checkpoint_figures(figures, args.out)  # OUT.partial.json: a benchmark stopped early keeps what it measured
    for system, runs in per_seed.items():  # the headline: the mean over seeds
        for key in (f"{system}_completions_per_sec", f"{system}_heldout_accuracy", f"{system}_updates",
                    f"{system}_evicted_untrained", f"{system}_generated_tokens_per_sec",
                    f"{system}_generation_phase_tokens_per_sec"):
            values = [r[key] for r in runs if key in r]
            figures[key] = statistics.fmean(values) if values else float("nan")
    if "ours" in per_seed and "trl" in per_seed:
        figures["ours_over_trl_completions"] = figures["ours_completions_per_sec"] / figures["trl_completions_per_sec"]
    figures.update({k: v for k, v in machine().items() if k != "load_avg_1min"})
    figures["load_avg_1min_end"] = machine()["load_avg_1min"]
    report(figures, args, headline=["ours_completions_per_sec", "trl_completions_per_sec", "ours_over_trl_completions",
                                    "ours_sync_completions_per_sec", "ours_heldout_accuracy", "trl_heldout_accuracy",
                                    "ours_evicted_untrained", "ours_generated_tokens_per_sec",
                                    "trl_generated_tokens_per_sec", "ours_generation_phase_tokens_per_sec",
                                    "trl_generation_phase_tokens_per_sec", "device", "minutes", "seeds",
                                    "load_avg_1min_start", "load_avg_1min_end"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
