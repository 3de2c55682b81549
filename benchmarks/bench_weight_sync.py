"""Weight broadcast time: the dedicated weight-sync group vs the Ray object store.

    python benchmarks/bench_weight_sync.py [--quick] [--reps 10] [--out weight_sync.json] [--plot weight_sync.png]
    python benchmarks/bench_weight_sync.py --quick --device cuda --out weight_sync_gpu.json   # GPU tensors

``--device cuda`` (run by ``scripts/gpu_check.sh``) keeps both members' tensors on GPUs: rank r on GPU r where two
are visible (the group picks NCCL), both on GPU 0 where one is (gloo through host memory: two processes cannot
share one GPU in an NCCL group); the object-store path then pickles CUDA tensors (or copies them to host numpy).

Starts a local Ray (2 CPUs, bound to 127.0.0.1) and two async actors, a sender (rank 0) and a
receiver (rank 1) of one ``async_rl.weights.group.WeightSyncGroup`` (gloo on CPU). For 1, 10 and
100 MiB of float32, held as one tensor and as many tensors of 1 MiB (per-tensor overhead), and
for the MetaWorld launch's MLP policy's ``inference_tensors`` (obs 39, 4 actions), it times each path end to end,
from the sender starting to the receiver holding the values in its own preallocated tensors:

* group: both ``broadcast_async`` calls submitted before any ``ray.get`` (receiver first);
* object store: the sender ``ray.put``s the list of tensors and returns ``[ref]``; the
  receiver's call, submitted at the same time with the sender's result as its argument, gets
  the list and copies it into its tensors;
* object store as numpy (extra, not a headline figure): the same with ``t.numpy()`` views, which
  Ray stores out of band and maps on ``get`` without unpickling a copy (torch tensors are
  pickled unless RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1 is set).

Both timestamps are ``time.monotonic()`` taken inside the actors (one clock per host), so Ray's
call dispatch before the sender starts is not counted; on the object-store path the hand-over
of the ref to the receiver (dependency resolution) is. Every case runs one untimed warm-up,
then ``--reps`` timed repetitions (median reported); the receiver is zeroed before each one and
checked after it. Numbers are printed, written with ``--out`` (flat JSON, plus a PNG with the
same stem); nothing is asserted. ``group_over_object_store_speedup`` = object store / group at
100 MiB (one tensor).
"""
from __future__ import annotations

import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import ray
import torch

from async_rl.policies import build_policy
from async_rl.weights.group import WeightSyncGroup
from async_rl.weights.rendezvous import find_free_port
from benchmarks import common

_MiB = 1 << 20
NAMES = ["sender (rank 0)", "receiver (rank 1)"]


@ray.remote(num_cpus=0)
class _Member:
    """One rank of the group; also one end of the object-store path."""

    def __init__(self, rank: int, gpu: int | None = None) -> None:
        if gpu is not None:  # before CUDA initialises in this process, as the inference actor does
            os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
        torch.set_num_threads(1)
        self.rank = rank
        self.device = torch.device("cuda", 0) if gpu is not None else torch.device("cpu")
        self.group: WeightSyncGroup | None = None
        self.tensors: list[torch.Tensor] = []

    async def join(self, port: int, timeout_s: float) -> str:
        self.group = await WeightSyncGroup.create_async(self.rank, 2, "127.0.0.1", port, timeout_s=timeout_s,
                                                        group_name="bench", member_names=NAMES, device=self.device)
        return f"{self.group.backend} ({self.group.transport})"

    def prepare(self, shapes: list[tuple[int, ...]]) -> int:
        """Sender: tensors of ones; receiver: zeros (both allocated and touched once, here)."""
        self.tensors = []  # free the previous case first
        fill = 1.0 if self.rank == 0 else 0.0
        self.tensors = [torch.full(shape, fill, dtype=torch.float32, device=self.device) for shape in shapes]
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def zero(self) -> None:
        for t in self.tensors:
            t.zero_()

    def _check(self) -> bool:
        return all(bool((t == 1).all()) for t in self.tensors)

    async def broadcast(self) -> tuple[float, float, bool]:
        """(start, end, receiver holds the sender's values) of one group broadcast."""
        t0 = time.monotonic()
        await self.group.broadcast_async(self.tensors)
        if self.device.type == "cuda":  # NCCL returns once the kernel is queued: count until it is done
            torch.cuda.synchronize()
        t1 = time.monotonic()
        return t0, t1, self.rank == 0 or self._check()

    def put(self, as_numpy: bool = False) -> tuple[float, list[ray.ObjectRef]]:
        """Sender side of the object store: (start, [ref of the list of tensors]). ``as_numpy``:
        put numpy views instead (Ray stores numpy out of band and ``get`` maps it without a copy;
        torch tensors go through pickle unless RAY_ENABLE_ZERO_COPY_TORCH_TENSORS is set)."""
        t0 = time.monotonic()
        return t0, [ray.put([t.cpu().numpy() for t in self.tensors] if as_numpy else self.tensors)]

    async def get(self, sent: tuple[float, list[ray.ObjectRef]]) -> tuple[float, float, bool]:
        """Receiver side: fetch the list, copy it into the preallocated tensors. (start, end, ok)."""
        t0, (ref,) = sent
        received = await ref
        with torch.no_grad():
            for dst, src in zip(self.tensors, received):
                if isinstance(src, np.ndarray) and dst.is_cuda:
                    dst.copy_(torch.from_numpy(src))
                elif isinstance(src, np.ndarray):  # a read-only view of the object store's memory
                    np.copyto(dst.numpy(), src)
                else:
                    dst.copy_(src)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.monotonic()
        del received, ref
        return t0, t1, self._check()

    def close(self) -> None:
        if self.group is not None:
            self.group.close()


