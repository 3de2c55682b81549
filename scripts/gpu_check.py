"""What only a GPU can show, in one command and one JSON: run first on any machine with a CUDA GPU.

    bash scripts/gpu_check.sh [--out runs/gpu_check/gpu_check.json] [--budget-minutes 8] [--skip STEP ...]

Steps, each a subprocess with its own time limit (so one hang cannot eat the budget), in this order:

1. ``tests``: ``pytest tests/gpu`` (ZeRO-2 bf16 training and inference on CUDA, the weight-sync group's NCCL
   and gloo paths; tests needing more GPUs than visible skip themselves): passed / failed / skipped counts.
2. ``weight_sync``: ``benchmarks/bench_weight_sync.py --device cuda``: the weight-sync group against the Ray
   object store for GPU-resident tensors; NCCL between two GPUs where two are visible, else gloo through host
   memory (two processes cannot share one GPU in one NCCL group).
3. ``lm_grads``: ``benchmarks/gpu_lm_grads.py``: the causal-LM policy with the run's LoRA adapters in bf16, no
   DeepSpeed, on micro-batches of the run's prompts: every LoRA tensor's raw gradient finite or not, with torch's
   default attention and with each SDPA backend alone, which attention operators ran, the SDPA flags, and per
   micro-batch its width and left-padded rows (what tells a kernel's NaN from DeepSpeed's or the trainer's skips).
4. ``lm_grpo``: ``benchmarks/gpu_lm_grpo.py --epochs 5``: a short GRPO run of the causal-LM policy (ZeRO-2 bf16 LoRA
   updates end to end, adapters synced to the inference actor) and its generation tokens/s.
5. ``lm_peers``: ``benchmarks/bench_lm_peers.py --gpu --quick --updates 3 --heldout 16`` (the LM GRPO comparison with TRL on the GPU preset:
   trainer and generation on separate GPUs where 2+ are visible, sharing one otherwise) for this project's
   asynchronous run and TRL's GRPOTrainer: completions trained/s, generation tokens/s, held-out accuracy. TRL
   needs ``make peers`` (.venv-peers); without it only this project's run is measured and
   ``lm_peers_trl_skipped`` says why.

Writes ``--out`` (flat JSON: ``<step>_<figure>`` keys, each step's ``<step>_ok`` and ``<step>_seconds``, the card's
name, the date, ``skipped_updates``: the optimiser updates any step reports skipped) and prints one line per step.
Exit codes: 0 every step passed and no update was skipped, 1 a step failed or an update was skipped, 2 bad
arguments, 3 no CUDA GPU on this machine (one line says so; nothing is written).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from async_rl.errors import OneLineArgumentParser  # noqa: E402  (stdlib imports only)
from benchmarks.bench_lm_peers import missing_peers  # noqa: E402  (stdlib imports only: no torch)

STEPS = ("tests", "weight_sync", "lm_grads", "lm_grpo", "lm_peers")
BUDGET_MINUTES = 10.0
# Each step's share of the budget; a step is killed at its share. lm_grpo took 154 s for 3 epochs on an H200 (RESULTS
# section 20), mostly start-up: 0.4 of 10 minutes is 240 s for 5. lm_peers (not yet run on a GPU): two model
# start-ups, 3 updates each and two CPU evaluations of LM_PEERS_HELDOUT problems, estimated at ~2.2 of its 2.8 minutes.
SHARES = {"tests": 0.16, "weight_sync": 0.08, "lm_grads": 0.08, "lm_grpo": 0.4, "lm_peers": 0.28}
LM_GRPO_EPOCHS = 5  # one optimiser update each: the fewest that show updates are not skipped by chance
LM_PEERS_UPDATES = 3  # two intervals between updates: the fewest a rate needs, and one more
LM_PEERS_HELDOUT = 16  # one batch of eval_lm: the scoring path is checked, accuracy is the full benchmark's figure


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = OneLineArgumentParser(prog="scripts/gpu_check.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "runs" / "gpu_check" / "gpu_check.json"), help="the JSON to write")
    ap.add_argument("--budget-minutes", type=float, default=BUDGET_MINUTES,
                    help=f"the whole check's time (default {BUDGET_MINUTES:g})")
    ap.add_argument("--skip", nargs="*", default=[], choices=STEPS, help="steps not to run")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs each step")
    ap.add_argument("--tests", nargs="+", default=["tests/gpu"], help="what the tests step runs (default tests/gpu)")
    ap.add_argument("--lm-model-path", default=None, help="the LM step's model (default: the project's default model)")
    ap.add_argument("--lm-random-smollm2-shape", default=None, metavar="TOKENIZER_DIR",
                    help="the LM step builds a random SmolLM2-135M-shaped model around this tokenizer folder")
    args = ap.parse_args(argv)
    if not 1 <= args.budget_minutes <= 60:
        ap.error(f"--budget-minutes {args.budget_minutes}: give 1 to 60 minutes")
    if args.lm_model_path and args.lm_random_smollm2_shape:
        ap.error("give --lm-model-path or --lm-random-smollm2-shape, not both")
    return args


def gpu_name() -> Optional[str]:
    """The first CUDA device's name, or None where torch sees no GPU (or is not installed)."""
    try:
        import torch  # noqa: PLC0415 (optional: the check also runs where torch is not installed)
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def pytest_counts(output: str) -> dict[str, int]:
    """passed / failed / skipped / errors from pytest's closing line (0 for a word it does not print)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    tail = output.strip().splitlines()[-1] if output.strip() else ""
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", tail):
        counts["errors" if word.startswith("error") else word] += int(number)
    return counts


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def run_step(command: list[str], limit_s: float, log: Path) -> tuple[int, str, float]:
    """(exit code, output, seconds) of ``command``; 124 when it ran past ``limit_s`` (then killed)."""
    started = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=limit_s, env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        code, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        code = 124
    log.write_text(output)
    return code, output, time.monotonic() - started


def lm_peers_command(args: argparse.Namespace, work: Path) -> tuple[list[str], dict[str, Any]]:
    """The lm_peers step's command and the figures it adds itself (why TRL was skipped)."""
    trl_missing = missing_peers()
    systems = ["ours"] if trl_missing else ["ours", "trl"]  # --sync left to the full benchmark: the budget
    # a random model's accuracy means nothing and TRL would need it saved: the real model or none
    model = ["--model-path", args.lm_model_path] if args.lm_model_path else []
    for stale in ("lm_peers.json", "lm_peers.partial.json"):  # an earlier check's figures must not pass for these
        (work / stale).unlink(missing_ok=True)
    # --minutes caps each run: its 3 updates take seconds on a GPU, so the cap only stops a hang early
    command = [args.python, "benchmarks/bench_lm_peers.py", "--gpu", "--quick", "--updates", str(LM_PEERS_UPDATES),
               "--minutes", "2", "--heldout", str(LM_PEERS_HELDOUT), "--systems", *systems,
               "--log-root", str(work / "lm_peers_runs"),
               "--out", str(work / "lm_peers.json"), *model]
    return command, ({"trl_skipped": trl_missing} if trl_missing else {})


