"""Tests for async_rl.weights.group and async_rl.weights.signature: signature helpers, a real Ray broadcast, timeouts (CPU, gloo)."""
from __future__ import annotations

import statistics
import sys
import threading
import time

import pytest
import ray
import torch

from async_rl.errors import ActorTimeoutError, ConfigError
from async_rl.weights.group import WeightSyncGroup
from async_rl.weights.rendezvous import find_free_port
from async_rl.weights.signature import check_signature, first_signature_difference, tensor_signature

NAMES = ["trainer-0", "inference-1", "inference-2"]


def make_tensors(seed: int) -> list[tuple[str, torch.Tensor]]:
    """Several dtypes and shapes, one non-contiguous view and a 0-d tensor."""
    g = torch.Generator().manual_seed(seed)
    return [
        ("w1", torch.randn(3, 4, generator=g)),
        ("b1", torch.randn(5, generator=g).to(torch.bfloat16)),
        ("idx", torch.randint(-1000, 1000, (2, 3, 4), generator=g)),
        ("w2_t", torch.randn(6, 4, generator=g).t()),          # non-contiguous
        ("big", torch.randn(70_000, generator=g)),              # sent alone, in place
        ("scale", torch.tensor(float(seed), dtype=torch.bfloat16)),  # 0-d
        ("step", torch.tensor(seed, dtype=torch.int64)),
    ]


# ----------------------------------------------------------------------------- signatures
def test_signature_helpers():
    a = [("w", torch.zeros(3, 4)), ("b", torch.zeros(4, dtype=torch.bfloat16))]
    sig = tensor_signature(a)
    assert sig == [("w", (3, 4), "torch.float32"), ("b", (4,), "torch.bfloat16")]
    assert first_signature_difference(sig, tensor_signature(a)) is None
    # Signatures that went through JSON (lists) compare equal too.
    assert first_signature_difference(sig, [["w", [3, 4], "torch.float32"], ["b", [4], "torch.bfloat16"]]) is None

    shape = first_signature_difference(sig, [("w", (4, 3), "torch.float32"), sig[1]])
    assert "'w'" in shape and "(3, 4)" in shape and "(4, 3)" in shape
    dtype = first_signature_difference(sig, [sig[0], ("b", (4,), "torch.float32")])
    assert "'b'" in dtype and "bfloat16" in dtype and "float32" in dtype
    name = first_signature_difference(sig, [("v", (3, 4), "torch.float32"), sig[1]])
    assert "'w'" in name and "'v'" in name
    missing = first_signature_difference(sig, sig[:1])
    assert "'b'" in missing and "missing" in missing
    extra = first_signature_difference(sig[:1], sig)
    assert "'b'" in extra and "extra" in extra
    for msg in (shape, dtype, name, missing, extra):
        assert "\n" not in msg

    check_signature(sig, sig, "inference-1")
    with pytest.raises(ConfigError, match=r"weight signature mismatch with inference-1: .*'b'.*dtype"):
        check_signature(sig, [sig[0], ("b", (4,), "torch.float32")], "inference-1")


