"""Export a language-model run's trained weights as a plain Hugging Face model folder.

    python launch/export_lm.py --checkpoint runs/lm_arithmetic --out exported/
    python -c "from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained('exported')"

The folder holds the base model with the run's LoRA deltas merged in (safetensors), its config and generation
config, and the tokenizer with its chat template: transformers, vLLM or `launch/eval_lm.py --model-path
exported/` load it as they load the base. The adapter alone is in the checkpoint already:
`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), "<checkpoint>/adapter")`, where
`base` is the folder its adapter_config.json names. Bad input is one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.errors import ConfigError, OneLineArgumentParser


def main(argv: Optional[list[str]] = None) -> int:
    parser = OneLineArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True,
                        help="a run's log dir (its newest checkpoint), its checkpoints/ dir or one epoch-* dir")
    parser.add_argument("--out", required=True, help="the new model folder (must not exist)")
    args = parser.parse_args(argv)
    from async_rl.policies.lm_export import export_merged_lm  # imports torch and transformers

    try:
        base = export_merged_lm(args.checkpoint, Path(args.out))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"exported {args.checkpoint} (base {base}, LoRA merged) to {args.out}: "
          f"AutoModelForCausalLM.from_pretrained({args.out!r}) loads it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
