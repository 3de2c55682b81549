#!/usr/bin/env bash
# What only a GPU can show, in one command: tests/gpu, the weight-sync benchmark on CUDA tensors, a short
# causal-LM GRPO run (ZeRO-2 bf16 LoRA updates, generation tokens/s) and the quick GPU preset of the language-model
# benchmark against TRL (bench_lm_peers.py --gpu), written to one JSON. At most ~8 minutes on one GPU
# (--budget-minutes). On a machine without a GPU it says so in one line and exits 3.
#
#   bash scripts/gpu_check.sh [--out runs/gpu_check/gpu_check.json] [--budget-minutes 8] [--skip STEP ...]
#
# The interpreter is the project's .venv where it exists (a GPU machine set up by `make setup` holds torch's
# CUDA build), else python3 (e.g. a GPU image with torch and the project's other packages already on it).
# Options and exit codes: scripts/gpu_check.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${GPU_CHECK_PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
exec "$PY" scripts/gpu_check.py --python "$PY" "$@"
