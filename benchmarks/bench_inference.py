"""InferenceActor throughput and latency by batch size and timeout, under closed-loop clients.

    python benchmarks/bench_inference.py [--quick] [--policy mlp|vla] [--clients 16] [--seconds 5] [--rounds 2]
        [--out inference.json] [--plot inference.png]

Starts a local Ray (2 CPUs, bound to 127.0.0.1), then for every ``inference_batch`` x
``inference_timeout_ms`` pair creates one ``InferenceActor`` (CPU, 1 torch thread) and drives it
from one async client actor running ``--clients`` coroutines (``--client-actors`` spreads them
over more processes), each sending single-observation requests in a closed loop
(``await actor.request.remote(wire_obs)``, ``wire_obs`` a numpy dict of one row: the wire format
of ``async_rl.experience.to_wire``). After a warm-up it counts the requests answered in a
``--seconds`` window (requests/s), their client-side latencies (p50/p95/p99) and the actor's own
stats for the window (mean rows per forward pass; forward ms, the wall time of a forward pass in
its worker thread). ``inflight`` (requests/s x mean latency) should be close to ``--clients``;
much less means the window was disturbed.

The grid is measured ``--rounds`` times (every other pass in reverse order, a fresh actor each
time) and each configuration keeps its best pass: other jobs on a shared machine only ever slow a
pass down. ``batched_over_unbatched`` = best requests/s with batch > 1 / best requests/s with
batch 1 (the batch-1 runs at every timeout are the same configuration measured again, so their
spread shows the noise). Numbers are printed and written with ``--out`` (flat JSON, plus a PNG
with the same stem); nothing is asserted. The load average before and after is recorded.

Policies (``--policy``): ``mlp`` (``configs/metaworld_mt1_ppo.yaml``: the MetaWorld MLP) and ``vla``
(the tiny VLA of ``--vla-config``, by default the LIBERO launch config; only where ``envs.libero`` and
``async_rl.policies.vla`` import, otherwise skipped with the reason printed). The policy is built by
the driver's own factory for that config, and the request is one real observation of its
environment (reset, preprocessed by the policy's worker-side preprocessor, in wire format).
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import ray

from async_rl.actors.inference import InferenceActor
from benchmarks import common

CONFIGS = {"mlp": common.ROOT / "configs" / "metaworld_mt1_ppo.yaml", "vla": common.LIBERO_CONFIG}


def policy_and_observation(config: Path, seed: int) -> tuple[Callable[[], Any], dict, str]:
    """(the driver's policy factory for ``config``, one preprocessed real observation as a one-row
    wire dict, the policy's name)."""
    from async_rl.config import load_config
    from async_rl.driver import prepare
    from async_rl.experience import to_wire
    from async_rl.orchestration.runtime import Runtime

    cfg = load_config(["--seed", str(seed)], str(config))
    task_set = prepare(cfg)
    runtime = Runtime(cfg, task_set)  # builds the factories only; starts nothing
    env = task_set.make_env(0, seed)
    try:
        row = runtime.preprocessor_factory()(env.reset(), task_set.task_names[0])
    finally:
        env.close()
    return runtime.policy_factory, to_wire(row.unsqueeze(0)), cfg.policy


@ray.remote(num_cpus=0)
class _Clients:
    """``n`` coroutines in one async actor, each a closed loop of single-row requests."""

    async def ready(self) -> bool:
        return True

    async def warm(self, target: Any, obs: dict, n: int, times: int = 3) -> None:
        """``n`` concurrent requests, ``times`` times: connections, first forward passes and lazy
        initialisation on both sides happen here, before the timed run."""
        for _ in range(times):
            await asyncio.gather(*(target.request.remote(obs) for _ in range(n)))

    async def run(self, target: Any, obs: dict, n: int, t_measure: float, t_end: float,
                  read_stats: bool) -> dict[str, Any]:
        """Requests until ``t_end``; counts and times those of [t_measure, t_end) (``time.monotonic``,
        the same clock in every process of the host). ``read_stats``: also read the actor's stats
        for that window (they reset on read, so only one client actor may do it)."""
        clock = time.monotonic
        spans: list[tuple[float, float]] = []
        stats: dict[str, dict] = {}

        async def client() -> None:
            while True:
                t0 = clock()
                if t0 >= t_end:
                    return
                await target.request.remote(obs)
                spans.append((t0, clock()))

        async def server_stats() -> None:
            await asyncio.sleep(max(t_measure - clock(), 0.0))
            await target.stats.remote()
            await asyncio.sleep(max(t_end - clock(), 0.0))
            stats["window"] = await target.stats.remote()

        await asyncio.gather(*([server_stats()] if read_stats else []), *(client() for _ in range(n)))
        return {
            "answered": sum(t_measure <= t1 < t_end for _, t1 in spans),
            "latencies": [t1 - t0 for t0, t1 in spans if t0 >= t_measure and t1 < t_end],
            "stats": stats.get("window"),
        }


def _key(batch: int, timeout_ms: float) -> str:
    return f"b{batch}_t{timeout_ms:g}".replace(".", "p")


def measure(clients: list[Any], factory: Callable[[], Any], obs: dict, batch: int, timeout_ms: float,
            n_clients: int, warmup_s: float, seconds: float, seed: int,
            forward_thread: Optional[bool] = None) -> dict[str, float]:
    """One InferenceActor with this batch size and timeout, driven by ``n_clients`` closed loops
    spread over the client actors."""
    shares = [n_clients // len(clients) + (i < n_clients % len(clients)) for i in range(len(clients))]
    actor = InferenceActor.options(num_cpus=1).remote(0, factory, batch, timeout_ms, None, seed, 1, "auto",
                                                        forward_thread)
    try:
        ray.get(actor.ping.remote(), timeout=180)
        ray.get(actor.serve_built_weights.remote(), timeout=60)  # no trainer broadcasts here
        ray.get([c.warm.remote(actor, obs, k) for c, k in zip(clients, shares)], timeout=180)
        t_measure = time.monotonic() + 0.25 + warmup_s  # 0.25 s: the run calls reach the client actors
        t_end = t_measure + seconds
        outs = ray.get([c.run.remote(actor, obs, k, t_measure, t_end, i == 0)
                        for i, (c, k) in enumerate(zip(clients, shares))], timeout=warmup_s + seconds + 120)
    finally:
        ray.kill(actor)
    lat_ms = 1000.0 * np.asarray([x for o in outs for x in o["latencies"]] or [float("nan")])
    s = outs[0]["stats"]
    return {
        "batch": batch,
        "timeout_ms": timeout_ms,
        "requests_per_sec": sum(o["answered"] for o in outs) / seconds,
        "p50_ms": float(np.percentile(lat_ms, 50)),
        "p95_ms": float(np.percentile(lat_ms, 95)),
        "p99_ms": float(np.percentile(lat_ms, 99)),
        "rows_per_forward": float(s.get("batch_size", float("nan"))),
        "forward_ms": float(s.get("forward_ms", float("nan"))),
        "forwards_per_sec": s.get("batches", 0) / seconds,
        # Little's law: requests/s x mean latency = requests in flight; ~n_clients unless some
        # client loops started late or stalled (a sign the measurement was disturbed)
        "in_flight": sum(o["answered"] for o in outs) / seconds * float(np.mean(lat_ms)) / 1000.0,
    }


def summarise(rows: list[dict[str, float]]) -> dict[str, Any]:
    unbatched = [r for r in rows if r["batch"] == 1]
    batched = [r for r in rows if r["batch"] > 1]
    figures: dict[str, Any] = {}
    if unbatched:
        figures["unbatched_requests_per_sec"] = round(max(r["requests_per_sec"] for r in unbatched), 1)
        figures["unbatched_p50_ms"] = round(min(r["p50_ms"] for r in unbatched), 3)
    if batched:
        best = max(batched, key=lambda r: r["requests_per_sec"])
        figures["best_batched_requests_per_sec"] = round(best["requests_per_sec"], 1)
        figures["best_batch_size"] = best["batch"]
        figures["best_timeout_ms"] = best["timeout_ms"]
        figures["best_batched_p50_ms"] = round(best["p50_ms"], 3)
        figures["best_batched_p95_ms"] = round(best["p95_ms"], 3)
        figures["best_batched_rows_per_forward"] = round(best["rows_per_forward"], 2)
        figures["best_batched_forward_ms"] = round(best["forward_ms"], 3)
    if unbatched and batched:
        figures["batched_over_unbatched"] = round(
            figures["best_batched_requests_per_sec"] / figures["unbatched_requests_per_sec"], 3)
    return figures


def plot(rows: list[dict[str, float]], figures: dict[str, Any], path: Path, title: str) -> None:
    plt = common.pyplot()
    timeouts = sorted({r["timeout_ms"] for r in rows})
    fig, (ax_rps, ax_lat, ax_rows) = plt.subplots(1, 3, figsize=(16, 4.8), gridspec_kw={"width_ratios": [3, 3, 2]})
    for i, t in enumerate(timeouts):
        sel = sorted((r for r in rows if r["timeout_ms"] == t), key=lambda r: r["batch"])
        b = [r["batch"] for r in sel]
        color = f"C{i}"
        ax_rps.plot(b, [r["requests_per_sec"] for r in sel], "o-", color=color, label=f"timeout {t:g} ms")
        ax_lat.plot(b, [r["p50_ms"] for r in sel], "o-", color=color, label=f"p50, timeout {t:g} ms")
        ax_lat.plot(b, [r["p95_ms"] for r in sel], "s--", color=color, alpha=0.6, label=f"p95, timeout {t:g} ms")
        ax_rows.plot(b, [r["rows_per_forward"] for r in sel], "o-", color=color, label=f"timeout {t:g} ms")
    if "unbatched_requests_per_sec" in figures:
        ax_rps.axhline(figures["unbatched_requests_per_sec"], color="gray", ls=":", label="best batch 1")
    batches = sorted({r["batch"] for r in rows})
    for ax in (ax_rps, ax_lat, ax_rows):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("inference_batch (rows per forward, max)")
        ax.grid(True, alpha=0.3)
    common.label_panel(ax_rps, "requests/s (1 row each)", "throughput", from_zero=True)
    common.label_panel(ax_lat, "client-side latency (ms)", "latency", from_zero=True, fontsize=7, ncol=2)
    ax_rows.plot(batches, batches, ":", color="gray", label="full batches")
    ax_rows.set_yscale("log", base=2)
    ax_rows.set_yticks(batches, [str(b) for b in batches])
    common.label_panel(ax_rows, "mean rows per forward pass (actor stats)", "batch actually formed")
    if "batched_over_unbatched" in figures:
        title += (f"\nbest batched {figures['best_batched_requests_per_sec']:,.0f} req/s (batch "
                  f"{figures['best_batch_size']}, {figures['best_timeout_ms']:g} ms) = "
                  f"{figures['batched_over_unbatched']:.2f}x batch 1")
    common.save(fig, path, title)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, "fewer configurations and shorter windows (< 2 min)")
    ap.add_argument("--policy", default="mlp", choices=sorted(CONFIGS), help="policy to serve")
    ap.add_argument("--vla-config", default=str(common.LIBERO_CONFIG), help="launch config of --policy vla")
    ap.add_argument("--batch-sizes", type=_floats, default=None, help="comma list (default 1,2,4,8,16; quick 1,4,16)")
    ap.add_argument("--timeouts-ms", type=_floats, default=None, help="comma list (default 0.5,2,10; quick 0.5,10)")
    ap.add_argument("--clients", type=int, default=16, help="concurrent closed-loop clients")
    ap.add_argument("--client-actors", type=int, default=1, help="processes the clients are spread over")
    ap.add_argument("--seconds", type=float, default=None, help="measured window per configuration (5; quick 3)")
    ap.add_argument("--warmup-seconds", type=float, default=None, help="unmeasured lead-in (1; quick 1)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="passes over the grid, every other one in reverse order; each configuration keeps "
                         "its best pass, which filters out other jobs' bursts (default 2; quick 1)")
    ap.add_argument("--budget-minutes", type=float, default=None,
                    help="start no pass after the first once this much time has gone (default 8.5; quick 1.75)")
    ap.add_argument("--forward-thread", choices=("auto", "on", "off"), default="auto",
                    help="the inference actor's forward in a thread (on), on its event loop (off), or its own choice")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    forward_thread = {"auto": None, "on": True, "off": False}[args.forward_thread]
    config = Path(args.vla_config) if args.policy == "vla" else CONFIGS["mlp"]
    skip = common.libero_unavailable(config) if args.policy == "vla" else None
    if skip:
        print(f"{args.policy}: skipped: {skip}")
        common.report({"policy": args.policy, "skipped": skip}, args)
        return 0
    batches = [int(b) for b in (args.batch_sizes or ([1, 4, 16] if args.quick else [1, 2, 4, 8, 16]))]
    timeouts = args.timeouts_ms or ([0.5, 10.0] if args.quick else [0.5, 2.0, 10.0])
    seconds = args.seconds or (3.0 if args.quick else 5.0)
    warmup = args.warmup_seconds if args.warmup_seconds is not None else 1.0
    rounds = args.rounds or (1 if args.quick else 2)
    budget_s = 60.0 * (args.budget_minutes or (1.75 if args.quick else 8.5))
    factory, obs, policy_name = policy_and_observation(config, args.seed)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally below on `kill`
    load_before = os.getloadavg()
    start = time.perf_counter()
    grid = [(b, t) for b in batches for t in timeouts]
    best: dict[tuple[int, float], dict[str, float]] = {}  # per configuration, its best pass
    passes_done = 0
    try:
        common.start_local_ray(num_cpus=2)
        clients = [_Clients.remote() for _ in range(args.client_actors)]
        ray.get([c.ready.remote() for c in clients], timeout=180)
        print(f"{'pass':>4} {'batch':>5} {'timeout_ms':>10} {'req/s':>9} {'p50_ms':>8} {'p95_ms':>8} {'p99_ms':>8} "
              f"{'rows/fwd':>8} {'fwd_ms':>7} {'fwd/s':>7} {'inflight':>8}", flush=True)
        for rnd in range(rounds):
            if rnd and time.perf_counter() - start > budget_s * rnd / (rnd + 1):
                print(f"(pass {rnd + 1} skipped: it would not end within --budget-minutes)", flush=True)
                break
            for batch, timeout_ms in (grid if rnd % 2 == 0 else grid[::-1]):
                if rnd and time.perf_counter() - start > budget_s:
                    print(f"(rest of pass {rnd + 1} skipped: --budget-minutes reached)", flush=True)
                    break
                r = measure(clients, factory, obs, batch, timeout_ms, args.clients, warmup, seconds, args.seed,
                            forward_thread)
                kept = best.get((batch, timeout_ms))
                if kept is None or r["requests_per_sec"] > kept["requests_per_sec"]:
                    best[batch, timeout_ms] = r
                print(f"{rnd + 1:>4} {batch:>5} {timeout_ms:>10g} {r['requests_per_sec']:>9,.0f} {r['p50_ms']:>8.2f} "
                      f"{r['p95_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['rows_per_forward']:>8.2f} "
                      f"{r['forward_ms']:>7.3f} {r['forwards_per_sec']:>7,.0f} {r['in_flight']:>8.1f}", flush=True)
            passes_done += 1
        for c in clients:
            ray.kill(c)
    finally:
        ray.shutdown()
    rows = [best[c] for c in grid if c in best]
    if passes_done > 1:
        print(f"\nbest of {passes_done} passes per configuration:")
        print(f"{'batch':>5} {'timeout_ms':>10} {'req/s':>9} {'p50_ms':>8} {'p95_ms':>8} {'rows/fwd':>8} {'fwd_ms':>7}")
        for r in rows:
            print(f"{int(r['batch']):>5} {r['timeout_ms']:>10g} {r['requests_per_sec']:>9,.0f} {r['p50_ms']:>8.2f} "
                  f"{r['p95_ms']:>8.2f} {r['rows_per_forward']:>8.2f} {r['forward_ms']:>7.3f}")
    load_after = os.getloadavg()
    elapsed = time.perf_counter() - start

    figures: dict[str, Any] = summarise(rows)
    figures.update({
        "policy": policy_name,
        "forward_thread": args.forward_thread,
        "clients": args.clients,
        "client_actors": args.client_actors,
        "seconds_per_config": seconds,
        "passes": passes_done,
        **common.run_facts(args.quick, load_before, load_after, elapsed),
    })
    for r in rows:
        k = _key(int(r["batch"]), r["timeout_ms"])
        figures[f"requests_per_sec_{k}"] = round(r["requests_per_sec"], 1)
        for m in ("p50_ms", "p95_ms", "p99_ms", "forward_ms"):
            figures[f"{m}_{k}"] = round(r[m], 3)
        figures[f"rows_per_forward_{k}"] = round(r["rows_per_forward"], 3)
    title = (f"InferenceActor ({policy_name}, CPU, 1 torch thread), {args.clients} closed-loop clients "
             f"in {args.client_actors} actor(s), 1-row requests, best of {passes_done} x {seconds:g} s/config, "
             f"load {load_before[0]:.1f}->{load_after[0]:.1f} on {os.cpu_count()} cores")
    common.report(figures, args, lambda path: plot(rows, figures, path, title),
                  headline=("unbatched_requests_per_sec", "best_batched_requests_per_sec", "best_batch_size",
                            "best_timeout_ms", "batched_over_unbatched", "best_batched_rows_per_forward",
                            "best_batched_forward_ms", "load_avg_1min_before", "load_avg_1min_after", "bench_seconds"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
