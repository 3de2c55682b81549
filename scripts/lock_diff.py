"""The packages installed in the running interpreter against lock files (requirements/*.lock.txt).

    python scripts/lock_diff.py LOCK [LOCK ...]            differences, one a line; exit 1 if any
    python scripts/lock_diff.py --extras LOCK [LOCK ...]   names installed but not locked, one a line

Used by scripts/setup.sh (to remove what the lock does not hold) and tests/tools/test_lock.py. Runs on
Python 3.10 too (CompilerGym's venv) and imports nothing outside the standard library.
"""
from __future__ import annotations

import importlib.metadata
import re
import sys
import sysconfig
from pathlib import Path

# The checkout itself, installed editable by the set-up: not a registry package, so not in a lock.
PROJECT = "async-rl"
# A GPU machine installs torch's CUDA build from the registry outside the lock (its files differ from
# the CPU build the lock pins); these are torch and what that build brings.
CUDA_TORCH = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def normalise(name: str) -> str:
    """PEP 503: case and runs of -_. do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(paths: list[Path]) -> dict[str, str]:
    """{name: version} of every ``name==version`` line of the lock files."""
    pins: dict[str, str] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            m = PIN.match(line)
            if m:
                pins[normalise(m.group(1))] = m.group(2)
    return pins


def installed() -> dict[str, str]:
    """{name: version} of what pip installed: the environment's site-packages only (a package's own
    vendored copies, e.g. ray/thirdparty_files put on sys.path by `import ray`, are not installs)."""
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    return {normalise(d.metadata["Name"]): d.version for d in importlib.metadata.distributions(path=site)
            if d.metadata["Name"]}


def comparable(pins: dict[str, str], have: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The two sets as the lock speaks for them: without the checkout, and without torch's CUDA build
    and what it brings where that is what is installed (a GPU machine)."""
    have = {k: v for k, v in have.items() if k != PROJECT}
    if "torch" in pins and have.get("torch", pins["torch"]) != pins["torch"]:
        have = {k: v for k, v in have.items() if not CUDA_TORCH.match(k)}
        pins = {k: v for k, v in pins.items() if k != "torch"}
    return pins, have


def differences(pins: dict[str, str], have: dict[str, str]) -> list[str]:
    """What differs, as sentences; empty when the installed set equals the lock."""
    pins, have = comparable(pins, have)
    out = [f"{n}: locked {pins[n]}, installed {have[n]}" for n in sorted(pins.keys() & have.keys()) if pins[n] != have[n]]
    out += [f"{n}=={pins[n]}: locked, not installed" for n in sorted(pins.keys() - have.keys())]
    out += [f"{n}=={have[n]}: installed, not in the lock" for n in sorted(have.keys() - pins.keys())]
    return out


def main(argv: list[str]) -> int:
    extras_only = "--extras" in argv
    paths = [Path(a) for a in argv if a != "--extras"]
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"lock_diff: no such lock file: {', '.join(missing)}", file=sys.stderr)
        return 2
    pins, have = locked(paths), installed()
    if extras_only:
        pins, have = comparable(pins, have)
        for name in sorted(have.keys() - pins.keys()):
            print(name)
        return 0
    found = differences(pins, have)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
