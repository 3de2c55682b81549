"""The rollout request path: env steps/s against envs per worker, and the cost of one inference call.

    python benchmarks/bench_request_path.py [--quick] [--envs-per-worker 1,2,4,8,16] [--seconds 10]
        [--out request_path.json]

Starts a local Ray (2 CPUs) with the real actors of the MetaWorld launch
(``configs/metaworld_mt1_ppo.yaml``, MT1 reach-v3) but no trainers: one ``InferenceActor`` serving
its initial weights, one ``ReplayBufferActor``, one ``StatsActor`` and one ``RolloutWorkerActor``.

1. **Env steps/s against envs per worker**: for each K in ``--envs-per-worker`` a fresh worker with K
   lock-stepped envs collects; after a warm-up its steps are counted over ``--seconds`` (``pause``
   returns the count). ``worker_efficiency_k<K>`` = that rate / one process stepping the same env
   with random actions and no model (``bench_env_raw``, measured in the same run): the share of a
   stepping process the plumbing leaves to the environment.
2. **One inference call** (K observations, the worker's wire dict): the median round trip from the
   driver of (a) the plain actor call ``InferenceActor.request`` (what workers use), (b) the same
   call to a minimal echo actor (Ray's own floor for a call with this payload), (c) a Ray compiled
   graph (``ray.dag``, shared-memory channels) over the same echo actor, and (d) a compiled graph over
   the ``InferenceActor`` itself; where Ray refuses one, the figure is null and the reason is recorded.

Nothing is asserted; every figure goes to ``--out`` (flat JSON) and a PNG.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray

from benchmarks import common

CONFIG = common.ROOT / "configs" / "metaworld_mt1_ppo.yaml"


@ray.remote(num_cpus=0)
class _Echo:
    """Returns what it is sent: a call with nothing behind it."""

    def echo(self, wire: Any) -> Any:
        return wire


def _config(k: int, seed: int) -> Any:
    from async_rl.config import load_config

    return load_config(["--seed", str(seed), "--envs-per-worker", str(k)], str(CONFIG))


def steps_per_sec(k: int, seconds: float, warmup_s: float, seed: int, tag: str, runtime: Any) -> dict[str, float]:
    """One worker with ``k`` envs: env steps/s over ``seconds`` after ``warmup_s``, and the inference
    actor's batching in that window."""
    from async_rl.actors.rollout_worker import RolloutWorkerActor, WorkerPeers

    cfg = _config(k, seed)
    peers = WorkerPeers(task_set=f"{tag}:task_set", inference=f"{tag}:inference", replay=f"{tag}:replay",
                        stats=f"{tag}:stats")
    worker = RolloutWorkerActor.options(num_cpus=0).remote(0, peers, runtime.preprocessor_factory, cfg)
    run = worker.run.remote()
    inference = ray.get_actor(f"{tag}:inference")
    try:
        time.sleep(warmup_s)
        ray.get(inference.stats.remote(), timeout=60)  # resets its counters
        start_steps = ray.get(worker.pause.remote(), timeout=120)
        ray.get(worker.resume.remote(), timeout=60)
        began = time.perf_counter()
        time.sleep(seconds)
        end_steps = ray.get(worker.pause.remote(), timeout=120)
        elapsed = time.perf_counter() - began
        batching = ray.get(inference.stats.remote(), timeout=60)
    finally:
        ray.get(worker.stop.remote(), timeout=60)
        ray.get(worker.resume.remote(), timeout=60)
        ray.get(run, timeout=120)
        ray.kill(worker)
    return {"env_steps_per_sec": (end_steps - start_steps) / elapsed, "rows_per_forward": batching["batch_size"],
            "forward_ms": batching["forward_ms"]}


def median_call_ms(call: Any, reps: int) -> float:
    """Median milliseconds of ``call()`` (which waits for its answer) over ``reps`` after 20 warm-ups."""
    for _ in range(20):
        call()
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return 1000.0 * statistics.median(times)