def step_commands(args: argparse.Namespace, work: Path) -> dict[str, tuple[list[str], Callable[[int, str], dict]]]:
    """Each step's command and how its figures are read (from its exit code and output)."""
    py = args.python
    lm_model = (["--model-path", args.lm_model_path] if args.lm_model_path else
                ["--random-smollm2-shape", args.lm_random_smollm2_shape] if args.lm_random_smollm2_shape else [])
    peers_command, peers_notes = lm_peers_command(args, work)
    return {
        "tests": ([py, "-m", "pytest", *args.tests, "-q", "-p", "no:cacheprovider", "--timeout=300", "-rs"],
                  lambda code, out: {**pytest_counts(out), "ok": code == 0}),
        "weight_sync": ([py, "benchmarks/bench_weight_sync.py", "--quick", "--device", "cuda", "--params-m", "",
                         "--out", str(work / "weight_sync.json")],
                        lambda code, out: {**read_json(work / "weight_sync.json"), "ok": code == 0}),
        "lm_grads": ([py, "benchmarks/gpu_lm_grads.py", "--out", str(work / "lm_grads.json"), *lm_model],
                     lambda code, out: {**read_json(work / "lm_grads.json"), "ok": code == 0}),
        "lm_grpo": ([py, "benchmarks/gpu_lm_grpo.py", "--epochs", str(LM_GRPO_EPOCHS), "--out", str(work / "lm_grpo.json"),
                     *lm_model],
                    lambda code, out: {**read_json(work / "lm_grpo.json"), "ok": code == 0}),
        # killed at its limit, the benchmark's .partial.json still holds the runs it finished
        "lm_peers": (peers_command, lambda code, out: {**(read_json(work / "lm_peers.json") or
                                                          read_json(work / "lm_peers.partial.json")),
                                                       **peers_notes, "ok": code == 0}),
    }


