"""Where a run's CPU time goes: CPU share per actor role and py-spy's hottest functions per role.

    python benchmarks/profile_actors.py [--quick] [--minutes 4] [--window 30] [--out profile.json] [-- launch flags...]

Starts the MetaWorld launch (``configs/metaworld_mt1_ppo.yaml`` plus any launch flags after ``--``)
as a child process, waits until its first training log point, then over ``--window`` seconds
(a) measures the CPU seconds used by every process of the run (the driver, each Ray actor by role,
Ray's own daemons) and (b) samples one process of each role with ``py-spy record`` (``pip install
py-spy``; skipped with a note if absent). Prints the CPU share per role, the machine's other load
in the same window, and per role the functions with the most samples (own time and with callees).
Figures: ``cpu_share_<role>`` (fraction of the run's CPU time in the window), ``cpu_cores_<role>``
(cores used on average) and ``other_processes_cores`` (what the rest of the machine used).
"""
from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common

ROLES = ("RolloutWorkerActor", "InferenceActor", "TrainerActor", "ReplayBufferActor", "StatsActor",
         "EvaluationWorkerActor")


def role_of(proc: Any, driver_pid: int) -> str:
    if proc.pid == driver_pid:
        return "driver"
    try:
        title = " ".join(proc.cmdline())
    except Exception:  # noqa: BLE001 - the process ended
        return "gone"
    for role in ROLES:
        if f"ray::{role}" in title:
            return role
    return "ray_daemons" if "ray" in title else "other_children"


def tree(pid: int) -> list[Any]:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_seconds(procs: list[Any]) -> dict[int, float]:
    out = {}
    for p in procs:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system + t.children_user + t.children_system
        except Exception:  # noqa: BLE001 - the process ended
            pass
    return out