def _time_case(sender: Any, receiver: Any, shapes: list[tuple[int, ...]], reps: int) -> dict[str, Any]:
    nbytes = ray.get([m.prepare.remote(shapes) for m in (sender, receiver)], timeout=120)[0]
    group, group_sender, store, store_np = [], [], [], []
    ok = True
    for rep in range(reps + 1):  # rep 0: warm-up (first-touch pages, gloo and plasma buffers)
        ray.get(receiver.zero.remote(), timeout=60)
        pending = receiver.broadcast.remote()  # the receiver waits in its thread, the sender joins
        (r0, r1, r_ok), (s0, s1, _) = ray.get([pending, sender.broadcast.remote()], timeout=300)
        ray.get(receiver.zero.remote(), timeout=60)
        sent = sender.put.remote()
        g0, g1, g_ok = ray.get(receiver.get.remote(sent), timeout=300)
        ray.get(receiver.zero.remote(), timeout=60)
        sent = sender.put.remote(as_numpy=True)
        n0, n1, n_ok = ray.get(receiver.get.remote(sent), timeout=300)
        del sent
        ok = ok and r_ok and g_ok and n_ok
        if rep:
            group.append(r1 - s0)
            group_sender.append(s1 - s0)
            store.append(g1 - g0)
            store_np.append(n1 - n0)
    return {
        "mib": nbytes / _MiB,
        "tensors": len(shapes),
        "group_s": statistics.median(group),
        "group_min_s": min(group),
        "group_max_s": max(group),
        "group_sender_s": statistics.median(group_sender),
        "store_s": statistics.median(store),
        "store_min_s": min(store),
        "store_max_s": max(store),
        "store_np_s": statistics.median(store_np),
        "ok": ok,
    }


