"""CTRL: does the critic's model hold any signal that tells a correct solution from a mutant?

    python benchmarks/probe_ctrl_signal.py --out runs/bench/ctrl_signal_base.json
    python benchmarks/probe_ctrl_signal.py --init-from runs/bench/ctrl/sft-seed-0/policy --out runs/bench/ctrl_signal_sft.json

Forward passes only, on the cases of configs/ctrl_humaneval.yaml (train and held-out, after its prompt-length
filter), no generation:

- ``judgment_auc_<split>``: after the critic prompt and "Overall judgment:", how well log P(" Correct") minus
  log P(" Incorrect") ranks correct solutions above incorrect ones (area under the ROC curve; 0.5 is chance);
- ``decision_auc_<split>``: the same at the token where the supervised stage's two critiques part (the
  approval against the critique that names a wrong line: "Analysis: The code ..." / "Analysis: The line ..."),
  where a supervised critic decides; ``decision_correct_share_<split>``: how often that token favours approval;
- ``likelihood_pair_<split>``: over pairs of one problem's reference solution and one of its mutants, how
  often the model finds the reference's critic prompt likelier: the signal in the model's own code prior.
A critic trained with the revision reward can only learn a judgment the model can represent; a pair share far
above its AUCs says the signal exists in the model's likelihood but not in what it says about the code.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, machine, parser, report

CONFIG = ROOT / "configs" / "ctrl_humaneval.yaml"


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """P(a correct case scores above an incorrect one), ties counting half."""
    positive = [s for s, y in zip(scores, labels) if y]
    negative = [s for s, y in zip(scores, labels) if not y]
    if not positive or not negative:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in positive for n in negative)
    return wins / (len(positive) * len(negative))


def pair_share(likelihoods: Sequence[float], cases: Sequence[dict[str, Any]]) -> float:
    """The share of (reference, mutant) pairs of one problem in which the reference is likelier."""
    wins = [likelihoods[i] > likelihoods[j] for i, a in enumerate(cases) if a["correct"]
            for j, b in enumerate(cases) if not b["correct"] and b["task_id"] == a["task_id"]]
    return sum(wins) / len(wins) if wins else float("nan")


def parting(tokenizer: Any, first: str, second: str) -> tuple[list[int], int, int]:
    """(the tokens two texts share from the start, the first token of each after them)."""
    a = tokenizer(first, add_special_tokens=False)["input_ids"]
    b = tokenizer(second, add_special_tokens=False)["input_ids"]
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    return a[:shared], a[shared], b[shared]


def measure(model: Any, preprocess: Any, tokenizer: Any, cases: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    import torch

    from async_rl.ctrl.critique import JUDGMENT_CORRECT, critic_prompt
    from async_rl.ctrl.critique_sft import APPROVAL

    judge_head, judge_yes, judge_no = parting(tokenizer, JUDGMENT_CORRECT, JUDGMENT_CORRECT.replace("Correct", "Incorrect"))
    decide_head, decide_yes, decide_no = parting(tokenizer, APPROVAL, "Analysis: The line `x = 1` is wrong")
    out: dict[str, list[float]] = {"judgment": [], "decision": [], "likelihood": []}
    with torch.inference_mode():
        for case in cases:
            prompt = preprocess.prompt_ids(critic_prompt(case["prompt"], case["solution"]))
            for key, head, yes, no in (("judgment", judge_head, judge_yes, judge_no),
                                       ("decision", decide_head, decide_yes, decide_no)):
                last = model(torch.tensor([prompt + head])).logits[0, -1].log_softmax(-1)
                out[key].append(float(last[yes] - last[no]))
            ids = torch.tensor([prompt])
            log_probs = model(ids).logits[0, :-1].log_softmax(-1).gather(1, ids[0, 1:, None])
            out["likelihood"].append(float(log_probs.sum()))
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = parser(__doc__, "the same measure (it has one size)")
    ap.add_argument("--init-from", default=None, help="a supervised critic's export (default: the base model)")
    args = ap.parse_args(argv)
    import torch

    from async_rl.config import load_config
    from async_rl.driver import prepare
    from async_rl.policies.causal_lm import load_tokenizer
    from async_rl.policies.lm_checkpoint import load_lm_policy

    started = time.monotonic()
    cfg = load_config(["--swanlab-mode", "disabled"], str(CONFIG))
    task_set = prepare(cfg)
    torch.set_num_threads(cfg.torch_threads)
    overrides = {"max_prompt_tokens": 1024}
    policy, preprocess, description = (load_lm_policy(init_from=args.init_from, overrides=overrides) if args.init_from
                                       else load_lm_policy(overrides=overrides))
    tokenizer = load_tokenizer(preprocess.model_path)
    figures: dict[str, Any] = {"critic": description, "load_avg_1min_start": machine()["load_avg_1min"]}
    for split, cases in (("heldout", task_set.heldout), ("train", task_set.train)):
        scores = measure(policy.lm, preprocess, tokenizer, cases)
        labels = [bool(c["correct"]) for c in cases]
        figures.update({f"cases_{split}": len(cases), f"correct_{split}": sum(labels),
                        f"judgment_auc_{split}": auc(scores["judgment"], labels),
                        f"decision_auc_{split}": auc(scores["decision"], labels),
                        f"decision_correct_share_{split}": sum(s > 0 for s in scores["decision"]) / len(cases),
                        f"likelihood_pair_{split}": pair_share(scores["likelihood"], cases)})
        print(f"{split}: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items() if k.endswith(split)
                                       and isinstance(v, float)), flush=True)
    figures.update({k: v for k, v in machine().items() if k != "load_avg_1min"})
    figures["seconds"] = time.monotonic() - started
    report(figures, args, headline=["judgment_auc_heldout", "decision_auc_heldout", "likelihood_pair_heldout"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
