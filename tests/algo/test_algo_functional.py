"""Loss pieces of async_rl.algo.functional against hand numbers and torch.distributions."""
from __future__ import annotations

import math
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributions import Categorical, Normal, TanhTransform, TransformedDistribution

from async_rl.algo.functional import (
    categorical_entropy,
    distributed_normalize,
    distributed_normalize_by,
    kl_penalty,
    kl_reward_penalty,
    masked_mean,
    masked_whiten,
    ratio_guard,
    tanh_gaussian_entropy,
    tanh_gaussian_log_prob,
    value_loss,
)

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


# ----------------------------------------------------------------------------------------
# value loss
# ----------------------------------------------------------------------------------------
# v, v_old, R, eps 0.2. Per element (unclipped sq, clipped sq) -> max, d max / d v:
#  1) v=1.0 v_old=0.5 R=2.0: clip v -> 0.7; (1.0, 1.69) -> 1.69, grad 0 (clipped, flat)
#  2) v=2.0 v_old=2.5 R=1.0: clip v -> 2.3; (1.0, 1.69) -> 1.69, grad 0
#  3) v=0.0 v_old=0.0 R=0.1: inside; 0.01, grad 2*(v-R) = -0.2
#  4) v=1.0 v_old=0.5 R=0.0: clip v -> 0.7; (1.0, 0.49) -> 1.0, grad 2*(v-R) = 2
V, V_OLD, R = [1.0, 2.0, 0.0, 1.0], [0.5, 2.5, 0.0, 0.5], [2.0, 1.0, 0.1, 0.0]
VALUE_CASES = [
    # clip_eps, mask, expected loss, expected d loss / d v
    (0.2, None, 0.5 * (1.69 + 1.69 + 0.01 + 1.0) / 4, [0.0, 0.0, 0.5 * -0.2 / 4, 0.5 * 2.0 / 4]),
    (0.2, [True, False, True, True], 0.5 * (1.69 + 0.01 + 1.0) / 3, [0.0, 0.0, 0.5 * -0.2 / 3, 0.5 * 2.0 / 3]),
    (None, None, 0.5 * (1.0 + 1.0 + 0.01 + 1.0) / 4, [0.5 * x / 4 for x in (-2.0, 2.0, -0.2, 2.0)]),
    (None, [False, True, True, False], 0.5 * (1.0 + 0.01) / 2, [0.0, 0.5 * 2.0 / 2, 0.5 * -0.2 / 2, 0.0]),
]


@pytest.mark.parametrize("clip_eps,mask,expected,grad", VALUE_CASES)
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_value_loss_hand_computed(clip_eps, mask, expected, grad, dtype):
    v = t(V, dtype).requires_grad_(True)
    v_old, ret = t(V_OLD, dtype).requires_grad_(True), t(R, dtype).requires_grad_(True)
    loss = value_loss(v, v_old, ret, clip_eps=clip_eps, mask=None if mask is None else torch.tensor(mask))
    loss.backward()
    tol = 1e-12 if dtype == F64 else 1e-6
    assert loss.dtype == dtype and loss.item() == pytest.approx(expected, abs=tol)
    torch.testing.assert_close(v.grad.double(), t(grad), rtol=tol, atol=tol)
    assert v_old.grad is None and ret.grad is None


