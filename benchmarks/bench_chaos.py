"""Chaos run: the MetaWorld launch while a seeded schedule SIGKILLs its actors; what survives, what is lost.

    python benchmarks/bench_chaos.py [--quick] [--minutes 8] [--kills 8] [--seed 0] [--group-size G]
        [--out chaos.json] [-- launch flags...]

Runs ``launch/ds_metaworld_ppo_mlp.py`` (``configs/metaworld_mt1_ppo.yaml``) as a subprocess, as an
operator would, for ``--minutes`` (``--group-size G``: with ``--advantage grpo --group-size G``, group
rollouts, whose episodes wait in the replay buffer's group assembler). Once the run has trained and written its first checkpoint, a
schedule drawn from ``--seed`` kills, by pid with SIGKILL, one process at a time of the roles
RolloutWorkerActor, InferenceActor, EvaluationWorkerActor and ReplayBufferActor (found with psutil
by the process title Ray gives an actor, ``ray::<Class>``, among the launch process's descendants
only, so no other Ray cluster on the machine is touched), at random times at least ``--min-gap``
seconds apart. Roles are used in turn (shuffled), so every role is killed before any twice.

Figures (TensorBoard scalars of the run's log dir, read back after it ends; the run logs every
``LOG_INTERVAL_S`` seconds):

* ``kills``: SIGKILLs sent. ``recoveries``: kills after which the role's health counter
  (``health/worker_restarts``, ``inference_restarts``, ``evaluator_restarts``, ``replay_restarts``)
  reached the number of that role's kills so far AND the run logged a later training epoch.
* ``recover_seconds_median`` / ``_max``: kill -> first log point at which both hold (resolution:
  the log interval). ``respawn_seconds_*``: kill -> a new process with that title exists.
* ``produced_transitions``: ``rollout/total_env_steps`` at the end (GAE: one replay item per env
  step; a worker counts a batch when it hands it to the buffer, and re-pushes a batch whose push
  failed because the buffer died).
* ``acknowledged_transitions``: items the buffer accepted over all its lives = final
  ``replay/added`` (which, after a restart, starts from the restored checkpoint's count) +
  ``health/replay_items_lost`` (what each restart rolled back).
* ``lost_transitions`` = ``health/replay_items_lost``: items the buffer had acknowledged and its
  restart did not bring back (the supervisor's count: last ``added`` it read minus the ``added`` the
  restarted buffer restored). ``lost_transitions_bound`` = produced - final ``replay/added`` (with
  groups also minus ``group_steps_discarded``, the steps of dropped groups, and
  ``group_steps_held``, those still waiting for their group at the end): the same loss seen from the
  workers' side, including items acknowledged after the supervisor's last read (which its count
  misses) and at most one push in flight per worker.
* ``trained_transitions``: epochs x num_trainers x super_batch_size (every rank consumes one
  super-batch of distinct items per epoch; ``replay_sampling: consume``).
* ``duplicated_transitions`` (``consume`` only; None otherwise): trained - (``added`` - items that
  left the buffer otherwise: ``evicted`` and ``dropped_stale``, summed over the buffer's lives -
  final ``size``), at least 0. Every item leaves the buffer once, so a trained count above what could
  be drawn means items came back after being drawn (a restart restoring consumed items) and were
  trained, evicted or held again. Draws still prefetched at the end make it an under-estimate by at
  most ``prefetch_batches`` super-batches per rank.
* ``drawn_untrained_transitions`` (``consume`` only; None otherwise): final ``replay/sampled`` (items
  drawn over all the buffer's lives: a restart restores the count it died with, and an ask answered
  again after its reply was lost is no new draw) - trained - what the prefetch may still hold at the
  end (``prefetch_batches`` super-batches per rank), at least 0: items consumed but never trained, as
  when a draw was logged and its reply died with the buffer. Rows a trainer drops as too old
  (``max_policy_lag``, not set by the launch's config) count here too.
* ``replay_counter_rollbacks``: over the buffer's kills, how many of its counters ``added``,
  ``sampled``, ``evicted`` fell after the kill below the last value logged before it (a restart must
  come back with the counters it died with).
* ``peak_rss_mib``: the largest sum of RSS over the launch process and all its descendants
  (sampled every second; shared pages counted once per process). ``rss_growth_mib``: mean sum in
  the last 15 s of training minus the mean in the 15 s before the first kill.
* ``kept_improving``: mean ``rollout/episode_return`` over the last third of the training phase
  above the first third's; ``epochs_after_last_kill``: epochs trained after the last kill.
* ``exit_code``, ``traceback``: how the launch ended; the log is ``<log dir>/launch.log``. The
  benchmark exits 1 (after writing its figures) when the launch did not end cleanly.
"""
from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from benchmarks import common

