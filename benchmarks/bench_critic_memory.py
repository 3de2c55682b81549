"""What dropping the critic saves: trainable parameters, optimiser state and the weight broadcast.

    python benchmarks/bench_critic_memory.py [--quick] [--cases metaworld,compilergym,libero] [--out FILE.json]

For each launch's policy (MetaWorld MLP, CompilerGym MLP, the LIBERO tiny VLA with its LoRA adapters) and
each estimator (``gae``: PPO with a critic; ``grpo``: group-relative, no critic), the model is built the
way a trainer rank builds it (``Runtime.policy_factory`` -> ``trainer_setup.training_model``: the policy, LoRA,
the critic frozen when the estimator needs none) and measured:

* ``params`` / ``trainable_params``: all parameters / those the optimiser updates;
* ``optimizer_state_bytes``: the state of the AdamW the trainer hands to DeepSpeed, after one real step
  (``exp_avg`` and ``exp_avg_sq`` per trainable tensor); ZeRO-2 splits it over the trainer ranks;
* ``grad_bytes``: one gradient per trainable parameter;
* ``broadcast_bytes`` / ``broadcast_tensors``: ``inference_tensors()``, what the weight sync sends to
  every inference actor after every update.

``<case>_broadcast_ratio`` = grpo / gae bytes. Sizes, not times: the machine's load does not matter.
``--quick`` measures MetaWorld only. Nothing is asserted.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import common

CASES = {"metaworld": "metaworld_mt1_ppo.yaml", "compilergym": "compilergym_mlp.yaml", "libero": "libero_ppo.yaml"}
ESTIMATORS = {"gae": [], "grpo": ["--advantage", "grpo", "--group-size", "8"]}


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(config: Path, argv: list[str]) -> dict[str, Any]:
    """Sizes of the model a trainer rank builds for ``config`` + ``argv`` (no Ray, one process)."""
    from async_rl.actors.trainer_setup import optimizer_groups, training_model
    from async_rl.config import load_config
    from async_rl.driver import prepare
    from async_rl.orchestration.runtime import Runtime

    cfg = load_config(argv, str(config))
    task_set = prepare(cfg)
    try:
        model = training_model(cfg, Runtime(cfg, task_set).policy_factory)
    finally:
        close = getattr(task_set, "close", None)
        if callable(close):
            close()
    groups = optimizer_groups(cfg, model)
    trainable = [p for g in groups for p in g["params"]]
    optimizer = torch.optim.AdamW(groups)
    for p in trainable:
        p.grad = torch.zeros_like(p)
    optimizer.step()  # AdamW allocates its state on the first step
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    sent = [t for _, t in model.inference_tensors()]
    return {"params": sum(p.numel() for p in model.parameters()), "trainable_params": sum(p.numel() for p in trainable),
            "optimizer_state_bytes": _nbytes(state), "grad_bytes": _nbytes(trainable),
            "broadcast_bytes": _nbytes(sent), "broadcast_tensors": len(sent), "has_critic": model.has_critic,
            "trainer_ranks": cfg.num_trainers}


def main() -> None:
    ap = common.parser(__doc__, "MetaWorld only")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    args = ap.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        sys.exit(f"bench_critic_memory: unknown case(s) {unknown}; use --cases with {', '.join(CASES)}")
    if args.quick:
        cases = ["metaworld"]
    if "libero" in cases and common.libero_unavailable():
        print(f"libero skipped: {common.libero_unavailable()}")
        cases.remove("libero")
    figures: dict[str, Any] = {"quick": args.quick, **common.machine()}
    rows = []
    for case in cases:
        for est, argv in ESTIMATORS.items():
            sizes = measure(common.ROOT / "configs" / CASES[case], argv)
            rows.append({"case": case, "estimator": est, **sizes})
            figures.update({f"{case}_{est}_{k}": v for k, v in sizes.items()})
        figures[f"{case}_broadcast_ratio"] = common.ratio(figures[f"{case}_grpo_broadcast_bytes"],
                                                          figures[f"{case}_gae_broadcast_bytes"])
        figures[f"{case}_optimizer_state_ratio"] = common.ratio(figures[f"{case}_grpo_optimizer_state_bytes"],
                                                                figures[f"{case}_gae_optimizer_state_bytes"])
    common.print_table(rows, title="critic (gae) vs none (grpo)")
    common.report(figures, args, headline=[k for k in figures if k.endswith("_ratio")])


if __name__ == "__main__":
    main()
