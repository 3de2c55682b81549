"""GRPO on a pretrained causal language model with verifiable rewards: --env arithmetic (the default,
configs/lm_arithmetic.yaml) or --env humaneval (code run against the problem's asserts in a sandbox,
configs/lm_humaneval.yaml, chosen by the variant in the arithmetic config). The model is
SmolLM2-135M-Instruct unless --model-path names a Hugging Face folder or a .gguf file; LoRA on the
attention and MLP projections, the reference is the model with its adapters off, and the inference
actors receive only the adapters. After training, the final weights answer the held-out problems
greedily (eval/ scalars, eval_problems.json).

    python launch/ds_lm_grpo.py --max-minutes 20
    python launch/ds_lm_grpo.py --env humaneval --clip-mode pacs
"""
from pathlib import Path

from async_rl.driver import main

if __name__ == "__main__":
    config = Path(__file__).resolve().parents[1] / "configs" / "lm_arithmetic.yaml"
    main(str(config), __doc__)
