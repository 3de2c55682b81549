# Sourced by the set-up scripts: install_system_packages TAG PKG... installs the Debian packages
# that are missing (apt-get, as root or through sudo) and says which were already there.
install_system_packages() {
    local tag="$1"; shift
    local missing=() pkg
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if ((${#missing[@]} == 0)); then
        echo "[$tag] system packages present: $*"
        return 0
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
            echo "[$tag] ERROR: need system packages (${missing[*]}) but not root and no sudo" >&2
            return 1
        fi
    fi
    echo "[$tag] installing system packages: ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
