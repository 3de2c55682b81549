#!/usr/bin/env bash
# Refresh the lock: every Python package of both environments pinned with sha256 hashes
# (`make lock`). scripts/setup.sh installs exactly these files with `pip --require-hashes`.
#
#   scripts/lock.sh              keep every pin that still fits the inputs (uv prefers the existing lock)
#   scripts/lock.sh --upgrade    newest versions the inputs allow
#
# Inputs -> outputs (all in requirements/):
#   setup.py [metaworld,libero,dev] + main.in -> main.lock.txt      the project's .venv (Python 3.11)
#   torch-cpu.in                              -> torch-cpu.lock.txt  torch's CPU build, installed first
#   no-deps.in                                -> no-deps.lock.txt    packages installed with --no-deps
#   compilergym.in                            -> compilergym.lock.txt   .venv-compilergym (Python 3.10)
#   peers.in                                  -> peers.lock.txt    `make peers` only (bench_lm_peers.py)
#   vllm.in                                   -> vllm.lock.txt     .venv-vllm/site-packages (the vLLM engine's process)
#
# The tool: uv (pinned below), in a throwaway venv. The inputs need both Pythons (3.11 and 3.10) that
# scripts/setup.sh finds; markers and wheels are resolved for this platform (Linux x86-64).
set -euo pipefail

UV_VERSION="0.13.9"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
REQ=requirements  # relative: the files record the paths they were made from
UPGRADE=()
for arg in "$@"; do
    case "$arg" in
        --upgrade) UPGRADE=(--upgrade) ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "lock: unknown argument: $arg" >&2; exit 2 ;;
    esac
done
log() { echo "[lock] $*"; }

for py in .venv/bin/python .venv-compilergym/bin/python; do
    [ -x "$py" ] || { echo "lock: $py missing; run scripts/setup.sh first (it finds Python 3.11 and 3.10)" >&2; exit 2; }
done

TOOLS="$(mktemp -d)"
trap 'rm -rf "$TOOLS"' EXIT
log "uv $UV_VERSION into a throwaway venv"
.venv/bin/python -m venv "$TOOLS/venv"
"$TOOLS/venv/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2 || true)
UV="$TOOLS/venv/bin/uv"
# The header each file records: the refresh command, not this script's temporary paths.
export UV_CUSTOM_COMPILE_COMMAND="make lock"

# torch's CPU build is not on PyPI: it comes from a find-links folder (this machine's /opt/wheels) or
# the CPU index (TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu); its hash is the file's.
TORCH_SOURCES=()
[ -d /opt/wheels ] && TORCH_SOURCES+=(--find-links /opt/wheels)
[ -n "${TORCH_INDEX_URL:-}" ] && TORCH_SOURCES+=(--extra-index-url "$TORCH_INDEX_URL")
COMMON=(--generate-hashes --quiet --index-strategy unsafe-best-match "${UPGRADE[@]}")

log "main.lock.txt (Python 3.11: setup.py with its extras + main.in)"
# torch-cpu.in as a constraint: the resolution sees torch's CPU build (PyPI's 2.13.0 is the CUDA one and
# brings nvidia-* packages); torch itself goes to its own file.
"$UV" pip compile setup.py "$REQ/main.in" -c "$REQ/torch-cpu.in" --extra metaworld --extra libero --extra dev \
    --python .venv/bin/python "${COMMON[@]}" "${TORCH_SOURCES[@]}" \
    --no-emit-package torch -o "$REQ/main.lock.txt"
# torch with its dependencies at main.lock.txt's versions (uv hashes a find-links file only when it
# reads the wheel's metadata, which --no-deps skips).
log "torch-cpu.lock.txt"
"$UV" pip compile "$REQ/torch-cpu.in" -c "$REQ/main.lock.txt" --python .venv/bin/python "${COMMON[@]}" \
    "${TORCH_SOURCES[@]}" -o "$REQ/torch-cpu.lock.txt"
log "no-deps.lock.txt"
"$UV" pip compile "$REQ/no-deps.in" --no-deps --python .venv/bin/python "${COMMON[@]}" -o "$REQ/no-deps.lock.txt"