def flatten(step: str, figures: dict[str, Any]) -> dict[str, Any]:
    """``<step>_<key>`` for every scalar figure (nested or list values are left to the step's own file)."""
    return {f"{step}_{k}": v for k, v in figures.items() if isinstance(v, (int, float, str, bool, type(None)))}


def skipped_updates(figures: dict[str, Any]) -> int:
    """Optimiser updates the steps report skipped (``<step>_skipped_updates``, ``<step>_<system>_skipped_updates``)."""
    return int(sum(v for k, v in figures.items() if k.endswith("skipped_updates") and isinstance(v, (int, float))
                   and not isinstance(v, bool)))


def main(argv: Optional[list[str]] = None, detect: Callable[[], Optional[str]] = gpu_name) -> int:
    args = parse_args(argv)
    device = detect()
    if device is None:
        print("gpu_check: no CUDA GPU on this machine (torch.cuda.is_available() is False); nothing checked, "
              "nothing written: run it on a machine with a GPU", file=sys.stderr)
        return 3
    out = Path(args.out)
    work = out.parent / "steps"
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    figures: dict[str, Any] = {"device_name": device, "date": datetime.date.today().isoformat(),
                               "budget_minutes": args.budget_minutes}
    failed = []
    for step, (command, read) in step_commands(args, work).items():
        if step in args.skip:
            figures[f"{step}_ok"] = None
            continue
        code, output, seconds = run_step(command, 60 * args.budget_minutes * SHARES[step], work / f"{step}.log")
        result = read(code, output)
        if code == 124:
            result["timed_out"] = True
        figures.update(flatten(step, result))
        figures[f"{step}_seconds"] = round(seconds, 1)
        if not result["ok"]:
            failed.append(step)
        print(f"gpu_check: {step}: {'ok' if result['ok'] else 'FAILED'} in {seconds:.0f} s (log {work / f'{step}.log'})",
              flush=True)
        if result.get("trl_skipped"):
            print(f"gpu_check: {step}: TRL skipped: {result['trl_skipped']}", flush=True)
        out.write_text(json.dumps(figures, indent=2) + "\n")  # what is measured so far survives a later hang
    figures["skipped_updates"] = skipped_updates(figures)
    if figures["skipped_updates"]:
        print(f"gpu_check: {figures['skipped_updates']} optimiser update(s) skipped: a run that skips updates does not "
              "learn (lm_grads tells a kernel's non-finite gradients from DeepSpeed's or the trainer's skips)", flush=True)
        failed.append("skipped updates")
    figures["all_ok"] = not failed
    figures["total_seconds"] = round(time.monotonic() - started, 1)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"gpu_check: {'all steps passed' if not failed else 'failed: ' + ', '.join(failed)}; figures in {out}")
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
