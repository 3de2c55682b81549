"""Where non-finite LM gradients come from, without DeepSpeed: the causal-LM policy with the LM run's LoRA
adapters and dtype (bf16 on CUDA), on micro-batches of the run's own prompts (chat template, left padding, mixed
lengths), one forward and backward of the response log-probs per micro-batch and per SDPA backend.

    python benchmarks/gpu_lm_grads.py --out runs/gpu_check/lm_grads.json [--model-path DIR] [--device cuda]

It tells the suspected causes of skipped updates apart (benchmarks/RESULTS.md, section 20):

* ``raw_grads_finite``, ``nonfinite_lora_tensors`` (of ``lora_tensors``), ``nonfinite_lora_names``: the gradient
  of every LoRA tensor after backward with torch's default attention kernels, before any optimiser or DeepSpeed
  sees it. Finite here while the run's updates are skipped points at DeepSpeed or the trainer's own guards;
* ``<backend>_nonfinite_lora_tensors`` (or ``<backend>_error``) for each SDPA backend alone (``cudnn``,
  ``flash``, ``efficient``, ``math``): a backend that alone gives non-finite gradients is the kernel at fault
  (cuDNN with fully masked query rows is the one reported upstream);
* ``sdpa_flags``: torch.backends.cuda's enabled SDPA backends; ``sdpa_ops_ran``: the attention operators the
  profiler saw in the default backward (which kernel actually ran); ``attn_implementation``: the model's;
* per micro-batch, ``micro_batches`` (width, rows, rows with left padding, left-padding positions: query rows
  whose keys are all masked unless the policy lets a pad attend to itself), and their totals ``max_width``,
  ``padded_rows``, ``left_pad_positions``.

Exits 0 when the default backend's gradients are all finite, 1 when not, 2 on bad arguments or without the
device asked for. ``--device cpu`` runs the same probe on a CPU (fp32; no cuDNN kernels there).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.errors import OneLineArgumentParser
from benchmarks.common import ROOT

BACKENDS = ("cudnn", "flash", "efficient", "math")  # torch.nn.attention.SDPBackend's, by short name
NAMED = 8  # non-finite LoRA tensors named in the JSON (the count covers all)


def padding_shape(input_ids: Any, attention_mask: Any, response: Any) -> dict[str, int]:
    """What one micro-batch hands attention once the policy trims it (``trim_left_padding``, the used response
    columns): its width, its rows, the rows that still start with padding, and those rows' padding positions."""
    from async_rl.policies.causal_lm import trim_left_padding

    _, mask = trim_left_padding(input_ids, attention_mask)
    used = (response >= 0).any(dim=0).nonzero()
    response_width = int(used[-1]) + 1 if len(used) else 1
    leading_pads = (mask.cumsum(dim=1) == 0).sum(dim=1)
    return {"width": int(mask.shape[1] + response_width), "rows": int(mask.shape[0]),
            "padded_rows": int((leading_pads > 0).sum()), "left_pad_positions": int(leading_pads.sum())}


def lora_gradients(model: Any) -> tuple[int, list[str]]:
    """(LoRA tensors, names of those whose gradient is missing or holds a non-finite value)."""
    import torch

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad and "lora_" in n]
    bad = [n for n, p in named if p.grad is None or not bool(torch.isfinite(p.grad).all())]
    return len(named), bad


def backward_pass(model: Any, batches: list[tuple[Any, Any]], kernel: Optional[Any] = None) -> tuple[int, list[str]]:
    """Zeroed gradients, then one backward of the mean response log-prob per micro-batch (summed as an
    accumulation window sums), under SDPA ``kernel`` (None: torch's choice); the LoRA gradients after it."""
    import contextlib

    from torch.nn.attention import sdpa_kernel

    model.zero_grad(set_to_none=True)
    with sdpa_kernel([kernel]) if kernel is not None else contextlib.nullcontext():
        for obs, response in batches:
            logp, _, _ = model.evaluate(obs, response)
            real = (response >= 0).to(logp.dtype)
            (-(logp * real).sum() / real.sum().clamp_min(1)).backward()
    return lora_gradients(model)