LAUNCH = common.ROOT / "launch" / "ds_metaworld_ppo_mlp.py"
LOG_INTERVAL_S = 1.0  # fine log points: recovery times are measured between them
# Actor class -> the health counter its recovery increments.
ROLES = {"RolloutWorkerActor": "health/worker_restarts", "InferenceActor": "health/inference_restarts",
         "EvaluationWorkerActor": "health/evaluator_restarts", "ReplayBufferActor": "health/replay_restarts"}
SAMPLE_S = 1.0


@dataclass
class Kill:
    role: str
    pid: int
    at: float  # time.time()
    respawn_at: Optional[float] = None
    recovered_at: Optional[float] = None
    epochs_after: int = 0


@dataclass
class Watch:
    """What the monitor thread samples: (time, summed RSS MiB, process count) of the run's tree."""

    root: int
    samples: list[tuple[float, float, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def tree(self) -> list[psutil.Process]:
        try:
            parent = psutil.Process(self.root)
            return [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def loop(self) -> None:
        while not self.stop.is_set():
            total, count = 0, 0
            for proc in self.tree():
                try:
                    if proc.status() != psutil.STATUS_ZOMBIE:
                        total += proc.memory_info().rss
                        count += 1
                except psutil.Error:
                    pass
            if count:
                self.samples.append((time.time(), total / 2**20, count))
            self.stop.wait(SAMPLE_S)


def actor_pids(watch: Watch, role: str) -> list[int]:
    """Live processes of the run whose title is Ray's ``ray::<role>`` (idle or running a method)."""
    found = []
    for proc in watch.tree():
        try:
            cmd = proc.cmdline()
            if cmd and cmd[0].split(".")[0].split(" ")[0] == f"ray::{role}" and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            pass
    return found


def first_checkpoint(log_dir: Path) -> bool:
    root = log_dir / "checkpoints"
    return root.is_dir() and any((p / "meta.json").is_file() for p in root.glob("epoch-*"))


def schedule(rng: random.Random, kills: int, start: float, end: float, min_gap: float) -> list[tuple[float, str]]:
    """``kills`` (time, role) pairs in [start, end], >= min_gap apart, roles in shuffled turns."""
    span = max(end - start - min_gap * (kills - 1), 0.0)
    offsets = sorted(rng.uniform(0, span) for _ in range(kills))
    roles: list[str] = []
    while len(roles) < kills:
        turn = list(ROLES)
        rng.shuffle(turn)
        roles += turn
    return [(start + off + i * min_gap, roles[i]) for i, off in enumerate(offsets)]


def run_chaos(minutes: float, kills: int, seed: int, min_gap: float, log_dir: Path, extra: list[str]) -> dict[str, Any]:
    """Launch, kill on schedule, wait for the end; returns kills, samples and the launch's exit."""
    import shutil

    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    rng = random.Random(seed)
    cmd = [sys.executable, str(LAUNCH), "--max-minutes", str(minutes), "--log-dir", str(log_dir),
           "--swanlab-mode", "disabled", "--log-interval-seconds", str(LOG_INTERVAL_S), "--seed", str(seed), *extra]
    log = open(log_dir / "launch.log", "w")  # closed below
    started = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=common.ROOT, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(common.ROOT), "COLUMNS": "200"})
    watch = Watch(proc.pid)
    sampler = threading.Thread(target=watch.loop, daemon=True)
    sampler.start()
    deadline = started + 60 * minutes
    done: list[Kill] = []
    try:
        while proc.poll() is None and not first_checkpoint(log_dir) and time.time() < deadline:
            time.sleep(1.0)
        trained_at = time.time()
        # the last kill leaves time to recover and to see training continue before the run winds down
        plan = schedule(rng, kills, trained_at + 3.0, deadline - 35.0, min_gap) if trained_at < deadline - 40 else []
        print(f"training from {trained_at - started:.0f} s; kill plan (s): "
              + ", ".join(f"{t - started:.0f} {r}" for t, r in plan), flush=True)
        for at, role in plan:
            while proc.poll() is None and time.time() < at:
                time.sleep(0.2)
            if proc.poll() is not None:
                break
            pids = actor_pids(watch, role)
            if not pids:
                print(f"{time.time() - started:.0f} s: no live {role} to kill", flush=True)
                continue
            pid = rng.choice(sorted(pids))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            kill = Kill(role, pid, time.time())
            done.append(kill)
            print(f"{kill.at - started:.0f} s: SIGKILL {role} pid {pid}", flush=True)
            _watch_respawn(watch, kill, proc, min_gap)
        proc.wait(timeout=max(deadline - time.time(), 0) + 240)
    except subprocess.TimeoutExpired:
        print("the launch did not end 4 minutes past --max-minutes: killing it (a hang)", flush=True)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        watch.stop.set()
        sampler.join()
        log.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return {"kills": done, "samples": watch.samples, "exit_code": proc.returncode, "started": started,
            "ended": time.time()}


def _watch_respawn(watch: Watch, kill: Kill, proc: subprocess.Popen, wait_s: float) -> None:
    """Note when a new process of the killed role appears (at most ``wait_s``)."""
    before = set(actor_pids(watch, kill.role)) | {kill.pid}
    until = kill.at + wait_s
    while time.time() < until and proc.poll() is None:
        if set(actor_pids(watch, kill.role)) - before:
            kill.respawn_at = time.time()
            return
        time.sleep(0.2)


def total_over_lives(points: list[tuple[float, float]]) -> float:
    """A counter's total over the buffer's lives: the sum of its increases (a restart that rolls it
    back to a checkpoint's value does not undo what the dead buffer counted)."""
    values = [v for _, v in points]
    return sum(max(b - a, 0.0) for a, b in zip([0.0, *values], values))


def duplicated_transitions(trained: int, added: int, left_otherwise: int, size_end: int) -> int:
    """Items trained beyond what the buffer could hand out once each (``consume``; see the docstring)."""
    return max(trained - (added - left_otherwise - size_end), 0)


def drawn_untrained_transitions(sampled: int, trained: int, prefetched_at_most: int) -> int:
    """Items drawn (consumed) beyond those trained and those the prefetch may hold (see the docstring)."""
    return max(sampled - trained - prefetched_at_most, 0)


def counter_rollbacks(kill_times: list[float], series: dict[str, list[tuple[float, float]]]) -> int:
    """Counters that fell after a kill below their last value logged before it (one per counter and kill)."""
    falls = 0
    for at in kill_times:
        for points in series.values():
            before = [v for t, v in points if t <= at]
            if before and any(v < before[-1] for t, v in points if t > at):
                falls += 1
    return falls


def analyse(result: dict[str, Any], log_dir: Path, launch_args: Optional[list[str]] = None) -> dict[str, Any]:
    """The figures of the docstring from the kills, the RSS samples and the TensorBoard scalars."""
    from async_rl.config import load_config

    cfg = load_config(list(launch_args or []), str(common.ROOT / "configs" / "metaworld_mt1_ppo.yaml"))

    def last(tag: str) -> float:  # the scalar's last value in the run's log (0.0: never logged)
        return (common.scalars(log_dir, tag) or [(0.0, 0.0)])[-1][1]

    versions = common.scalars(log_dir, "sync/policy_version")
    kills: list[Kill] = result["kills"]
    per_role: dict[str, int] = {}
    for kill in kills:
        per_role[kill.role] = per_role.get(kill.role, 0) + 1
        counter = common.scalars(log_dir, ROLES[kill.role])
        reached = next((t for t, v in counter if t >= kill.at and v >= per_role[kill.role]), None)
        if reached is not None and any(t > reached for t, _ in versions):
            kill.recovered_at = reached
        kill.epochs_after = sum(1 for t, _ in versions if t > kill.at)
    recover = [k.recovered_at - k.at for k in kills if k.recovered_at is not None]
    respawn = [k.respawn_at - k.at for k in kills if k.respawn_at is not None]
    epochs = int(versions[-1][1]) if versions else 0
    lost = int(last("health/replay_items_lost"))
    added, produced = int(last("replay/added")), int(last("rollout/total_env_steps"))
    trained = epochs * cfg.num_trainers * cfg.super_batch_size
    prefetched = cfg.num_trainers * (0 if cfg.sync else cfg.prefetch_batches) * cfg.super_batch_size
    left_otherwise = sum(total_over_lives(common.scalars(log_dir, f"replay/{k}")) for k in ("evicted", "dropped_stale"))
    not_in_pool = int(last("replay/group_steps_discarded")) + int(last("replay/group_steps_held"))
    replay_kills = [k.at for k in kills if k.role == "ReplayBufferActor"]
    rollbacks = counter_rollbacks(replay_kills, {k: common.scalars(log_dir, f"replay/{k}")
                                                 for k in ("added", "sampled", "evicted")})
    samples = result["samples"]
    train_end = versions[-1][0] if versions else result["ended"]
    first_kill = kills[0].at if kills else train_end
    before = [m for t, m, _ in samples if first_kill - 15 <= t < first_kill]
    after = [m for t, m, _ in samples if train_end - 15 <= t <= train_end]
    returns = [(t, v) for t, v in common.scalars(log_dir, "rollout/episode_return") if t <= train_end]
    success = [(t, v) for t, v in common.scalars(log_dir, "rollout/success_rate") if t <= train_end]
    text = (log_dir / "launch.log").read_text(errors="replace")
    figures: dict[str, Any] = {
        "kills": len(kills),
        "recoveries": len(recover),
        **{f"kills_{role}": n for role, n in per_role.items()},
        "recover_seconds_median": statistics.median(recover) if recover else float("nan"),
        "recover_seconds_max": max(recover) if recover else float("nan"),
        "respawn_seconds_median": statistics.median(respawn) if respawn else float("nan"),
        "respawn_seconds_max": max(respawn) if respawn else float("nan"),
        "produced_transitions": produced,
        "acknowledged_transitions": added + lost,
        "trained_transitions": trained,
        "lost_transitions": lost,
        "lost_transitions_bound": max(produced - added - not_in_pool, 0),
        "duplicated_transitions": duplicated_transitions(trained, added, int(left_otherwise), int(last("replay/size")))
        if cfg.replay_sampling == "consume" else None,
        "drawn_untrained_transitions": drawn_untrained_transitions(int(last("replay/sampled")), trained, prefetched)
        if cfg.replay_sampling == "consume" else None,
        "redelivered_draws": int(last("replay/redelivered_draws")),
        "replay_counter_rollbacks": rollbacks,
        "group_size": cfg.group_size,
        "replay_restarts": int(last("health/replay_restarts")),
        "worker_restarts": int(last("health/worker_restarts")),
        "inference_restarts": int(last("health/inference_restarts")),
        "evaluator_restarts": int(last("health/evaluator_restarts")),
        "epochs": epochs,
        "epochs_after_last_kill": kills[-1].epochs_after if kills else epochs,
        "peak_rss_mib": max((m for _, m, _ in samples), default=float("nan")),
        "rss_before_kills_mib": statistics.mean(before) if before else float("nan"),
        "rss_end_mib": statistics.mean(after) if after else float("nan"),
        "processes_before_kills": max((n for t, _, n in samples if t < first_kill), default=0),
        "processes_end": max((n for t, _, n in samples if train_end - 15 <= t <= train_end), default=0),
        "return_first_third": _third(returns, 0), "return_last_third": _third(returns, 2),
        "success_first_third": _third(success, 0), "success_last_third": _third(success, 2),
        "eval_success_last": last("eval/success_rate") if common.scalars(log_dir, "eval/success_rate") else None,
        "exit_code": result["exit_code"],
        "traceback": "Traceback" in text,
        "wall_seconds": round(result["ended"] - result["started"], 1),
        "machine_load_avg_1min": common.machine()["load_avg_1min"],
    }
    figures["rss_growth_mib"] = figures["rss_end_mib"] - figures["rss_before_kills_mib"]
    figures["kept_improving"] = bool(figures["return_last_third"] > figures["return_first_third"])
    return figures


def _third(points: list[tuple[float, float]], which: int) -> float:
    """Mean value over the first (0) or last (2) third of the points (nan if fewer than 3)."""
    if len(points) < 3:
        return float("nan")
    n = len(points) // 3
    part = points[:n] if which == 0 else points[-n:]
    return statistics.mean(v for _, v in part)


def plot_fn(result: dict[str, Any], log_dir: Path):
    def plot(path: Path) -> None:
        plt = common.pyplot()
        t0 = result["started"]
        fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
        colours = dict(zip(ROLES, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
        series = [("sync/policy_version", "epochs (policy version)"), ("rollout/episode_return", "rollout return")]
        for ax, (tag, label) in zip(axes[:2], series):
            pts = common.scalars(log_dir, tag)
            ax.plot([t - t0 for t, _ in pts], [v for _, v in pts], lw=1)
            ax.set_ylabel(label)
        samples = result["samples"]
        axes[2].plot([t - t0 for t, _, _ in samples], [m for _, m, _ in samples], lw=1)
        axes[2].set_ylabel("RSS sum (MiB)")
        axes[2].set_xlabel("seconds since launch")
        for kill in result["kills"]:
            for ax in axes:
                ax.axvline(kill.at - t0, color=colours[kill.role], ls="--", lw=0.8)
        handles = [plt.Line2D([], [], color=c, ls="--", label=r) for r, c in colours.items()]
        axes[0].legend(handles=handles, fontsize=7, loc="upper left")
        common.save(fig, path, "MetaWorld MT1 PPO under SIGKILLs (dashed: kills by role)")
    return plot


def main() -> None:
    ap = common.parser(__doc__, "a 3.25-minute run with one kill of each role (under 5 minutes in all)")
    ap.add_argument("--minutes", type=float, default=8.0, help="--max-minutes of the launch")
    ap.add_argument("--kills", type=int, default=8, help="SIGKILLs in the run (roles in shuffled turns)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the schedule and of the run")
    ap.add_argument("--min-gap", type=float, default=15.0, help="seconds between two kills")
    ap.add_argument("--group-size", type=int, default=1,
                    help="group rollouts: the launch runs with --advantage grpo --group-size G (1: GAE, no groups)")
    ap.add_argument("--log-dir", default=None, help="default runs/bench/chaos (chaos_g<G> with --group-size)")
    ap.add_argument("launch_args", nargs="*", help="extra launch flags (after --)")
    args = ap.parse_args()
    if args.quick:
        args.minutes, args.kills, args.min_gap = 3.25, 4, 12.0
    if args.group_size > 1:
        args.launch_args = ["--advantage", "grpo", "--group-size", str(args.group_size), *args.launch_args]
    clock = common.Stopwatch()
    log_dir = Path(args.log_dir or common.ROOT / "runs" / "bench" / ("chaos" if args.group_size == 1
                                                                      else f"chaos_g{args.group_size}"))
    result = run_chaos(args.minutes, args.kills, args.seed, args.min_gap, log_dir, args.launch_args)
    figures = analyse(result, log_dir, args.launch_args)
    figures["benchmark_seconds"] = clock()
    t0 = result["started"]
    common.print_table([{"t_kill_s": round(k.at - t0, 1), "role": k.role, "pid": k.pid,
                         "respawn_s": None if k.respawn_at is None else round(k.respawn_at - k.at, 1),
                         "recover_s": None if k.recovered_at is None else round(k.recovered_at - k.at, 1),
                         "epochs_after": k.epochs_after} for k in result["kills"]], title="kills")
    if figures["traceback"] or figures["exit_code"] != 0:
        print(f"the launch ended with exit code {figures['exit_code']}; see {log_dir / 'launch.log'}")
    common.report(figures, args, plot_fn(result, log_dir), headline=(
        "kills", "recoveries", "recover_seconds_median", "recover_seconds_max", "respawn_seconds_max",
        "produced_transitions", "acknowledged_transitions", "trained_transitions", "lost_transitions",
        "lost_transitions_bound", "duplicated_transitions", "drawn_untrained_transitions", "redelivered_draws",
        "replay_counter_rollbacks", "epochs", "epochs_after_last_kill", "peak_rss_mib", "rss_growth_mib",
        "return_first_third", "return_last_third", "kept_improving", "exit_code", "traceback", "benchmark_seconds"))
    if figures["traceback"] or figures["exit_code"] != 0:
        raise SystemExit(1)  # a kill ended the run: the figures are written, the benchmark fails


if __name__ == "__main__":
    main()
