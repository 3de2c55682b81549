#!/usr/bin/env bash
# CompilerGym set-up (called by scripts/setup.sh; may also run alone).
#
# compiler_gym 0.2.5 only runs on Python 3.9/3.10 with old pins, so it gets its own venv,
# .venv-compilergym, driven from the project's Python 3.11 over a pipe (envs/compilergym/client.py).
# CompilerGym downloads an LLVM data pack on first use unless $COMPILER_GYM_SITE_DATA/llvm-v0
# is unpacked: we build a stand-in from Debian's LLVM 14 tools under .venv-compilergym/site-data.
#
# Idempotent: a stamp in .venv-compilergym records what was installed; a second run only checks.
# If no Python 3.10 is found it says how to get one and exits 0 (CompilerGym tests then skip).
#
# Environment overrides: PYTHON310=/path/to/python3.10
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CG_VENV="$ROOT/.venv-compilergym"
CG_STAMP="$CG_VENV/.compilergym-setup.stamp"
# Exactly the lock (every package with its sha256; requirements/compilergym.in says why these pins,
# `make lock` refreshes it). gym 0.21.0 is an sdist: the venv's own setuptools 65 builds it.
CG_LOCK="$ROOT/requirements/compilergym.lock.txt"
# clang-14: compiles user .c/.cpp and csmith output; llvm-14: opt & co; libtinfo5: the service binary links it.
CG_SYSTEM_PACKAGES="clang-14 llvm-14 libtinfo5"
LLVM_BIN=/usr/lib/llvm-14/bin
LLVM_TOOLS="opt llvm-size llvm-as llvm-dis llvm-link lli llc llvm-stress llvm-diff"
log() { echo "[setup:compilergym] $*"; }

is_py310() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' >/dev/null 2>&1; }

PY310=""
candidates=("${PYTHON310:-}" python3.10)
if command -v pyenv >/dev/null 2>&1; then
    for p in "$(pyenv root)"/versions/3.10*/bin/python3.10; do candidates+=("$p"); done
fi
for p in "$HOME"/.pyenv/versions/3.10*/bin/python3.10 /usr/bin/python3.10 /usr/local/bin/python3.10; do
    candidates+=("$p")
done
for c in "${candidates[@]}"; do
    [ -n "$c" ] || continue
    if command -v "$c" >/dev/null 2>&1 && is_py310 "$c"; then
        PY310="$("$c" -c 'import sys; print(sys.executable)')"
        break
    fi
done
if [ -z "$PY310" ]; then
    log "SKIPPED: no Python 3.10 found (CompilerGym 0.2.5 needs 3.9/3.10). To get one:"
    log "    pyenv install 3.10.13    (or apt-get install python3.10 python3.10-venv where available)"
    log "    then re-run scripts/setup.sh (or PYTHON310=/path/to/python3.10 scripts/setup_compilergym.sh)."
    log "Everything else works; the CompilerGym tests skip."
    exit 0
fi

KEY="$({ cat "$CG_LOCK"; echo "$CG_SYSTEM_PACKAGES" "$LLVM_TOOLS"; cat "$0"; echo "$ROOT"; } | sha256sum | cut -c1-16)"
if [ -f "$CG_STAMP" ] && [ "$(cat "$CG_STAMP")" = "$KEY" ] && [ -f "$CG_VENV/site-data/llvm-v0/.unpacked" ]; then
    log "up to date (stamp $KEY)"
    exit 0
fi

# ---- system packages --------------------------------------------------------------------
source "$ROOT/scripts/apt_packages.sh"
# shellcheck disable=SC2086
install_system_packages setup:compilergym $CG_SYSTEM_PACKAGES

# ---- the Python 3.10 venv ---------------------------------------------------------------
if ! { [ -x "$CG_VENV/bin/python" ] && is_py310 "$CG_VENV/bin/python"; }; then
    rm -rf "$CG_VENV"
    log "creating .venv-compilergym with $PY310"
    "$PY310" -m venv "$CG_VENV"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
log "installing requirements/compilergym.lock.txt (--require-hashes)"
"$CG_VENV/bin/python" -m pip install --quiet --progress-bar off --require-hashes -r "$CG_LOCK" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2 || true)
mapfile -t EXTRAS < <("$CG_VENV/bin/python" "$ROOT/scripts/lock_diff.py" --extras "$CG_LOCK")
if [ ${#EXTRAS[@]} -gt 0 ]; then
    log "removing what the lock does not hold: ${EXTRAS[*]}"
    "$CG_VENV/bin/python" -m pip uninstall --quiet --yes "${EXTRAS[@]}"
fi
"$CG_VENV/bin/python" "$ROOT/scripts/lock_diff.py" "$CG_LOCK" >&2 || { log "ERROR: .venv-compilergym differs from the lock (above)"; exit 1; }

# ---- stand-in LLVM data pack ------------------------------------------------------------
SITE="$CG_VENV/site-data/llvm-v0"
mkdir -p "$SITE/bin"
for tool in $LLVM_TOOLS; do
    ln -sfn "$LLVM_BIN/$tool" "$SITE/bin/$tool"
done
# The service's LLVM 10 cannot read clang-14 bitcode without these two flags.
cat > "$SITE/bin/clang" <<EOF
#!/bin/sh
exec $LLVM_BIN/clang "\$@" -Xclang -disable-noundef-analysis -fno-finite-loops
EOF
chmod +x "$SITE/bin/clang"
echo "Stand-in for CompilerGym's llvm-v0 data pack: Debian LLVM 14 tools (Apache-2.0 WITH LLVM-exception)." > "$SITE/LICENSE"
touch "$SITE/.unpacked"

"$CG_VENV/bin/python" -c 'import compiler_gym; print(compiler_gym.__version__)' >/dev/null
echo "$KEY" > "$CG_STAMP"
log "done ($("$CG_VENV/bin/python" -V 2>&1), site data $CG_VENV/site-data)"