def _cases(sizes_mib: list[int], params_m: list[float] = ()) -> list[tuple[str, list[tuple[int, ...]]]]:
    cases = [(f"{p:g}m_params", [(int(p * 1e6),)]) for p in params_m]  # one float32 tensor of p million values
    for mib in sizes_mib:
        cases.append((f"{mib}mib", [(mib * _MiB // 4,)]))
        if mib > 1:  # 1 MiB as 1 MiB pieces is the one-tensor case again
            cases.append((f"{mib}mib_many", [(_MiB // 4,)] * mib))
    from async_rl.config import load_config

    cfg = load_config([], str(common.ROOT / "configs" / "metaworld_mt1_ppo.yaml"))  # the MLP that MetaWorld trains
    policy = build_policy(cfg.policy, {"state_dim": 39}, 4, **cfg.policy_kwargs)
    cases.append(("policy", [tuple(t.shape) for _, t in policy.inference_tensors()]))
    return cases


def plot(rows: dict[str, dict[str, Any]], figures: dict[str, Any], path: Path, title: str) -> None:
    plt = common.pyplot()
    fig, (ax_t, ax_bw) = plt.subplots(1, 2, figsize=(13, 5))
    one = [r for k, r in rows.items() if k.endswith(("mib", "m_params"))]
    many = [r for k, r in rows.items() if k.endswith("mib_many")]
    series = [("group, 1 tensor", one, "group_s", "C0", "o-"), ("group, 1 MiB tensors", many, "group_s", "C0", "s--"),
              ("object store, 1 tensor", one, "store_s", "C3", "o-"),
              ("object store, 1 MiB tensors", many, "store_s", "C3", "s--"),
              ("object store as numpy, 1 tensor", one, "store_np_s", "C2", "o:"),
              ("object store as numpy, 1 MiB tensors", many, "store_np_s", "C2", "s:")]
    for label, sel, key, color, style in series:
        if sel:
            ax_t.plot([r["mib"] for r in sel], [r[key] * 1e3 for r in sel], style, color=color, label=label)
            ax_bw.plot([r["mib"] for r in sel], [r["mib"] / 1024 / r[key] for r in sel], style, color=color,
                       label=label)
    if "policy" in rows:
        p = rows["policy"]
        for key, color, label in (("group_s", "C0", "group"), ("store_s", "C3", "object store"),
                                  ("store_np_s", "C2", "object store as numpy")):
            ax_t.plot([p["mib"]], [p[key] * 1e3], "*", ms=14, color=color,
                      label=f"MLP policy ({p['mib']:.2f} MiB, {p['tensors']} tensors), {label}")
    for ax in (ax_t, ax_bw):
        ax.set_xscale("log")
        ax.set_xlabel("MiB of float32")
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_yscale("log")
    common.label_panel(ax_t, "ms, sender starts -> receiver holds the values (median)", "time per broadcast (ms, log)")
    common.label_panel(ax_bw, "GiB/s", "effective bandwidth", from_zero=True)
    if "group_over_object_store_speedup" in figures:
        title += f"\n100 MiB: group {figures['broadcast_100mib_seconds'] * 1e3:.0f} ms, object store " \
                 f"{figures['object_store_100mib_seconds'] * 1e3:.0f} ms " \
                 f"({figures['group_over_object_store_speedup']:.2f}x)"
    common.save(fig, path, title)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, "5 repetitions per case (< 2 min)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per case (default 10; quick 5)")
    ap.add_argument("--sizes-mib", default="1,10,100", help="comma list of MiB")
    ap.add_argument("--params-m", default="1,10,100", help="comma list of parameter counts in millions (default "
                    "1,10,100; '' for none), each one float32 tensor: figures broadcast_<N>m_params_seconds "
                    "(weight-broadcast time vs model size)")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="the group's timeout")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where both members' tensors live: cuda puts rank r on GPU r (NCCL) where two GPUs are "
                         "visible, both on GPU 0 (gloo through host memory) where one is")
    args = ap.parse_args(argv)
    gpus = None
    if args.device == "cuda":
        if not torch.cuda.is_available():
            ap.error("--device cuda: no CUDA GPU on this machine")
        gpus = [0, 1] if torch.cuda.device_count() > 1 else [0, 0]
    reps = args.reps or (5 if args.quick else 10)
    sizes = [int(x) for x in args.sizes_mib.split(",") if x.strip()]
    params_m = [float(x) for x in args.params_m.split(",") if x.strip()]

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally below on `kill`
    load_before = os.getloadavg()
    start = time.perf_counter()
    rows: dict[str, dict[str, Any]] = {}
    members: list[Any] = []
    try:
        common.start_local_ray(num_cpus=2)
        members = [_Member.remote(r, None if gpus is None else gpus[r]) for r in range(2)]
        port = find_free_port()
        backend = ray.get([m.join.remote(port, args.timeout_s) for m in members], timeout=args.timeout_s + 120)[0]
        sender, receiver = members
        print(f"backend {backend}; median of {reps} (+1 warm-up) per case; seconds from the sender starting "
              "to the receiver holding the values", flush=True)
        print(f"{'case':<12} {'MiB':>8} {'tensors':>7} {'group_ms':>9} {'(sender)':>9} {'GiB/s':>6} "
              f"{'store_ms':>9} {'GiB/s':>6} {'store/group':>11} {'np_store_ms':>11} {'ok':>3}", flush=True)
        for name, shapes in _cases(sizes, params_m):
            r = rows[name] = _time_case(sender, receiver, shapes, reps)
            print(f"{name:<12} {r['mib']:>8.3f} {r['tensors']:>7} {r['group_s'] * 1e3:>9.2f} "
                  f"{r['group_sender_s'] * 1e3:>9.2f} {r['mib'] / 1024 / r['group_s']:>6.2f} "
                  f"{r['store_s'] * 1e3:>9.2f} {r['mib'] / 1024 / r['store_s']:>6.2f} "
                  f"{r['store_s'] / r['group_s']:>11.2f} {r['store_np_s'] * 1e3:>11.2f} "
                  f"{'yes' if r['ok'] else 'NO':>3}", flush=True)
        ray.get([m.close.remote() for m in members], timeout=60)
    finally:
        for m in members:
            ray.kill(m)
        ray.shutdown()
    load_after = os.getloadavg()
    elapsed = time.perf_counter() - start

    figures: dict[str, Any] = {}
    for mib in sizes:
        if f"{mib}mib" in rows:
            figures[f"broadcast_{mib}mib_seconds"] = round(rows[f"{mib}mib"]["group_s"], 6)
            figures[f"object_store_{mib}mib_seconds"] = round(rows[f"{mib}mib"]["store_s"], 6)
            figures[f"object_store_numpy_{mib}mib_seconds"] = round(rows[f"{mib}mib"]["store_np_s"], 6)
        if f"{mib}mib_many" in rows:
            figures[f"broadcast_{mib}mib_{mib}_tensors_seconds"] = round(rows[f"{mib}mib_many"]["group_s"], 6)
            figures[f"object_store_{mib}mib_{mib}_tensors_seconds"] = round(rows[f"{mib}mib_many"]["store_s"], 6)
            figures[f"object_store_numpy_{mib}mib_{mib}_tensors_seconds"] = round(
                rows[f"{mib}mib_many"]["store_np_s"], 6)
    for p in params_m:
        r = rows[f"{p:g}m_params"]
        figures[f"broadcast_{p:g}m_params_seconds"] = round(r["group_s"], 6)
        figures[f"object_store_{p:g}m_params_seconds"] = round(r["store_s"], 6)
        figures[f"object_store_numpy_{p:g}m_params_seconds"] = round(r["store_np_s"], 6)
    if "100mib" in rows:
        figures["group_over_object_store_speedup"] = round(rows["100mib"]["store_s"] / rows["100mib"]["group_s"], 3)
        figures["broadcast_100mib_gib_per_sec"] = round(100 / 1024 / rows["100mib"]["group_s"], 3)
        figures["group_over_object_store_numpy_speedup"] = round(
            rows["100mib"]["store_np_s"] / rows["100mib"]["group_s"], 3)
    if "policy" in rows:
        p = rows["policy"]
        figures.update({"policy": "mlp", "policy_mib": round(p["mib"], 4), "policy_tensors": p["tensors"],
                        "broadcast_policy_seconds": round(p["group_s"], 6),
                        "object_store_policy_seconds": round(p["store_s"], 6),
                        "object_store_numpy_policy_seconds": round(p["store_np_s"], 6)})
    for name, r in rows.items():
        figures[f"group_sender_side_{name}_seconds"] = round(r["group_sender_s"], 6)
        figures[f"group_max_{name}_seconds"] = round(r["group_max_s"], 6)
        figures[f"object_store_max_{name}_seconds"] = round(r["store_max_s"], 6)
    figures.update({
        "all_received_correctly": all(r["ok"] for r in rows.values()),
        "reps": reps, "device": args.device, "backend": backend,
        **common.run_facts(args.quick, load_before, load_after, elapsed),
    })
    title = (f"weight sync, sender -> 1 receiver (2 Ray actors, {backend}, {args.device}) vs Ray object store; "
             f"median of {reps}, load {load_before[0]:.1f}->{load_after[0]:.1f} on {os.cpu_count()} cores")
    common.report(figures, args, lambda path: plot(rows, figures, path, title),
                  headline=("broadcast_1mib_seconds", "broadcast_10mib_seconds", "broadcast_100mib_seconds",
                            "object_store_100mib_seconds", "group_over_object_store_speedup",
                            "object_store_numpy_100mib_seconds", "group_over_object_store_numpy_speedup",
                            "broadcast_policy_seconds", "policy_mib", "all_received_correctly",
                            *(f"broadcast_{p:g}m_params_seconds" for p in params_m),
                            "load_avg_1min_before", "load_avg_1min_after", "bench_seconds"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
