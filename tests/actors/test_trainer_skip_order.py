"""A minibatch skipped on one rank only must not change how ZeRO-2 reduces the gradients.
ZeRO-2 packs gradients into its reduction buckets in the order backward makes them ready
and all-reduces the buckets element by element, so every rank must produce them in the same order.
A skipped minibatch's stand-in backward that runs through another graph (a sum over the parameters)
makes them ready in another order: the reduced buffer then adds one parameter's gradient to another's
(silently wrong updates), or the ranks' collectives differ in size (gloo: "Connection closed by peer").

Two pairs of real trainer ranks (DeepSpeed ZeRO-2 over gloo) start from the same weights. In one pair
rank 0 skips its whole super-batch and rank 1 trains on a good one; in the other the roles are
swapped. Averaging is symmetric, so both pairs must end with the same weights, up to rounding (the
good batch is split into minibatches in another order on the other rank). The step moves each policy
weight by about 1e-3; with the old stand-in the two pairs' policy weights differed by 2e-3."""
import functools

import ray
import torch
from trainer_batches import ACTIONS, SPEC, N, mlp_step_records

from async_rl.actors.trainer import TrainerActor
from async_rl.config.schema import RunConfig
from async_rl.policies import build_policy
from async_rl.weights.rendezvous import find_free_port

CFG = RunConfig(device="cpu", precision="fp32", num_trainers=2, train_batch_size=4, accumulation_steps=2,
                super_batch_size=8, replay_capacity=8, updates_per_epoch=1, lr_policy=1e-2, lr_value=1e-2,
                trainer_num_cpus=0.5, collective_timeout_s=60.0)
TIMEOUT = 300


def _pair(factory):
    port = find_free_port("127.0.0.1")
    return [TrainerActor.options(num_cpus=CFG.trainer_num_cpus).remote(r, 2, "127.0.0.1", port, CFG, factory, None)
            for r in range(2)]


def test_a_skip_on_one_rank_reduces_the_same_gradients_as_on_the_other(ray_local):
    factory = functools.partial(build_policy, "mlp", SPEC, ACTIONS)
    pairs = [_pair(factory), _pair(factory)]
    try:
        ray.get([a.setup.remote() for pair in pairs for a in pair], timeout=TIMEOUT)
        start = [ray.get(pair[0].weights.remote(), timeout=60) for pair in pairs]
        for name in start[0]:  # same seed, same rank 0: the same initial weights
            assert torch.equal(start[0][name], start[1][name]), name
        good, bad = mlp_step_records(start[0], 11), mlp_step_records(start[0], 11, nan_rows=range(N))  # bad: all skipped
        runs = [(pairs[0], [bad, good]), (pairs[1], [good, bad])]
        metrics = ray.get([a._train_on.remote(b, 0) for pair, batches in runs for a, b in zip(pair, batches)],
                          timeout=TIMEOUT)
        assert [m["nonfinite_loss_skipped"] for m in metrics] == [1.0, 0.0, 0.0, 1.0]
        final = [ray.get(pair[0].weights.remote(), timeout=60) for pair in pairs]
        assert any(not torch.equal(final[0][k], start[0][k]) for k in final[0]), "no step was applied"
        for name in final[0]:
            torch.testing.assert_close(final[0][name], final[1][name], rtol=0, atol=1e-4, msg=name)
    finally:
        for pair in pairs:
            ray.get([a.shutdown.remote() for a in pair], timeout=60)
            for a in pair:
                ray.kill(a)