def top_functions(raw: Path, n: int = 8) -> tuple[list[tuple[str, int]], list[tuple[str, int]], int]:
    """From py-spy's collapsed stacks: (own samples per function, inclusive samples, total samples)."""
    own, incl, total = collections.Counter(), collections.Counter(), 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        total += k
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
                  if " (" in f else f for f in stack.split(";")]
        own[frames[-1]] += k
        for f in set(frames):
            incl[f] += k
    return own.most_common(n), incl.most_common(n + 6), total


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, "a 1.75-minute run, 15 s window")
    ap.add_argument("--minutes", type=float, default=None, help="run length, start-up included (default 4; quick 1.75)")
    ap.add_argument("--window", type=float, default=None, help="measured seconds (default 30; quick 15)")
    ap.add_argument("--rate", type=int, default=50, help="py-spy samples per second")
    ap.add_argument("--log-dir", default="runs/profile_actors")
    args, extra = ap.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    minutes = args.minutes or (1.75 if args.quick else 4.0)
    window = args.window or (15.0 if args.quick else 30.0)
    import psutil

    clock = common.Stopwatch()
    info = common.machine()
    shutil.rmtree(args.log_dir, ignore_errors=True)
    cmd = [sys.executable, str(common.ROOT / "launch" / "ds_metaworld_ppo_mlp.py"), "--max-minutes", str(minutes),
           "--log-dir", args.log_dir, "--swanlab-mode", "disabled", "--log-interval-seconds", "5", *extra]
    from async_rl.process_setup import pythonpath_with  # imports torch: only when needed

    env = {**os.environ, "PYTHONPATH": pythonpath_with(common.ROOT)}
    log = open(Path(tempfile.gettempdir()) / "profile_actors_run.log", "w")
    run = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    figures: dict[str, Any] = {}
    pyspy = shutil.which("py-spy") or (str(Path(sys.executable).parent / "py-spy")
                                       if (Path(sys.executable).parent / "py-spy").exists() else None)
    try:
        deadline = time.monotonic() + 60 * minutes + 60
        while not (Path(args.log_dir).exists() and common.scalars(args.log_dir, "rollout/total_env_steps")):
            if run.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the run ended or stalled before its first log point (see {log.name})")
            time.sleep(2)
        procs = tree(run.pid)
        roles = {p.pid: role_of(p, run.pid) for p in procs}
        samples: dict[str, tuple[subprocess.Popen, Path]] = {}
        if pyspy:
            for role in ROLES[:3]:
                pid = next((p for p, r in roles.items() if r == role), None)
                if pid is not None:
                    out = Path(tempfile.gettempdir()) / f"pyspy_{role}.txt"
                    samples[role] = (subprocess.Popen(
                        [pyspy, "record", "--pid", str(pid), "--duration", str(int(window)), "--rate", str(args.rate),
                         "--format", "raw", "--output", str(out), "--nonblocking"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out)
        machine_before = psutil.cpu_times()
        before = cpu_seconds(procs)
        t0 = time.monotonic()
        time.sleep(window)
        elapsed = time.monotonic() - t0
        after = cpu_seconds(procs)
        machine_after = psutil.cpu_times()
        for proc, _ in samples.values():
            proc.wait(timeout=60)
    finally:
        if sys.exc_info()[0] is not None and run.poll() is None:  # failed early: end the run, do not wait it out
            run.terminate()
        run.wait(timeout=60 * minutes + 180)
        log.close()
    used: dict[str, float] = collections.defaultdict(float)
    for pid, seconds in after.items():
        used[roles.get(pid, "other_children")] += seconds - before.get(pid, seconds)
    busy = sum(getattr(machine_after, f) - getattr(machine_before, f) for f in ("user", "system", "nice"))
    run_total = sum(used.values())
    rows = sorted(({"role": r, "cpu_seconds": s, "cores": s / elapsed, "share_of_run": s / run_total}
                   for r, s in used.items() if s > 0), key=lambda r: -r["cpu_seconds"])
    common.print_table(rows, title=f"CPU of the run over {elapsed:.0f} s (run exit code {run.returncode})")
    for r in rows:
        figures[f"cpu_share_{r['role']}"] = round(r["share_of_run"], 4)
        figures[f"cpu_cores_{r['role']}"] = round(r["cores"], 3)
    figures["run_cores"] = round(run_total / elapsed, 3)
    figures["other_processes_cores"] = round(max(busy - run_total, 0.0) / elapsed, 3)
    figures["window_seconds"] = round(elapsed, 1)
    print(f"\nthe run used {run_total / elapsed:.2f} cores; everything else on the machine "
          f"{figures['other_processes_cores']:.2f} cores (of {os.cpu_count()})")
    for role, (_, out) in samples.items():
        if not out.exists():
            print(f"\n{role}: py-spy wrote nothing")
            continue
        own, incl, total = top_functions(out)
        print(f"\n{role}: {total} samples; most own time:")
        for name, k in own:
            print(f"  {100 * k / total:5.1f}%  {name}")
        print("  with callees:")
        for name, k in incl:
            print(f"  {100 * k / total:5.1f}%  {name}")
        for i, (name, k) in enumerate(own[:3]):
            figures[f"{role}_top{i + 1}_own"] = f"{name} {100 * k / total:.1f}%"
    if not pyspy:
        print("py-spy not found: pip install py-spy for the per-function part")
    figures.update({**info, "minutes": minutes, "quick": args.quick, "bench_seconds": clock()})

    def plot(path: Path) -> None:
        plt = common.pyplot()
        fig, ax = plt.subplots(figsize=(8, 4.5))
        labels = [r["role"] for r in rows] + ["other processes\n(not this run)"]
        ax.barh(labels, [r["cores"] for r in rows] + [figures["other_processes_cores"]],
                color=[*["C0"] * len(rows), "C7"])
        ax.invert_yaxis()
        ax.set_xlabel(f"cores used on average over {elapsed:.0f} s")
        ax.grid(axis="x", alpha=0.3)
        common.save(fig, path, f"MetaWorld MT1 launch, CPU per actor role, {os.cpu_count()} cores")

    common.report(figures, args, plot, headline=[k for k in figures if k.startswith(("cpu_cores_", "other", "run_"))])
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