def attention_ops(run: Callable[[], Any]) -> list[str]:
    """The scaled-dot-product attention operators (forward and backward) the profiler saw while ``run`` ran."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        run()
    return sorted({e.name for e in prof.events() if "attention" in e.name and e.name.startswith("aten::")})


def sdpa_flags() -> dict[str, bool]:
    import torch

    cuda = torch.backends.cuda
    return {"flash": cuda.flash_sdp_enabled(), "efficient": cuda.mem_efficient_sdp_enabled(),
            "cudnn": cuda.cudnn_sdp_enabled(), "math": cuda.math_sdp_enabled()}


def probe(model: Any, batches: list[tuple[Any, Any]], device_type: str) -> dict[str, Any]:
    """Every figure of the module's docstring for ``model`` (trainable LoRA, on its device) over ``batches``."""
    from torch.nn.attention import SDPBackend

    shapes = [padding_shape(obs["input_ids"], obs["attention_mask"], response) for obs, response in batches]
    figures: dict[str, Any] = {
        "micro_batches": shapes, "max_width": max(s["width"] for s in shapes),
        "padded_rows": sum(s["padded_rows"] for s in shapes),
        "left_pad_positions": sum(s["left_pad_positions"] for s in shapes),
        "attn_implementation": str(getattr(model.lm.config, "_attn_implementation", "?")),
        **{f"sdpa_flag_{k}": v for k, v in sdpa_flags().items()}}
    result: list[tuple[int, list[str]]] = []
    figures["sdpa_ops_ran"] = ", ".join(attention_ops(lambda: result.append(backward_pass(model, batches))))
    tensors, bad = result[0]
    figures.update(lora_tensors=tensors, nonfinite_lora_tensors=len(bad), nonfinite_lora_names=", ".join(bad[:NAMED]),
                   raw_grads_finite=not bad and tensors > 0)
    kernels = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
    for name in BACKENDS:
        if device_type != "cuda" and name != "math":
            continue  # the CPU has its own fused kernel and math; the CUDA kernels are the suspects
        try:
            figures[f"{name}_nonfinite_lora_tensors"] = len(backward_pass(model, batches, getattr(SDPBackend, kernels[name]))[1])
        except RuntimeError as exc:  # the kernel does not take these inputs (dtype, mask, card)
            figures[f"{name}_error"] = (str(exc).strip().splitlines() or [""])[0][:200]
    model.zero_grad(set_to_none=True)
    return figures


def lm_batches(cfg: Any, rows: int, seed: int = 0) -> tuple[Any, list[tuple[Any, Any]]]:
    """The LM run's training model (LoRA as configured) and ``rows`` held-out prompts as micro-batches of the
    run's ``train_batch_size``, each with a random response of random length (real tokens, then -1)."""
    import torch
    from tensordict import TensorDict

    from async_rl.actors.trainer_setup import training_model
    from async_rl.policies.lm_checkpoint import load_lm_policy
    from envs.arithmetic import heldout_problems

    policy, preprocess, _ = load_lm_policy(overrides={k: v for k, v in cfg.policy_kwargs.items() if k != "model_path"},
                                           model_path=cfg.model_path)
    model = training_model(cfg, lambda: policy)
    obs = torch.stack([preprocess({"prompt": p["prompt"]}) for p in heldout_problems(rows, 2)])
    g = torch.Generator().manual_seed(seed)
    width = policy.max_new_tokens
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    response = torch.randint(3, policy.lm.config.vocab_size, (rows, width), generator=g)
    response[torch.arange(width)[None, :] >= lengths[:, None]] = -1
    step = cfg.train_batch_size
    batches = [(TensorDict(dict(obs[i:i + step].items()), [min(step, rows - i)]), response[i:i + step])
               for i in range(0, rows, step)]
    return model, batches


def main(argv: Optional[list[str]] = None) -> int:
    ap = OneLineArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="write the figures here as JSON")
    ap.add_argument("--model-path", default=None, help="a Hugging Face folder or .gguf file (default: SmolLM2-135M)")
    ap.add_argument("--random-smollm2-shape", default=None, metavar="TOKENIZER_DIR",
                    help="a random SmolLM2-135M-shaped model around this tokenizer folder (as gpu_lm_grpo.py builds it)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--rows", type=int, default=32, help="prompts, in micro-batches of the run's train_batch_size")
    args = ap.parse_args(argv)
    if args.rows < 1:
        ap.error(f"--rows {args.rows}: give at least 1")
    if args.model_path and args.random_smollm2_shape:
        ap.error("give --model-path or --random-smollm2-shape, not both")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_lm_grads: no CUDA GPU present; pass --device cpu to run the probe on the CPU", file=sys.stderr)
        return 2
    from async_rl.config import load_config
    from async_rl.errors import ConfigError
    from async_rl.policies.nets import cast_parameters
    from async_rl.process_setup import precision_dtype
    from benchmarks.gpu_lm_grpo import chosen_model

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model_path = chosen_model(args.model_path, args.random_smollm2_shape, out.parent / "random_smollm2_135m_grads")
    flags = ["--device", args.device, "--precision", "auto", *(["--model-path", model_path] if model_path else [])]
    try:
        cfg = load_config(flags, str(ROOT / "configs" / "lm_arithmetic.yaml"))
        model, batches = lm_batches(cfg, args.rows)
    except ConfigError as exc:
        print(f"gpu_lm_grads: {exc}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    dtype = precision_dtype(cfg.precision, device)
    model = cast_parameters(model.to(device), dtype).train()
    batches = [(obs.to(device), response.to(device)) for obs, response in batches]
    figures = {"device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "dtype": str(dtype),
               "torch": torch.__version__, **probe(model, batches, device.type)}
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "micro_batches"}))
    return 0 if figures["raw_grads_finite"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