# ----------------------------------------------------------------------------- thread helpers
def run_members(fns, timeout=30.0):
    """Run one callable per member in threads; return their results (or exceptions) by index."""
    results: dict[int, object] = {}

    def wrap(i, fn):
        try:
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            results[i] = e

    threads = [threading.Thread(target=wrap, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a member thread hung"
    return [results[i] for i in range(len(fns))]


def make_pair(group_name: str, timeout_s: float):
    port = find_free_port()

    def member(rank):
        return lambda: WeightSyncGroup(rank, 2, "127.0.0.1", port, timeout_s=timeout_s,
                                       group_name=group_name, member_names=NAMES[:2])

    groups = run_members([member(0), member(1)])
    for g in groups:
        assert isinstance(g, WeightSyncGroup), g
    return groups


# ----------------------------------------------------------------------------- timeouts
def test_join_timeout_names_missing_member():
    t0 = time.monotonic()
    with pytest.raises(ActorTimeoutError) as info:
        WeightSyncGroup(0, 2, "127.0.0.1", find_free_port(), timeout_s=3.0, group_name="lonely",
                        member_names=NAMES[:2])
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert "inference-1" in msg and "did not join" in msg and "lonely" in msg, msg
    assert 2.9 <= elapsed < 13.0, elapsed  # bounded; the slack is for a loaded machine


def test_receiver_times_out_when_sender_never_hosts_the_store():
    t0 = time.monotonic()
    with pytest.raises(ActorTimeoutError, match="trainer-0"):
        WeightSyncGroup(1, 2, "127.0.0.1", find_free_port(), timeout_s=1.5, member_names=NAMES[:2])
    assert time.monotonic() - t0 < 11.5


@pytest.mark.parametrize("caller", [0, 1], ids=["sender-alone", "receiver-alone"])
def test_broadcast_timeout_names_group_and_silent_member(caller):
    groups = make_pair(f"stuck-{caller}", timeout_s=10.0)  # set-up has its own time; the broadcast gets 2 s
    try:
        tensors = [torch.ones(1000), torch.ones(3, dtype=torch.int64)]
        t0 = time.monotonic()
        with pytest.raises(ActorTimeoutError) as info:
            groups[caller].broadcast(tensors, timeout_s=2.0)   # the other member never calls broadcast
        elapsed = time.monotonic() - t0
        msg = str(info.value)
        silent = NAMES[1 - caller]
        assert f"stuck-{caller}" in msg and "timed out" in msg, msg
        assert f"not answered by: {silent}" in msg, msg
        assert 1.9 <= elapsed < 12.0, elapsed
        with pytest.raises(RuntimeError, match="unusable"):
            groups[caller].broadcast(tensors)
    finally:
        for g in groups:
            g.close()


def test_bucketed_broadcast_threads():
    """Many small tensors over several buckets (staging slots reused), one tensor bigger than a
    bucket and non-contiguous (one-off buffer), mixed dtypes, two rounds, three members."""
    port = find_free_port()

    def tensors(seed, rank):
        g = torch.Generator().manual_seed(seed)
        ts = [torch.randn(20_000, generator=g).to(torch.bfloat16 if i % 3 == 0 else torch.float32)
              for i in range(12)]
        ts.append(torch.randn(300, 400, generator=g).t())       # 480 KB, non-contiguous
        ts.append(torch.randint(0, 9, (7,), generator=g))
        return ts if rank == 0 else [torch.zeros_like(t) for t in ts]

    def member(rank):
        def fn():
            with WeightSyncGroup(rank, 3, "127.0.0.1", port, timeout_s=20.0, group_name="buckets",
                                 member_names=NAMES, bucket_mb=0.2) as g:
                out = []
                for seed in (5, 6):
                    ts = tensors(seed, rank)
                    g.broadcast(ts)
                    out.append(ts)
                return out
        return fn

    results = run_members([member(r) for r in range(3)])
    for rank, rounds in enumerate(results):
        assert isinstance(rounds, list), rounds
        for seed, got in zip((5, 6), rounds):
            for e, t in zip(tensors(seed, 0), got):
                assert torch.equal(e, t), (rank, seed)


def test_group_leaves_global_torch_distributed_alone():
    """Beside a global (training) world, as on trainer rank 0 under DeepSpeed: the global group
    is not touched and both keep working; without one, creating a group initialises nothing."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a global process group already exists in this process")
    groups = make_pair("beside-nothing", timeout_s=10.0)
    assert not dist.is_initialized()
    for g in groups:
        g.close()

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    try:
        groups = make_pair("beside-global", timeout_s=10.0)
        sent, received = torch.arange(10.0), torch.zeros(10)
        run_members([lambda: groups[0].broadcast([sent]), lambda: groups[1].broadcast([received])])
        assert torch.equal(sent, received)
        assert dist.get_world_size() == 1 and dist.get_rank() == 0
        x = torch.ones(3)
        dist.all_reduce(x)
        assert torch.equal(x, torch.ones(3))
        for g in groups:
            g.close()
    finally:
        dist.destroy_process_group()


def test_signature_exchange_mismatch_names_peer():
    port = find_free_port()

    def member(rank):
        def fn():
            with WeightSyncGroup(rank, 2, "127.0.0.1", port, timeout_s=5.0, group_name="sig",
                                 member_names=NAMES[:2]) as g:
                g.verify_signature([("w", torch.zeros(3, 4)), ("b", torch.zeros(4 + rank))])
        return fn

    errors = run_members([member(0), member(1)])
    assert isinstance(errors[0], ConfigError) and "inference-1" in str(errors[0]) and "'b'" in str(errors[0])
    assert isinstance(errors[1], ConfigError) and "trainer-0" in str(errors[1]) and "'b'" in str(errors[1])


# ----------------------------------------------------------------------------- Ray
@ray.remote(num_cpus=0)
class Member:
    """An async Ray actor holding one rank of one or more weight-sync groups."""

    def __init__(self, rank: int):
        torch.set_num_threads(1)
        self.rank = rank
        self.groups: dict[str, WeightSyncGroup] = {}
        self.tensors: list[torch.Tensor] = []

    async def join(self, name, world_size, port, member_names):
        self.groups[name] = await WeightSyncGroup.create_async(
            self.rank, world_size, "127.0.0.1", port, timeout_s=30.0, group_name=name,
            member_names=member_names)
        return self.groups[name].backend

    async def load(self, seed: int):
        named = make_tensors(seed)
        if self.rank == 0:
            self.tensors = [t for _, t in named]
        else:
            self.tensors = [torch.zeros_like(t) for _, t in named]  # keeps strides
        await self.groups["main"].verify_signature_async([(n, t) for (n, _), t in zip(named, self.tensors)])

    async def sync(self):
        await self.groups["main"].broadcast_async(self.tensors)
        return [t.clone() for t in self.tensors]

    async def ping(self):
        return "pong"

    async def bench(self, mib: float, reps: int, n_tensors: int = 1):
        numel = int(mib * (1 << 20) / 4 / n_tensors)
        tensors = [torch.full((numel,), float(self.rank == 0)) for _ in range(n_tensors)]
        group = self.groups["bench"]
        await group.broadcast_async(tensors)  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            await group.broadcast_async(tensors)
            times.append(time.perf_counter() - t0)
        assert all(bool((t == 1).all()) for t in tensors)
        return times

    async def close(self):
        for g in self.groups.values():
            g.close()


def test_ray_broadcast_to_two_async_actors(ray_local):
    members = [Member.remote(r) for r in range(3)]
    port = find_free_port()
    backends = ray.get([m.join.remote("main", 3, port, NAMES) for m in members], timeout=60)
    assert backends == ["gloo"] * 3

    for seed in (1, 2):
        ray.get([m.load.remote(seed) for m in members], timeout=30)
        # Receivers go first: while they wait for the sender their event loop still answers.
        pending = [m.sync.remote() for m in members[1:]]
        assert ray.get(members[1].ping.remote(), timeout=30) == "pong"
        pending.insert(0, members[0].sync.remote())
        results = ray.get(pending, timeout=60)
        expected = [t for _, t in make_tensors(seed)]
        for rank, got in enumerate(results):
            assert len(got) == len(expected)
            for (name, _), e, g in zip(make_tensors(seed), expected, got):
                assert g.dtype == e.dtype and g.shape == e.shape, (rank, name)
                assert torch.equal(g, e), (rank, name)

    # A second group (sender + inference-1) beside the first: time 1, 10 and 100 MiB of float32.
    pair = members[:2]
    bench_port = find_free_port()
    ray.get([m.join.remote("bench", 2, bench_port, NAMES[:2]) for m in pair], timeout=60)
    lines = []
    for mib, reps, n in ((1, 10, 1), (10, 5, 1), (100, 3, 1), (100, 3, 100)):
        sender_times, receiver_times = ray.get([m.bench.remote(mib, reps, n) for m in pair], timeout=120)
        med = statistics.median(sender_times)
        lines.append(f"  {mib:>4} MiB float32 in {n:>3} tensor(s): median {med * 1e3:7.1f} ms "
                     f"({mib / med / 1024:.2f} GiB/s), receiver median "
                     f"{statistics.median(receiver_times) * 1e3:7.1f} ms, reps {reps}")
    print("\ngloo broadcast between two Ray actors (sender-side wall time per broadcast):\n"
          + "\n".join(lines), file=sys.stderr)

    ray.get([m.close.remote() for m in members], timeout=30)
    for m in members:
        ray.kill(m)


def test_inference_request_without_weights_fails_in_bounded_time(ray_local):
    """A request that arrives before any broadcast waits at most ``weights_timeout_s`` for the
    weights, then fails naming the inference actor; it does not linger on the server."""
    import functools

    import numpy as np

    from async_rl.actors.inference import InferenceActor
    from async_rl.policies import build_policy

    factory = functools.partial(build_policy, "mlp", {"state_dim": 3}, 2, hidden_sizes=[8])
    actor = InferenceActor.options(num_cpus=0).remote(0, factory, 4, 5.0, weights_timeout_s=1.0)
    obs = {"state": np.zeros((1, 3), dtype=np.float32)}
    start = time.monotonic()
    with pytest.raises(ray.exceptions.RayTaskError, match="inference-0: no weights from trainer-0 within 1 s") as err:
        ray.get(actor.request.remote(obs), timeout=60)
    assert isinstance(err.value.cause, ActorTimeoutError)
    assert time.monotonic() - start < 30
    ray.get(actor.serve_built_weights.remote(), timeout=30)  # once weights are there it serves
    out = ray.get(actor.request.remote(obs), timeout=60)
    assert out["action"].shape == (1, 2) and int(out["policy_version"][0]) == 0
    ray.kill(actor)
