"""One worker's inference request over Ray against through its shared-memory slab.

    python benchmarks/bench_slab_round_trip.py [--quick] [--requests 300] [--rounds 3] [--out F.json]

Starts a local Ray (2 CPUs, bound to 127.0.0.1), one ``InferenceActor`` with the MetaWorld launch's
MLP (``configs/metaworld_mt1_ppo.yaml``: its hidden sizes, ``inference_batch`` and timeout) serving its
built weights, and two client actors that each hold a ``PolicyClient`` as a rollout worker does: one
with ``shared_memory: off`` (a Ray call per request), one with ``auto`` (a slab, after its first Ray
answer). Each sends ``--requests`` requests of ``envs_per_worker`` rows in a closed loop, one client at
a time, for ``--rounds`` rounds; the milliseconds per request (forward pass included) keep the best
round per path, since other jobs on a shared machine only ever slow a round down. Nothing is asserted.
"""
from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import ray

from async_rl.actors.inference import InferenceActor
from async_rl.actors.policy_client import PolicyClient
from async_rl.config import load_config
from async_rl.experience import from_wire
from async_rl.policies import build_policy
from benchmarks import common

CONFIG = common.ROOT / "configs" / "metaworld_mt1_ppo.yaml"
STATE_DIM, ACTION_DIM = 39, 4  # MetaWorld's


@ray.remote(num_cpus=0)
class Client:
    """A PolicyClient in its own process, as a rollout worker holds one."""

    def __init__(self, inference: str, mode: str, rows: int) -> None:
        self.client = PolicyClient(ray.get_actor(inference), "inference", 60.0, mode, f"client-{mode}", rows)
        self.obs = from_wire({"state": np.random.default_rng(0).standard_normal((rows, STATE_DIM), np.float32)})

    async def ms_per_request(self, requests: int) -> tuple[float, int]:
        for _ in range(20):  # warm-up; "auto" opens its slab here
            await self.client.act(self.obs)
        start = time.perf_counter()
        for _ in range(requests):
            await self.client.act(self.obs)
        return 1000.0 * (time.perf_counter() - start) / requests, self.client.slab_answers


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, "100 requests per round, 2 rounds")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    requests, rounds = (100, 2) if args.quick else (args.requests, args.rounds)
    cfg = load_config([], str(CONFIG))
    load_before, clock = os.getloadavg(), time.monotonic()
    common.start_local_ray(2)
    try:
        name = f"slabrtt{os.getpid()}:inference"
        policy = functools.partial(build_policy, cfg.policy, {"state_dim": STATE_DIM}, ACTION_DIM, **cfg.policy_kwargs)
        inference = InferenceActor.options(name=name, num_cpus=0).remote(0, policy, cfg.inference_batch,
                                                                         cfg.inference_timeout_ms)
        ray.get(inference.serve_built_weights.remote(), timeout=120)
        clients = {mode: Client.remote(name, mode, cfg.envs_per_worker) for mode in ("off", "auto")}
        best = {mode: float("inf") for mode in clients}
        for _ in range(rounds):
            for mode, client in clients.items():
                ms, through_slab = ray.get(client.ms_per_request.remote(requests), timeout=600)
                assert (through_slab > 0) == (mode == "auto"), (mode, through_slab)
                best[mode] = min(best[mode], ms)
    finally:
        ray.shutdown()
    figures = {"ray_ms_per_request": round(best["off"], 4), "slab_ms_per_request": round(best["auto"], 4),
               "ray_over_slab": round(best["off"] / best["auto"], 2), "rows_per_request": cfg.envs_per_worker,
               "requests_per_round": requests, "rounds": rounds,
               **common.run_facts(args.quick, load_before, os.getloadavg(), time.monotonic() - clock)}
    common.report(figures, args, headline=("ray_ms_per_request", "slab_ms_per_request", "ray_over_slab"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