def _reason(exc: BaseException) -> str:
    """The line of an error that says what went wrong (a RayTaskError's first line names only the
    actor, and a serialisation error dumps whole namespaces)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = [line for line in lines if ("Error" in line or "cannot" in line or "Could not" in line) and len(line) < 300]
    return f"{type(exc).__name__}: {(said or lines or [''])[-1][:300]}"


def compiled_call_ms(method: Any, wire: Any, reps: int) -> tuple[float | None, str]:
    """Median round trip of a compiled graph ``InputNode -> method``; (None, why) if Ray refuses it."""
    from ray.dag import InputNode

    try:
        with InputNode() as inp:
            dag = method.bind(inp)
        compiled = dag.experimental_compile()
    except Exception as exc:  # noqa: BLE001 - record why this Ray cannot compile it
        return None, _reason(exc)
    try:
        return median_call_ms(lambda: ray.get(compiled.execute(wire), timeout=30), reps), "ok"
    except Exception as exc:  # noqa: BLE001 - record why this Ray cannot run it
        return None, _reason(exc)
    finally:
        compiled.teardown()


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, "K in 1,4,8,16, 6 s each; 200 calls per path (about 2 minutes)")
    ap.add_argument("--envs-per-worker", default=None, help="comma list of K (default 1,2,4,8,16; quick 1,4,8,16)")
    ap.add_argument("--seconds", type=float, default=None, help="measured window per K (default 10; quick 6)")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per request path (default 500; quick 200)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ks = [int(k) for k in (args.envs_per_worker or ("1,4,8,16" if args.quick else "1,2,4,8,16")).split(",")]
    seconds = args.seconds or (6.0 if args.quick else 10.0)
    reps = args.reps or (200 if args.quick else 500)

    from async_rl.actors.inference import InferenceActor
    from async_rl.actors.peers import SharedValue
    from async_rl.actors.replay_buffer import ReplayBufferActor
    from async_rl.actors.stats import StatsActor
    from async_rl.experience import to_wire
    from benchmarks.bench_env_raw import per_worker_steps_per_sec

    clock = common.Stopwatch()
    info = common.machine()
    from async_rl.driver import prepare
    from async_rl.orchestration.runtime import Runtime

    cfg = _config(8, args.seed)
    task_set = prepare(cfg)
    runtime = Runtime(cfg, task_set)  # the factories only; starts nothing
    figures: dict[str, Any] = {}
    common.start_local_ray(2)
    tag = f"reqpath{os.getpid()}"
    try:
        inference = InferenceActor.options(name=f"{tag}:inference", num_cpus=0).remote(
            0, runtime.policy_factory, cfg.inference_batch, cfg.inference_timeout_ms, seed=args.seed)
        ray.get(inference.serve_built_weights.remote(), timeout=120)
        # Held here: a named actor whose last handle goes away is ended by Ray.
        peers = [SharedValue.options(name=f"{tag}:task_set", num_cpus=0).remote(task_set),
                 ReplayBufferActor.options(name=f"{tag}:replay", num_cpus=0).remote(cfg.replay_capacity, args.seed),
                 StatsActor.options(name=f"{tag}:stats", num_cpus=0).remote()]
        ray.get([peers[0].get.remote(), peers[1].size.remote()], timeout=120)

        # 1. env steps/s against K
        raw = per_worker_steps_per_sec(task_set, 1, seconds, args.seed)[0]
        figures["raw_env_steps_per_sec_one_process"] = round(raw, 1)
        rows = []
        for k in ks:
            r = steps_per_sec(k, seconds, 5.0, args.seed, tag, runtime)
            r["worker_efficiency"] = r["env_steps_per_sec"] / raw
            rows.append({"envs_per_worker": k, **r})
            for key, value in r.items():
                figures[f"{key}_k{k}"] = round(value, 3)
            print(f"K={k}: {r['env_steps_per_sec']:.0f} env steps/s ({r['worker_efficiency']:.2f} of raw), "
                  f"{r['rows_per_forward']:.1f} rows per forward", flush=True)
        best = max(rows, key=lambda r: r["env_steps_per_sec"])
        figures["best_envs_per_worker"] = best["envs_per_worker"]

        # 2. one inference call, K = the config's envs_per_worker
        env = task_set.make_env(0, args.seed)
        obs = runtime.preprocessor_factory()(env.reset(), task_set.task_names[0])
        env.close()
        wire = to_wire(obs.unsqueeze(0).expand(cfg.envs_per_worker).clone())
        echo = _Echo.remote()
        figures["call_k"] = cfg.envs_per_worker
        figures["plain_inference_call_ms"] = round(median_call_ms(
            lambda: ray.get(inference.request.remote(wire), timeout=30), reps), 3)
        figures["plain_echo_call_ms"] = round(median_call_ms(lambda: ray.get(echo.echo.remote(wire), timeout=30), reps), 3)
        ms, why = compiled_call_ms(echo.echo, wire, reps)
        figures["compiled_echo_call_ms"], figures["compiled_echo_status"] = (round(ms, 3) if ms else None), why
        ms, why = compiled_call_ms(inference.request, wire, reps)
        figures["compiled_inference_call_ms"], figures["compiled_inference_status"] = (round(ms, 3) if ms else None), why
    finally:
        ray.shutdown()
    figures.update({"seconds": seconds, "reps": reps, "quick": args.quick, **info,
                    "load_avg_1min_end": round(os.getloadavg()[0], 2), "bench_seconds": clock()})

    common.print_table(rows, title="\none rollout worker, MetaWorld reach-v3, no trainers")

    def plot(path: Path) -> None:
        plt = common.pyplot()
        fig, (ax_k, ax_call) = plt.subplots(1, 2, figsize=(12, 4.5))
        ax_k.plot([r["envs_per_worker"] for r in rows], [r["env_steps_per_sec"] for r in rows], "o-",
                  label="one worker (whole request path)")
        ax_k.axhline(raw, color="C7", ls=":", label="one process, raw env")
        ax_k.set(xscale="log", xlabel="envs per worker (K)", ylabel="env steps/s", title="env steps/s vs K")
        ax_k.legend(fontsize=8)
        paths = [(n, figures.get(f"{n}_call_ms")) for n in ("plain_inference", "plain_echo", "compiled_echo",
                                                             "compiled_inference")]
        ax_call.bar([n.replace("_", "\n") for n, _ in paths], [v or 0 for _, v in paths], color="C0")
        ax_call.set(ylabel="median round trip (ms)", title=f"one call, {cfg.envs_per_worker} observations (0 = refused)")
        for ax in (ax_k, ax_call):
            ax.grid(alpha=0.3)
        common.save(fig, path, f"request path, {info['cores']} cores, 1-min load {info['load_avg_1min']}")

    common.report(figures, args, plot, headline=(
        *(f"env_steps_per_sec_k{k}" for k in ks), *(f"worker_efficiency_k{k}" for k in ks), "best_envs_per_worker",
        "plain_inference_call_ms", "plain_echo_call_ms", "compiled_echo_call_ms", "compiled_echo_status",
        "compiled_inference_call_ms", "compiled_inference_status", "bench_seconds"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
