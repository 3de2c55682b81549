"""Side-by-side figures (critic-free group estimators against PPO with GAE), as a markdown
table of means over seeds and one PNG, from the JSON files the benchmarks wrote.

    python benchmarks/plot_group_estimators.py --metaworld group_estimators_reach_idle.json \
        --compilergym 'group_estimators_compilergym_*_seed*.json' [--results benchmarks/results] [--out group_estimators.png]

MetaWorld (``bench_learning.py --seeds ...``): per method, final success (trailing mean of the last 3 log
points), best success, seconds to 0.9, env steps and the groups that reached the trainers.
CompilerGym (``bench_compilergym.py --sets csmith --searches greedy,best-of-16``, one file per method and
seed, named ``group_estimators_compilergym_<method>_seed<seed>.json``): geomean -Oz count / count on the held-out csmith programs,
greedy and best-of-16, next to random search with the same compilations. Measures nothing.
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.errors import OneLineArgumentParser
from benchmarks import common

MW_COLUMNS = ("final_success", "best_success", "seconds_to_0.9", "env_steps", "groups_completed", "groups_dropped")
CG_COLUMNS = ("csmith_greedy_vs_oz", "csmith_best_of_16_vs_oz", "csmith_best_of_16_random_vs_oz",
              "final_sampled_geomean_reduction_vs_oz", "env_steps", "epochs")


def mean_sd(values: list[Optional[float]]) -> str:
    """``mean ± sd (n)`` of the values that exist; ``never (n)`` when none does (e.g. never reached 0.9)."""
    found = [float(v) for v in values if v is not None]
    if not found:
        return f"— ({len(values)})" if values else ""
    mean, form = statistics.mean(found), (lambda x: f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}")
    text = form(mean)
    if len(found) > 1:
        text += f" ± {form(statistics.stdev(found))}"
    return text + (f" ({len(found)} of {len(values)})" if len(found) < len(values) else "")


def metaworld_rows(files: list[Path]) -> dict[str, dict[str, list[Any]]]:
    """{method: {column: [value per seed]}} from bench_learning JSON files."""
    rows: dict[str, dict[str, list[Any]]] = {}
    for path in files:
        figures = json.loads(path.read_text())
        for task in figures.get("tasks", "").split(","):
            for key in figures:
                m = re.fullmatch(rf"{re.escape(task)}_(\w+?)(?:_s\d+)?_final_success", key)
                if not m:
                    continue
                prefix = key[: -len("_final_success")]
                row = rows.setdefault(f"{task} {m.group(1)}", {c: [] for c in MW_COLUMNS})
                for column in MW_COLUMNS:
                    row[column].append(figures.get(f"{prefix}_{column}"))
    return rows


def compilergym_rows(files: list[Path]) -> dict[str, dict[str, list[Any]]]:
    """{method: {column: [value per seed]}} from ``group_estimators_compilergym_<method>_seed<seed>.json`` files."""
    rows: dict[str, dict[str, list[Any]]] = {}
    for path in files:
        m = re.fullmatch(r"group_estimators_compilergym_(\w+?)_seed(\d+)", path.stem)
        if not m:
            continue
        figures = json.loads(path.read_text())
        row = rows.setdefault(m.group(1), {c: [] for c in CG_COLUMNS})
        for column in CG_COLUMNS:
            row[column].append(figures.get(f"mlp_{column}"))
    return rows


def table(rows: dict[str, dict[str, list[Any]]], columns: tuple[str, ...]) -> str:
    lines = ["| method | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    lines += [f"| {name} | " + " | ".join(mean_sd(row[c]) for c in columns) + " |" for name, row in rows.items()]
    return "\n".join(lines)


def plot(mw: dict[str, dict[str, list[Any]]], cg: dict[str, dict[str, list[Any]]], path: Path) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, rows, column, label in ((axes[0], mw, "final_success", "MetaWorld final success"),
                                    (axes[1], cg, "csmith_best_of_16_vs_oz", "CompilerGym best-of-16 / -Oz")):
        names = list(rows)
        for i, name in enumerate(names):
            values = [v for v in rows[name][column] if v is not None]
            ax.bar(i, statistics.mean(values) if values else 0.0, 0.6, alpha=0.6)
            ax.scatter([i] * len(values), values, color="black", s=12, zorder=3)
        ax.set_xticks(range(len(names)), names, fontsize=8, rotation=20)
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
    if cg:
        axes[1].axhline(1.0, color="gray", ls=":", label="-Oz")
        axes[1].legend(fontsize=8)
    common.save(fig, path, "Critic-free group estimators against PPO (GAE): bars = mean, dots = seeds")


def main(argv: Optional[list[str]] = None) -> int:
    ap = OneLineArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(common.ROOT / "benchmarks" / "results"))
    ap.add_argument("--metaworld", nargs="*", default=[], help="bench_learning JSON files (under --results)")
    ap.add_argument("--compilergym", default="group_estimators_compilergym_*_seed*.json", help="glob of bench_compilergym JSON files")
    ap.add_argument("--out", default=None, help="PNG (default: no plot)")
    args = ap.parse_args(argv)
    results = Path(args.results)
    mw = metaworld_rows([results / f for f in args.metaworld if (results / f).is_file()])
    cg = compilergym_rows(sorted(results.glob(args.compilergym)))
    if mw:
        print("MetaWorld (mean ± sd over seeds)\n" + table(mw, MW_COLUMNS) + "\n")
    if cg:
        print("CompilerGym, held-out csmith (mean ± sd over seeds)\n" + table(cg, CG_COLUMNS))
    if args.out and (mw or cg):
        plot(mw, cg, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
