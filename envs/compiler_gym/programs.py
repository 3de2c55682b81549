"""Which programs a CompilerGym run compiles: csmith seeds, the files of a folder, and their
short names for tables."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from async_rl.errors import ConfigError
from async_rl.validation import checked_folder

PROGRAM_SUFFIXES = (".c", ".cpp", ".cc", ".bc", ".ll")
BUNDLED_PROGRAMS = Path(__file__).resolve().parents[1] / "programs"  # envs/programs: real C programs written here (not csmith)


def csmith_programs(start: int, count: int) -> list[str]:
    return [f"generator://csmith-v0/{s}" for s in range(start, start + count)]


def split_held_out(files: list[str], eval_fraction: float) -> tuple[list[str], list[str]]:
    """(train, held out): the first ``eval_fraction`` of ``files`` (at least one) are held out. A
    single program is both (tuning one program is a use of its own), and that is said."""
    if len(files) == 1:
        print(f"compiler_gym: one program ({files[0]}): it is trained on and evaluated on, "
              "so the evaluation is not held out", file=sys.stderr)
        return files, files
    n_eval = max(1, int(round(len(files) * eval_fraction)))
    return files[n_eval:], files[:n_eval]


def program_uris(folder: str, what: str) -> list[str]:
    """``file://`` URIs of the .c/.cpp/.cc/.bc/.ll files under ``folder`` (sorted); ConfigError
    naming ``what`` (the option that gave it) if it is missing or holds none."""
    root = checked_folder(folder, f"{what} {folder}", "pass a folder of .c/.cpp/.bc/.ll files")
    files = sorted(str(p.resolve()) for p in root.rglob("*") if p.suffix in PROGRAM_SUFFIXES)
    if not files:
        raise ConfigError(f"{what} {folder} holds no .c/.cpp/.bc files (nor .cc/.ll)")
    return [f"file://{f}" for f in files]



def program_name(uri: str) -> str:
    """A short name for tables and TensorBoard tags: ``csmith-v0_1000001``, ``crc32``."""
    if uri.startswith("file://"):
        return Path(uri[len("file://"):]).stem
    return re.sub(r"[^\w.-]+", "_", uri.split("://", 1)[-1]).strip("_")
