"""Which programs a CompilerGym run compiles: csmith seeds, the files of a folder, and their
short names for tables."""
from __future__ import annotations

import re
import sys
from pathlib import Path

PROGRAM_SUFFIXES = (".c", ".cpp", ".cc", ".bc", ".ll")
BUNDLED_PROGRAMS = Path(__file__).resolve().parents[1] / "programs"  # envs/programs: real C programs written here (not csmith)


def csmith_programs(start: int, count: int) -> list[str]:
    return [f"generator://csmith-v0/{s}" for s in range(start, start + count)]


def split_held_out(files: list[str], eval_fraction: float) -> tuple[list[str], list[str]]:
    """(train, held out): the first ``eval_fraction`` of ``files`` (at least one) are held out. A
    single program is both (tuning one program is a use of its own), and that is said."""
    if len(files) == 1:
        print(f"compilergym: one program ({files[0]}): it is trained on and evaluated on, "
              "so the evaluation is not held out", file=sys.stderr)
        return files, files
    n_eval = max(1, int(round(len(files) * eval_fraction)))
    return files[n_eval:], files[:n_eval]


def _program_files(folder: str) -> list[str]:
    return sorted(str(p.resolve()) for p in Path(folder).expanduser().rglob("*") if p.suffix in PROGRAM_SUFFIXES)


def program_folder(folder: str) -> str:
    """A folder of programs as a schema checks it: a directory holding a .c/.cpp/.cc/.bc/.ll file; the
    ValueError's text names the fix. The validator of the options' ``ProgramFolder`` and of the commands'
    --benchmark-dir, which print it as one line (exit 2)."""
    p = Path(folder).expanduser()
    if not p.is_dir():
        raise ValueError(f"{'not a directory' if p.exists() else 'no such directory'}; "
                         "pass a folder of .c/.cpp/.bc/.ll files")
    if not _program_files(folder):
        raise ValueError("holds no .c/.cpp/.bc files (nor .cc/.ll); pass a folder of them")
    return folder


def program_uris(folder: str) -> list[str]:
    """``file://`` URIs of the .c/.cpp/.cc/.bc/.ll files under ``folder`` (sorted). ``folder`` is a
    ``program_folder`` (the options and commands validated it): a bad one is a caller's bug (its ValueError)."""
    files = _program_files(folder)
    if not files:
        program_folder(folder)  # raises, saying why: no such folder, or no program in it
    return [f"file://{f}" for f in files]


def program_name(uri: str) -> str:
    """A short name for tables and TensorBoard tags: ``csmith-v0_1000001``, ``crc32``."""
    if uri.startswith("file://"):
        return Path(uri[len("file://"):]).stem
    return re.sub(r"[^\w.-]+", "_", uri.split("://", 1)[-1]).strip("_")
