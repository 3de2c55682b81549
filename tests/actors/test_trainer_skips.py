"""A skipped minibatch never reaches the optimiser, and one rank's bad minibatch skips only itself
two real trainer ranks (DeepSpeed ZeRO-2 over gloo, AdamW with weight decay),
driven with hand-made super-batches."""
import functools
import math

import pytest
import ray
import torch
from trainer_batches import ACTIONS, SPEC, mlp_step_records

from async_rl.actors.step_health import skipped_updates_line
from async_rl.actors.trainer import TrainerActor
from async_rl.config.schema import RunConfig
from async_rl.policies import build_policy
from async_rl.weights.rendezvous import find_free_port

CFG = RunConfig(device="cpu", precision="fp32", num_trainers=2, train_batch_size=4, accumulation_steps=2,
                super_batch_size=8, replay_capacity=8, updates_per_epoch=1, weight_decay=0.1, lr_policy=1e-2,
                lr_value=1e-2, ratio_threshold=1.5, trainer_num_cpus=0.5, collective_timeout_s=60.0)
TIMEOUT = 180


@pytest.fixture(scope="module")
def trainers(ray_local):
    factory = functools.partial(build_policy, "mlp", SPEC, ACTIONS)
    port = find_free_port("127.0.0.1")
    actors = [TrainerActor.options(num_cpus=CFG.trainer_num_cpus).remote(r, 2, "127.0.0.1", port, CFG, factory, None)
              for r in range(2)]
    ray.get([a.setup.remote() for a in actors], timeout=TIMEOUT)
    yield actors
    ray.get([a.shutdown.remote() for a in actors], timeout=60)
    for a in actors:
        ray.kill(a)


def _weights(actors):
    return [ray.get(a.weights.remote(), timeout=60) for a in actors]


def _train(actors, batches):
    metrics = ray.get([a._train_on.remote(b, 0) for a, b in zip(actors, batches)], timeout=TIMEOUT)
    return metrics, [ray.get(a.status.remote(), timeout=60) for a in actors]


def test_guard_skip_leaves_weights_and_optimizer_untouched_then_one_bad_minibatch_skips_only_itself(trainers):
    before = _weights(trainers)
    # 1. Every minibatch on both ranks trips the ratio guard (ratio e^3 > 1.5): no optimiser step at
    #    all, so AdamW's weight decay must not move a single weight.
    metrics, status = _train(trainers, [mlp_step_records(before[0], r, logp_shift=3.0) for r in range(2)])
    after = _weights(trainers)
    for rank in range(2):
        for name, value in before[rank].items():
            assert torch.equal(after[rank][name], value), (rank, name)
    assert [m["ratio_guard_skipped"] for m in metrics] == [1.0, 1.0]
    assert [(s["skipped_minibatches"], s["skipped_updates"]) for s in status] == [(2, 1), (2, 1)]
    assert [(m["skipped_updates_ratio_guard"], m["skipped_updates_in_a_row"]) for m in metrics] == [(1, 1), (1, 1)]

    # 2. Rank 0 holds one non-finite advantage: only its minibatch is left out; the other three train,
    #    both ranks step together and stay identical.
    metrics, status = _train(trainers, [mlp_step_records(after[0], 10, 0.0, nan_rows=[0]), mlp_step_records(after[0], 11, 0.0)])
    final = _weights(trainers)
    assert [m["nonfinite_loss_skipped"] for m in metrics] == [0.5, 0.0]
    assert [(s["skipped_minibatches"], s["skipped_updates"]) for s in status] == [(3, 1), (2, 1)]
    assert [m["skipped_updates_in_a_row"] for m in metrics] == [0, 0]  # applied: the run of skips is over
    # The left-out minibatch's NaN loss is counted, not averaged in and not dropped unseen.
    assert metrics[0]["nonfinite/loss"] == 1 and "nonfinite/loss" not in metrics[1]
    assert math.isfinite(metrics[0]["loss"])
    assert any(not torch.equal(final[0][k], after[0][k]) for k in final[0]), "the step was not applied"
    for name in final[0]:
        assert torch.isfinite(final[0][name]).all(), name
        torch.testing.assert_close(final[0][name], final[1][name], rtol=0, atol=0, msg=name)


def _nan_gradient(trainer, on: bool):
    """On: the first trainable parameter's gradient is NaN from every backward (the loss stays finite), as a
    masked attention kernel's backward may make it; off: the hook is gone."""
    def switch(self, on):
        if on:
            first = next(p for p in self.engine.module.parameters() if p.requires_grad)
            self._nan_hook = first.register_hook(lambda grad: torch.full_like(grad, float("nan")))
        else:
            self._nan_hook.remove()
    ray.get(trainer.__ray_call__.remote(switch, on), timeout=60)


def test_non_finite_gradients_are_deepspeeds_skip_and_a_run_of_them_is_named(trainers):
    before = _weights(trainers)
    _nan_gradient(trainers[0], True)  # rank 0 only: DeepSpeed's overflow check is all-reduced, both ranks skip
    try:
        for epoch in range(2):
            metrics, _ = _train(trainers, [mlp_step_records(before[0], 20 + 2 * epoch + r) for r in range(2)])
    finally:
        _nan_gradient(trainers[0], False)
    assert [m["nonfinite_loss_skipped"] + m["ratio_guard_skipped"] for m in metrics] == [0, 0]  # the losses were fine
    assert [(m["skipped_updates_gradient_overflow"], m["skipped_updates_in_a_row"]) for m in metrics] == [(2, 2), (2, 2)]
    for rank, weights in enumerate(_weights(trainers)):
        assert all(torch.equal(weights[k], before[rank][k]) for k in weights), rank
    line = skipped_updates_line(metrics[0], 2)
    assert "last 2 optimiser steps were all skipped, 2 by DeepSpeed's overflow check" in line, line
    metrics, _ = _train(trainers, [mlp_step_records(before[0], 30 + r) for r in range(2)])
    assert [m["skipped_updates_in_a_row"] for m in metrics] == [0, 0] and skipped_updates_line(metrics[0], 2) is None
