"""A run's report: PNG plots and a short markdown summary, read from its TensorBoard event files.

    python -m async_rl.report RUN_DIR [RUN_DIR ...] [--out DIR]

One run: ``RUN_DIR/report/``. Several runs (e.g. one per clip mode): one line per run on every
plot, written to ``--out`` (default ``./report``). The driver calls ``write_report`` at the end
of every run.
"""
from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from async_rl import checkpoint as ckpt
from async_rl.errors import OneLineArgumentParser

# Figures: (file stem, title, tag patterns). A tag goes to the first figure whose pattern matches
# it; train/* tags no figure names go to "train_diagnostics", so a new loss diagnostic is plotted.
FIGURES = (
    ("return", "Episode return", (r"rollout/episode_return$", r"eval/return$")),
    ("success", "Success rate", (r"rollout/success_rate(_recent)?$", r"eval/success_rate$")),
    ("losses", "Losses", (r"train/.*loss$",)),
    ("clip_ess", "Clipping, importance weights and ESS", (r"train/(clip|ess|ratio|is_|approx_kl|dead_grad)",)),
    ("train_diagnostics", "Other training diagnostics", (r"train/",)),
    ("throughput", "Throughput", (r"rollout/env_steps_per_sec$", r"sync/broadcast_seconds$")),
    ("policy_lag", "Policy lag (versions)", (r"rollout/policy_lag", )),
)
# The summary's final metrics, in this order, where the run has them.
HEADLINE = ("rollout/episode_return", "rollout/success_rate", "rollout/success_rate_recent", "rollout/env_steps_per_sec",
            "rollout/policy_lag", "train/policy_loss", "train/value_loss",
            "train/entropy", "train/clip_frac", "train/ess", "sync/policy_version", "rollout/total_env_steps")
# The table's window: the mean of the last WINDOW logged points of each metric, beside its last value. One
# logging window of the rollout scalars holds a few episodes (LIBERO: 1-2), so its success can read 0 beside a
# recent mean of 0.46. A fixed count of points, not a fraction of the run: the same smoothing in a short run
# and a long one, and in a long run a figure of its end rather than of its middle; the table names the
# window's epochs, so a reader sees how much of the run it covers.
WINDOW = 10
TOTALS = ("sync/policy_version", "rollout/total_env_steps")  # running totals: their last value, never a mean
CONFIG_KEYS = ("env", "env_kwargs", "policy", "clip_mode", "advantage", "num_trainers", "num_rollout_workers",
               "super_batch_size", "max_epochs", "max_minutes", "seed", "sync")


@dataclass
class RunData:
    """What a report needs of one run directory."""

    path: Path
    scalars: dict[str, tuple[list[int], list[float]]]
    wall_seconds: float
    config: dict[str, Any] = field(default_factory=dict)
    checkpoint: Optional[Path] = None
    name: str = ""  # the run's name on plots: its directory's name (with its parent's where two clash)

    @property
    def label(self) -> str:
        mode = self.config.get("clip_mode")
        return f"{self.name or self.path.name} ({mode})" if mode else (self.name or self.path.name)

    def final(self, tag: str) -> Optional[float]:
        values = self.scalars.get(tag, ([], []))[1]
        return values[-1] if values else None

    def windowed(self, tag: str, window: int = WINDOW) -> tuple[float, int, int, int]:
        """``(mean, count, first epoch, last epoch)`` of the last ``window`` values of ``tag`` (a tag the run logged)."""
        steps, values = self.scalars[tag]
        tail = values[-window:]
        return sum(tail) / len(tail), len(tail), steps[-len(tail)], steps[-1]