# CompilerGym: uv cannot read gym 0.21.0's metadata (its extras hold `opencv-python>=3.`, not a valid
# version), so pip resolves the inputs in a throwaway Python 3.10 venv (building gym's sdist with the
# venv's own setuptools, as the set-up does) and uv pins the result with hashes, taking no dependency
# from metadata (--no-deps: the list is already complete).
log "compilergym.lock.txt (Python 3.10: pip resolves, uv adds the hashes)"
PY310="$(.venv-compilergym/bin/python -c 'import sys; print(sys._base_executable)')"
"$PY310" -m venv "$TOOLS/cg"
if [ ${#UPGRADE[@]} -eq 0 ] && [ -f "$REQ/compilergym.lock.txt" ]; then
    # keep the locked versions: the old lock constrains the resolution (hashes stripped)
    sed -n 's/^\([A-Za-z0-9_.-]*==[^ ]*\).*/\1/p' "$REQ/compilergym.lock.txt" > "$TOOLS/cg-pins.txt"
else
    : > "$TOOLS/cg-pins.txt"
fi
"$TOOLS/cg/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "$REQ/compilergym.in" -c "$TOOLS/cg-pins.txt" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2 || true)
"$TOOLS/cg/bin/python" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null > "$TOOLS/cg-resolved.txt"
"$UV" pip compile "$TOOLS/cg-resolved.txt" --no-deps --python "$TOOLS/cg/bin/python" "${COMMON[@]}" \
    -o "$REQ/compilergym.lock.txt"
sed -i "s#$TOOLS/cg-resolved.txt#requirements/compilergym.in (resolved by pip)#g" "$REQ/compilergym.lock.txt"

log "peers.lock.txt (the peer benchmark's extra: only what main.lock.txt lacks)"
# Resolved against the main lock (a constraint), then every package that lock already pins is left out.
mapfile -t MAIN_PINNED < <(sed -n 's/^\([A-Za-z0-9_.-]*\)==.*/--no-emit-package\n\1/p' "$REQ/main.lock.txt")
"$UV" pip compile "$REQ/peers.in" -c "$REQ/main.lock.txt" -c "$REQ/torch-cpu.in" --python .venv/bin/python \
    "${COMMON[@]}" "${TORCH_SOURCES[@]}" --no-emit-package torch "${MAIN_PINNED[@]}" -o "$REQ/peers.lock.txt"

log "vllm.lock.txt (the vLLM engine's site folder: only what main.lock.txt lacks or pins otherwise)"
# vLLM's CPU build pins some packages at other versions than the main lock (transformers < 5.20, numpy < 2.4 for
# mistral-common, numba, setuptools): those are released from the constraint and go into the site folder, which the
# engine's process puts first on its path. torch is the main venv's; torchvision / torchaudio / torchcodec (they do
# not load beside torch's CPU build) and triton (xgrammar's GPU kernels) are declared but never emitted.
VLLM_RELEASED="transformers|setuptools|numba|llvmlite|numpy"
sed -n 's/^\([A-Za-z0-9_.-]*==[^ ]*\).*/\1/p' "$REQ/main.lock.txt" | grep -vE "^($VLLM_RELEASED)==" \
    > "$TOOLS/vllm-constraints.txt"
VLLM_SKIPPED=(torch torchvision torchaudio torchcodec triton)
VLLM_ARGS=("$REQ/vllm.in" -c "$TOOLS/vllm-constraints.txt" -c "$REQ/torch-cpu.in" --python .venv/bin/python
           "${COMMON[@]}" "${TORCH_SOURCES[@]}")
"$UV" pip compile "${VLLM_ARGS[@]}" -o "$TOOLS/vllm-all.txt"
# Left out: every package resolved at the version the main lock already holds.
mapfile -t VLLM_SAME < <(sed -n 's/^\([A-Za-z0-9_.-]*==[^ ]*\).*/\1/p' "$REQ/main.lock.txt" | sort \
    | comm -12 - <(sed -n 's/^\([A-Za-z0-9_.-]*==[^ ]*\).*/\1/p' "$TOOLS/vllm-all.txt" | sort) | cut -d= -f1)
"$UV" pip compile "${VLLM_ARGS[@]}" $(printf -- '--no-emit-package %s ' "${VLLM_SKIPPED[@]}" "${VLLM_SAME[@]}") \
    -o "$REQ/vllm.lock.txt"

for f in main torch-cpu no-deps compilergym peers vllm; do
    log "$f.lock.txt: $(grep -c '^[A-Za-z0-9]' "$REQ/$f.lock.txt") packages"
done