# ----------------------------------------------------------------------------------------
# entropies and log-probs
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("logits,expected", [
    ([0.0, 0.0, 0.0, 0.0], math.log(4.0)),
    ([math.log(0.5), math.log(0.25), math.log(0.25)], 1.5 * math.log(2.0)),
    ([3.0 + math.log(0.5), 3.0 + math.log(0.25), 3.0 + math.log(0.25)], 1.5 * math.log(2.0)),  # shift-invariant
    ([0.0, 0.0, -math.inf], math.log(2.0)),  # masked-out action
    ([50.0, 0.0, 0.0], 0.0),
])
def test_categorical_entropy_hand_computed(logits, expected):
    x = t(logits).requires_grad_(True)
    h = categorical_entropy(x)
    assert h.item() == pytest.approx(expected, abs=1e-12)
    h.backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("dtype,tol", [(F64, 1e-12), (torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_categorical_entropy_matches_torch_distributions(dtype, tol):
    logits = torch.randn(5, 3, 7, generator=torch.Generator().manual_seed(0), dtype=F64) * 2.0
    h = categorical_entropy(logits.to(dtype))
    assert h.shape == (5, 3) and h.dtype == dtype
    expected = Categorical(logits=logits.to(dtype).double()).entropy()
    torch.testing.assert_close(h.double(), expected, rtol=tol, atol=tol)


def _tanh_normal(mu, log_std):
    return TransformedDistribution(Normal(mu, log_std.exp()), [TanhTransform()])


@pytest.mark.parametrize("dtype,tol", [(F64, 1e-9), (torch.float32, 2e-4)])
def test_tanh_gaussian_log_prob_matches_torch_distributions(dtype, tol):
    g = torch.Generator().manual_seed(1)
    mu = torch.randn(64, 4, generator=g, dtype=F64)
    log_std = torch.randn(64, 4, generator=g, dtype=F64) * 0.5 - 0.5
    pre = mu + log_std.exp() * torch.randn(64, 4, generator=g, dtype=F64)
    action = torch.tanh(pre).clamp(-0.999, 0.999)  # away from the +-1 clamp (float32 atanh)
    lp = tanh_gaussian_log_prob(mu.to(dtype), log_std.to(dtype), action.to(dtype))
    assert lp.shape == (64, 4) and lp.dtype == dtype
    expected = _tanh_normal(mu, log_std).log_prob(action.to(dtype).double())
    torch.testing.assert_close(lp.double(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_tanh_gaussian_log_prob_finite_at_the_bounds(dtype):
    mu, log_std = torch.zeros(2, dtype=dtype, requires_grad=True), torch.zeros(2, dtype=dtype)
    lp = tanh_gaussian_log_prob(mu, log_std, torch.tensor([-1.0, 1.0], dtype=dtype))
    lp.sum().backward()
    assert torch.isfinite(lp).all() and torch.isfinite(mu.grad).all()


def test_tanh_gaussian_log_prob_hand_computed_and_grad():
    # a = 0, mu = 0, std = 1: log N(0; 0, 1) - log(1 - 0) = -0.5 log(2 pi)
    mu, log_std = t([0.0, 0.5]).requires_grad_(True), t([0.0, math.log(2.0)]).requires_grad_(True)
    lp = tanh_gaussian_log_prob(mu, log_std, t([0.0, math.tanh(1.5)]))
    # second: u = 1.5, mu .5, std 2: -0.5 (1/2)^2 - log 2 - 0.5 log 2 pi - log(1 - tanh(1.5)^2)
    second = -0.125 - math.log(2.0) - 0.5 * math.log(2 * math.pi) - math.log(1 - math.tanh(1.5) ** 2)
    torch.testing.assert_close(lp.detach(), t([-0.5 * math.log(2 * math.pi), second]), rtol=1e-9, atol=1e-9)
    lp.sum().backward()
    # d/dmu = (u - mu) / std^2; d/dlog_std = (u - mu)^2 / std^2 - 1
    torch.testing.assert_close(mu.grad, t([0.0, 0.25]), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(log_std.grad, t([-1.0, 0.25 - 1.0]), rtol=1e-9, atol=1e-9)


def test_tanh_gaussian_entropy_matches_monte_carlo():
    mu = t([0.0, 1.5, -0.5])
    log_std = t([0.0, -1.0, 0.7])
    torch.manual_seed(0)
    h = tanh_gaussian_entropy(mu, log_std, num_samples=50_000)
    assert h.shape == (3,)
    dist_ = _tanh_normal(mu, log_std)
    samples = dist_.sample((50_000,)).clamp(-1 + 1e-12, 1 - 1e-12)
    expected = -dist_.log_prob(samples).mean(dim=0)
    torch.testing.assert_close(h, expected, rtol=0, atol=0.03)


def test_tanh_gaussian_entropy_limits_and_grad():
    # tiny std at mu = 0: tanh is the identity there, so H = Gaussian entropy 0.5 log(2 pi e) + log std
    torch.manual_seed(0)
    log_std = t([-6.0, -6.0]).requires_grad_(True)
    mu = t([0.0, 0.0]).requires_grad_(True)
    h = tanh_gaussian_entropy(mu, log_std, num_samples=8)
    torch.testing.assert_close(h.detach(), 0.5 * math.log(2 * math.pi * math.e) + log_std.detach(), rtol=0, atol=1e-5)
    h.sum().backward()
    torch.testing.assert_close(log_std.grad, t([1.0, 1.0]), rtol=0, atol=1e-4)
    # a far-off mean squashes the distribution: entropy falls below the Gaussian's
    torch.manual_seed(0)
    far = tanh_gaussian_entropy(t([4.0]), t([0.0]), num_samples=1000)
    assert far.item() < 0.5 * math.log(2 * math.pi * math.e) - 5.0


# ----------------------------------------------------------------------------------------
# KL penalty, ratio guard, whitening
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,expected", [
    # logp = [0, ln 2, -1], logp_ref = [ln 2, 0, -1]; log r = logp_ref - logp
    ("k1", [-math.log(2.0), math.log(2.0), 0.0]),
    ("k2", [0.5 * math.log(2.0) ** 2, 0.5 * math.log(2.0) ** 2, 0.0]),
    ("k3", [2.0 - math.log(2.0) - 1.0, 0.5 + math.log(2.0) - 1.0, 0.0]),
])
def test_kl_penalty_hand_computed(kind, expected):
    logp = t([0.0, math.log(2.0), -1.0]).requires_grad_(True)
    out = kl_penalty(logp, t([math.log(2.0), 0.0, -1.0]), kind=kind)
    torch.testing.assert_close(out, t(expected), rtol=1e-12, atol=1e-12)
    # d/dlogp with log r = [ln 2, -ln 2, 0]: k1 -> 1, k2 -> -log r, k3 -> 1 - r
    out.sum().backward()
    grad = {"k1": [1.0, 1.0, 1.0], "k2": [-math.log(2.0), math.log(2.0), 0.0], "k3": [-1.0, 0.5, 0.0]}[kind]
    torch.testing.assert_close(logp.grad, t(grad), rtol=1e-12, atol=1e-12)


def test_kl_reward_penalty_subtracts_the_action_kl_per_step():
    # two steps, two action dims; k1 per element = logp - logp_ref
    reward = t([1.0, 0.0])
    logp, logp_ref = t([[-1.0, -2.0], [-0.5, -0.5]]), t([[-1.5, -2.5], [-0.5, -1.0]])
    out = kl_reward_penalty(reward, logp, logp_ref, coef=0.1, kind="k1")
    torch.testing.assert_close(out, t([1.0 - 0.1 * 1.0, 0.0 - 0.1 * 0.5]), rtol=1e-12, atol=1e-12)
    k3 = lambda lr: math.exp(lr) - lr - 1.0  # noqa: E731
    out = kl_reward_penalty(reward, logp, logp_ref, coef=2.0, kind="k3")
    torch.testing.assert_close(out, t([1.0 - 2.0 * 2 * k3(-0.5), -2.0 * (k3(0.0) + k3(-0.5))]), rtol=1e-12, atol=1e-12)
    assert out.dtype == reward.dtype and not out.requires_grad


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_penalty_estimates_kl(kind):
    p, q = t([0.5, 0.3, 0.2]), t([0.2, 0.3, 0.5])
    kl = (p * (p / q).log()).sum().item()  # KL(pi || pi_ref) = 0.2749
    torch.manual_seed(0)
    actions = torch.multinomial(p, 200_000, replacement=True)
    est = kl_penalty(p.log()[actions], q.log()[actions], kind=kind)
    if kind == "k2":  # biased: E[k2] = E[(log r)^2] / 2, not KL, far from the reference
        assert est.mean().item() == pytest.approx(0.5 * (p * (p / q).log() ** 2).sum().item(), abs=0.01)
    else:
        assert est.mean().item() == pytest.approx(kl, abs=0.01)
    if kind != "k1":
        assert (est >= 0).all()


def test_kl_penalty_unknown_kind():
    with pytest.raises(ValueError, match="k4.*k1, k2, k3"):
        kl_penalty(torch.zeros(2), torch.zeros(2), kind="k4")


@pytest.mark.parametrize("ratio_mean,threshold,skipped", [(1.5, None, False), (1.5, 2.0, False), (2.0, 2.0, False), (2.5, 2.0, True)])
def test_ratio_guard(ratio_mean, threshold, skipped):
    assert ratio_guard(ratio_mean, threshold) is skipped


def test_masked_mean_hand_computed():
    x = t([1.0, 2.0, 3.0, 100.0])
    assert masked_mean(x).item() == pytest.approx(26.5)
    assert masked_mean(x, torch.tensor([True, True, True, False])).item() == pytest.approx(2.0)
    assert masked_mean(x, torch.zeros(4, dtype=torch.bool)).item() == 0.0


@pytest.mark.parametrize("shift_mean", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_masked_whiten_hand_computed(shift_mean, masked):
    # valid [1, 2, 3, 4]: mean 2.5, population var 1.25; the masked-out 100 must not count
    x = t([1.0, 2.0, 3.0, 4.0, 100.0] if masked else [1.0, 2.0, 3.0, 4.0])
    mask = torch.tensor([True, True, True, True, False]) if masked else None
    out = masked_whiten(x, mask, shift_mean=shift_mean)
    expected = [(v - 2.5) / math.sqrt(1.25 + 1e-8) + (0.0 if shift_mean else 2.5) for v in x.tolist()]
    torch.testing.assert_close(out, t(expected), rtol=1e-12, atol=1e-12)


def _whiten_reference(values, eps=1e-8):
    """Mean and (population std + eps) of the valid values."""
    m = sum(values) / len(values)
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / len(values)) + eps


@pytest.mark.parametrize("dtype,tol", [(F64, 1e-12), (torch.float32, 1e-5)])
def test_distributed_normalize_without_process_group(dtype, tol):
    assert not (dist.is_available() and dist.is_initialized())
    x = t([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    m, sd = _whiten_reference([1.0, 2.0, 3.0, 4.0, 5.0])  # mean 3, population std sqrt(2)
    assert (m, sd) == (3.0, math.sqrt(2.0) + 1e-8)
    out = distributed_normalize(x.to(dtype), mask)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), (x - m) / sd, rtol=tol, atol=tol)
    m, sd = _whiten_reference(x.reshape(-1).tolist())
    torch.testing.assert_close(distributed_normalize(x.to(dtype)).double(), (x - m) / sd, rtol=tol, atol=tol)


def test_distributed_normalize_leaves_non_finite_elements_out_of_the_statistics():
    x = t([1.0, float("nan"), 3.0, float("inf"), 5.0])
    m, sd = _whiten_reference([1.0, 3.0, 5.0])
    out = distributed_normalize(x)
    torch.testing.assert_close(out[[0, 2, 4]], (t([1.0, 3.0, 5.0]) - m) / sd)
    assert not torch.isfinite(out[[1, 3]]).any()  # its own minibatch is skipped, not everyone's


# Each rank holds a different amount of data and its own mask.
RANK_DATA = [
    ([1.0, 2.0, 3.0, 50.0], [True, True, True, False]),
    ([-4.0, 0.5, 7.0, 2.0, 9.0, -1.0], [True, True, True, True, False, True]),
]


def _normalize_worker(rank, world_size, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        x, mask = RANK_DATA[rank]
        out = distributed_normalize(torch.tensor(x, dtype=F64), torch.tensor(mask))
        torch.save(out, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_distributed_normalize_two_processes(tmp_path):
    mp.spawn(_normalize_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    valid = [v for x, mask in RANK_DATA for v, keep in zip(x, mask) if keep]
    m, sd = _whiten_reference(valid)
    for rank, (x, _) in enumerate(RANK_DATA):
        out = torch.load(tmp_path / f"rank{rank}.pt")
        torch.testing.assert_close(out, (t(x) - m) / sd, rtol=1e-12, atol=1e-12)
    # and it differs from each rank's local whitening
    local = distributed_normalize(t(RANK_DATA[0][0]), torch.tensor(RANK_DATA[0][1]))
    assert not torch.allclose(local, torch.load(tmp_path / "rank0.pt"))


def test_distributed_normalize_by_whitens_each_task_apart():
    x = t([1.0, 10.0, 3.0, 30.0, 7.0, float("nan"), 20.0])
    task = torch.tensor([0, 1, 0, 1, 2, 0, 1])
    out = distributed_normalize_by(x, task)
    for k, members in enumerate(([0, 2], [1, 3, 6], [4])):
        m, sd = _whiten_reference([x[i].item() for i in members])
        torch.testing.assert_close(out[members], (x[members] - m) / sd)
    assert out[4] == 0.0  # a task with one step: its own mean
    assert torch.isnan(out[5])  # left out of task 0's statistics, and stays non-finite
    rms = math.sqrt((10.0**2 + 30.0**2 + 20.0**2) / 3)
    torch.testing.assert_close(distributed_normalize_by(x, task, center=False)[[1, 3, 6]], x[[1, 3, 6]] / (rms + 1e-8))
    # one task throughout: the batch's own whitening
    torch.testing.assert_close(distributed_normalize_by(x[:5], torch.zeros(5)), distributed_normalize(x[:5]))


# Rank 0 holds no step of task 2: it must still take part in that task's all-reduce.
RANK_TASKS = [([1.0, 2.0, 8.0, 4.0], [0, 1, 1, 0]), ([3.0, -6.0, 5.0], [2, 1, 2])]


def _normalize_by_worker(rank, world_size, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        x, task = RANK_TASKS[rank]
        torch.save(distributed_normalize_by(torch.tensor(x, dtype=F64), torch.tensor(task)), f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_distributed_normalize_by_task_two_processes(tmp_path):
    mp.spawn(_normalize_by_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    stats = {k: _whiten_reference([v for x, task in RANK_TASKS for v, j in zip(x, task) if j == k]) for k in range(3)}
    for rank, (x, task) in enumerate(RANK_TASKS):
        expected = t([(v - stats[j][0]) / stats[j][1] for v, j in zip(x, task)])
        torch.testing.assert_close(torch.load(tmp_path / f"rank{rank}.pt"), expected, rtol=1e-12, atol=1e-12)