def load_run(run_dir: str | Path) -> RunData:
    """Every scalar of ``run_dir``'s event files, its wall time, and the newest checkpoint's config."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: PLC0415 (only to report)

    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory (give a run's --log-dir)")
    events = EventAccumulator(str(path), size_guidance={"scalars": 0}).Reload()
    scalars, times = {}, []
    for tag in events.Tags()["scalars"]:
        rows = events.Scalars(tag)
        scalars[tag] = ([r.step for r in rows], [r.value for r in rows])
        times += [rows[0].wall_time, rows[-1].wall_time]
    if not scalars:
        raise FileNotFoundError(f"{path} holds no TensorBoard scalars (is it a run's --log-dir?)")
    latest = ckpt.latest_checkpoint(str(path))
    config = json.loads((latest / ckpt.META).read_text()).get("config", {}) if latest else {}
    return RunData(path, scalars, max(times) - min(times), config, latest)


def figure_tags(tags: Iterable[str]) -> dict[str, list[str]]:
    """Tags of each figure (the first matching figure wins); figures with no tag are left out."""
    out: dict[str, list[str]] = {}
    for tag in sorted(tags):
        for stem, _, patterns in FIGURES:
            if any(re.match(p, tag) for p in patterns):
                out.setdefault(stem, []).append(tag)
                break
    return out


def plot_figures(runs: Sequence[RunData], out: Path) -> list[Path]:
    """One PNG per figure; a subplot per tag, a line per run."""
    import matplotlib  # noqa: PLC0415  (imported here: a run that never reports does not pay for it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (after matplotlib.use)

    out.mkdir(parents=True, exist_ok=True)
    titles = {stem: title for stem, title, _ in FIGURES}
    written = []
    grouped = figure_tags({t for run in runs for t in run.scalars})
    for stem, tags in [(stem, grouped[stem]) for stem, _, _ in FIGURES if stem in grouped]:
        cols = min(3, len(tags))
        rows = math.ceil(len(tags) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
        for ax, tag in zip(axes.flat, tags):
            for run in runs:
                if tag in run.scalars:
                    steps, values = run.scalars[tag]
                    ax.plot(steps, values, marker="." if len(steps) < 30 else None, label=run.label)
            ax.set_title(tag, fontsize=9)
            ax.set_xlabel("epoch", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(tags):]:
            ax.set_visible(False)
        if len(runs) > 1:
            axes.flat[0].legend(fontsize=7)
        fig.suptitle(titles[stem])
        fig.tight_layout()
        path = out / f"{stem}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4g}"


def summary_markdown(runs: Sequence[RunData], plots: Sequence[Path], out: Path) -> str:
    """The markdown summary: per run its config, wall time, epochs, checkpoint; final metrics; plots."""
    lines = ["# Run report", ""]
    for run in runs:
        epochs = max((steps[-1] for steps, _ in run.scalars.values() if steps), default=0)
        lines += [f"## {run.label}", "", f"- run directory: `{run.path}`",
                  f"- wall time (first to last logged metric): {run.wall_seconds:.0f} s, {epochs} epochs",
                  f"- checkpoint: `{run.checkpoint}`" if run.checkpoint else "- checkpoint: none"]
        videos = sorted(run.path.glob("videos/*.mp4"))
        if videos:
            lines.append(f"- episode videos: {len(videos)} under `{run.path / 'videos'}` (newest `{videos[-1].name}`)")
        if run.config:
            lines.append("- config: " + ", ".join(f"`{k}={json.dumps(run.config[k])}`" for k in CONFIG_KEYS if k in run.config))
        else:
            lines.append("- config: no checkpoint in the run directory, so no saved config")
        lines.append("")
    lines += final_metrics(runs)
    lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.relative_to(out)})" for p in plots]
    return "\n".join(lines) + "\n"


def final_metrics(runs: Sequence[RunData]) -> list[str]:
    """Markdown lines of two tables: the headline metrics (the mean of each run's last ``WINDOW`` logged points,
    their epochs, and the last value) and every evaluation the runs logged (its first figure and its last:
    before and after the training between them). With several runs, a column names the run of each row."""
    several = len(runs) > 1

    def row(tag: str, run: RunData, cells: Sequence[str]) -> str:
        return f"| {tag} | " + (f"{run.label} | " if several else "") + " | ".join(cells) + " |"

    def header(columns: Sequence[str], align: str) -> list[str]:
        return ["| metric | " + ("run | " if several else "") + " | ".join(columns) + " |",
                "|---|" + ("---|" if several else "") + align]

    def windowed_cells(run: RunData, tag: str) -> list[str]:
        mean, count, first, last = run.windowed(tag)
        if tag in TOTALS:
            return ["-", "-", f"{_fmt(run.final(tag))} (epoch {last})"]
        points = "1 point" if count == 1 else f"{count} points"
        return [_fmt(mean), f"{first}-{last} ({points})", f"{_fmt(run.final(tag))} (epoch {last})"]

    lines = ["## Final metrics", "",
             f"Each metric's mean over the last {WINDOW} points it logged (fewer where it logged fewer), beside its "
             "last value: one logging window holds few episodes. Running totals: the last value.", ""]
    lines += header([f"mean of the last {WINDOW} points", "their epochs", "last value"], "---:|---|---:|")
    lines += [row(tag, run, windowed_cells(run, tag)) for tag in HEADLINE for run in runs if tag in run.scalars]

    # The env's own figures (eval/success_rate, eval/heldout_reward) before the per-program or per-reward ones.
    evaluated = sorted({t for run in runs for t in run.scalars if t.startswith("eval/") and not t.startswith("eval/media")},
                       key=lambda t: (t.count("/"), t))
    if evaluated:
        def before_after(run: RunData, tag: str) -> list[str]:
            steps, values = run.scalars[tag]
            last = f"{_fmt(values[-1])} (epoch {steps[-1]})"
            if len(values) == 1:
                return ["-", last, "-"]
            return [f"{_fmt(values[0])} (epoch {steps[0]})", last, f"{values[-1] - values[0]:+.4g}"]

        lines += ["", "## Evaluations", "",
                  "Held-out and periodic evaluations: the first figure the run logged and the last, and the change "
                  "between them: with eval_before_training (the default), the first is the initial weights' at "
                  "epoch 0. A dash under first: evaluated once (an env's final evaluation without the one before "
                  "training, or a resumed run's), so the run holds no earlier figure to compare with.", ""]
        lines += header(["first (epoch)", "last (epoch)", "change"], "---:|---:|---:|")
        lines += [row(tag, run, before_after(run, tag)) for tag in evaluated for run in runs if tag in run.scalars]
    return lines


def write_report(run_dirs: Sequence[str | Path], out: Optional[str | Path] = None) -> Path:
    """Plots and ``report.md`` for ``run_dirs`` under ``out`` (default: the run's ``report/``
    for one run, ``./report`` for several); returns the markdown file's path."""
    runs = [load_run(d) for d in run_dirs]
    for run in runs:
        clash = sum(r.path.name == run.path.name for r in runs) > 1
        run.name = f"{run.path.parent.name}/{run.path.name}" if clash else run.path.name
    target = Path(out) if out else (runs[0].path / "report" if len(runs) == 1 else Path("report"))
    plots = plot_figures(runs, target)
    path = target / "report.md"
    path.write_text(summary_markdown(runs, plots, target))
    return path


def report_at_end(log_dir: str, console: Any) -> None:
    """The driver's call at the end of a run: a report that cannot be written is one yellow line, never a failure."""
    try:
        console.print(f"report: {write_report([log_dir])}", markup=False, soft_wrap=True)
    except Exception as exc:  # noqa: BLE001 (a report that cannot be written must not fail the run)
        console.print(f"no report written for {log_dir}: {exc!r}", style="yellow", markup=False, soft_wrap=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = OneLineArgumentParser(prog="python -m async_rl.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run's --log-dir (several: compared on one plot)")
    parser.add_argument("--out", help="output directory (default: RUN_DIR/report for one run, ./report for several)")
    args = parser.parse_args(argv)
    try:
        path = write_report(args.run_dirs, args.out)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {path} ({len(list(path.parent.glob('*.png')))} plots)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
