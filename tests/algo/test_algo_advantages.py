"""GAE, V-trace and group baselines against hand numbers and direct (non-recursive) sums."""
from __future__ import annotations

import math

import pytest
import torch

from async_rl.algo import gae, grpo_advantages, rloo_advantages, vtrace

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


# ----------------------------------------------------------------------------------------
# GAE
# ----------------------------------------------------------------------------------------
def gae_direct(rewards, values, dones, bootstrap, gamma, lam):
    """A_t = sum_k (gamma lam)^(k-t) [no done in t..k-1] delta_k, from nested lists [T][B]."""
    T, B = len(rewards), len(rewards[0])
    adv = [[0.0] * B for _ in range(T)]
    for b in range(B):
        v_next = [values[k + 1][b] if k + 1 < T else bootstrap[b] for k in range(T)]
        delta = [rewards[k][b] + gamma * (1 - dones[k][b]) * v_next[k] - values[k][b] for k in range(T)]
        for s in range(T):
            total, alive = 0.0, 1.0
            for k in range(s, T):
                total += (gamma * lam) ** (k - s) * alive * delta[k]
                alive *= 1 - dones[k][b]
            adv[s][b] = total
    return adv


DOC = dict(rewards=[0.1, 0.2, 0.3, 0.4], values=[2.0, 2.1, 2.2, 2.3], gamma=0.9, lam=0.95)
# Exact values of a small example, worked by hand:
# d3 = 0.4 - 2.3 = -1.9; d2 = 0.3 + 0.9*2.3 - 2.2 = 0.17; d1 = 0.2 + 0.9*2.2 - 2.1 = 0.08;
# d0 = 0.1 + 0.9*2.1 - 2.0 = -0.01; gamma*lam = 0.855.
DOC_EXACT = [-0.01 + 0.855 * (0.08 + 0.855 * (0.17 + 0.855 * -1.9)), 0.08 + 0.855 * (0.17 + 0.855 * -1.9),
             0.17 + 0.855 * -1.9, -1.9]
DOC_ROUNDED = [-1.0049, -1.1636, -1.4545, -1.9]


@pytest.mark.parametrize("dones", [[0, 0, 0, 1], [0, 0, 0, 0]], ids=["terminal", "bootstrap0"])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_gae_design_doc_example(dones, dtype):
    adv, ret = gae(t(DOC["rewards"], dtype), t(DOC["values"], dtype), t(dones, dtype), 0.0, DOC["gamma"], DOC["lam"])
    tol = 1e-12 if dtype == F64 else 1e-6
    assert adv.dtype == dtype and adv.shape == (4,)
    torch.testing.assert_close(adv.double(), t(DOC_EXACT), rtol=tol, atol=tol)
    torch.testing.assert_close(adv.double(), t([-1.0048758625, -1.1635975, -1.4545, -1.9]), rtol=0, atol=1e-9 + tol)
    torch.testing.assert_close(adv.double(), t(DOC_ROUNDED), rtol=0, atol=1e-3)
    torch.testing.assert_close(ret.double(), t(DOC_EXACT) + t(DOC["values"]), rtol=tol, atol=tol)


def _rand_rollout(T=6, B=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, B, generator=g, dtype=F64)
    values = torch.randn(T, B, generator=g, dtype=F64)
    bootstrap = torch.randn(B, generator=g, dtype=F64)
    dones = torch.zeros(T, B, dtype=F64)
    dones[2, 0] = 1.0  # episode boundary inside column 0
    dones[1, 2] = dones[4, 2] = 1.0  # two boundaries in column 2; column 1 is cut (bootstraps)
    return rewards, values, dones, bootstrap


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (0.5, 0.0)])
def test_gae_batch_with_boundaries_matches_direct_sum(gamma, lam):
    rewards, values, dones, bootstrap = _rand_rollout()
    adv, ret = gae(rewards, values.requires_grad_(True), dones.bool(), bootstrap, gamma, lam)
    expected = gae_direct(rewards.tolist(), values.tolist(), dones.tolist(), bootstrap.tolist(), gamma, lam)
    torch.testing.assert_close(adv, t(expected), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret, adv + values.detach(), rtol=0, atol=0)
    assert not adv.requires_grad and not ret.requires_grad
    # hand checks: the step that ends an episode ignores what follows; a cut bootstraps
    assert adv[2, 0].item() == pytest.approx(rewards[2, 0].item() - values[2, 0].item(), abs=1e-12)
    assert adv[5, 1].item() == pytest.approx(
        rewards[5, 1].item() + gamma * bootstrap[1].item() - values[5, 1].item(), abs=1e-12
    )


def test_gae_episode_boundary_isolates_episodes():
    rewards, values, dones, bootstrap = _rand_rollout()
    adv, _ = gae(rewards, values, dones, bootstrap, 0.99, 0.95)
    later = values.clone()
    later[3:, 0] += 100.0  # values after column 0's boundary at t=2
    rewards2 = rewards.clone()
    rewards2[3:, 0] -= 7.0
    adv2, _ = gae(rewards2, later, dones, bootstrap, 0.99, 0.95)
    torch.testing.assert_close(adv2[:3, 0], adv[:3, 0], rtol=0, atol=1e-12)
    assert not torch.allclose(adv2[3:, 0], adv[3:, 0])


def test_gae_bootstrap_on_cut():
    # one step, not done: A = r + gamma * V_boot - V; scalar and per-column bootstrap agree
    adv, ret = gae(t([[1.0, 2.0]]), t([[0.5, 0.5]]), t([[0.0, 0.0]]), t([10.0, -4.0]), 0.9, 0.95)
    torch.testing.assert_close(adv, t([[1.0 + 9.0 - 0.5, 2.0 - 3.6 - 0.5]]), rtol=0, atol=1e-12)
    torch.testing.assert_close(ret, t([[10.0, -1.6]]), rtol=0, atol=1e-12)
    adv_s, _ = gae(t([[1.0, 2.0]]), t([[0.5, 0.5]]), t([[0.0, 0.0]]), 10.0, 0.9, 0.95)
    torch.testing.assert_close(adv_s, t([[9.5, 10.5]]), rtol=0, atol=1e-12)
    # a done last step ignores the bootstrap value
    adv_d, _ = gae(t([[1.0]]), t([[0.5]]), t([[1.0]]), t([1e6]), 0.9, 0.95)
    assert adv_d.item() == pytest.approx(0.5)


# ----------------------------------------------------------------------------------------
# V-trace
# ----------------------------------------------------------------------------------------
def vtrace_direct(log_rhos, discounts, rewards, values, bootstrap, rho_bar, c_bar, pg_bar):
    """The paper's sum, evaluated term by term for every s (no recursion)."""
    T, B = len(rewards), len(rewards[0])

    def clip(x, bar):
        return x if bar is None else min(bar, x)

    vs = [[0.0] * B for _ in range(T)]
    pg = [[0.0] * B for _ in range(T)]
    for b in range(B):
        V = [values[k][b] for k in range(T)] + [bootstrap[b]]
        rho = [math.exp(log_rhos[k][b]) for k in range(T)]
        for s in range(T):
            total = V[s]
            for k in range(s, T):
                trace = math.prod(discounts[i][b] * clip(rho[i], c_bar) for i in range(s, k))
                total += trace * clip(rho[k], rho_bar) * (rewards[k][b] + discounts[k][b] * V[k + 1] - V[k])
            vs[s][b] = total
        for s in range(T):
            vs_next = vs[s + 1][b] if s + 1 < T else bootstrap[b]
            pg[s][b] = clip(rho[s], pg_bar) * (rewards[s][b] + discounts[s][b] * vs_next - V[s])
    return vs, pg


THRESHOLDS = [(1.0, 1.0, 1.0), (None, None, None), (2.0, 0.5, 1.5), (0.8, None, None), (None, 1.2, 0.7)]


@pytest.mark.parametrize("rho_bar,c_bar,pg_bar", THRESHOLDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_vtrace_matches_direct_sum(rho_bar, c_bar, pg_bar, seed):
    g = torch.Generator().manual_seed(seed)
    T, B = 7, 3
    log_rhos = torch.randn(T, B, generator=g, dtype=F64) * 0.8
    rewards = torch.randn(T, B, generator=g, dtype=F64)
    values = torch.randn(T, B, generator=g, dtype=F64)
    bootstrap = torch.randn(B, generator=g, dtype=F64)
    dones = (torch.rand(T, B, generator=g) < 0.2).to(F64)
    discounts = 0.95 * (1.0 - dones)
    assert (log_rhos > 0.5).any() and (log_rhos < -0.5).any()  # the clips matter
    args = [x.clone().requires_grad_(True) for x in (log_rhos, rewards, values, bootstrap)]
    vs, pg = vtrace(args[0], discounts, args[1], args[2], args[3], rho_bar, c_bar, pg_bar)
    exp_vs, exp_pg = vtrace_direct(
        log_rhos.tolist(), discounts.tolist(), rewards.tolist(), values.tolist(), bootstrap.tolist(),
        rho_bar, c_bar, pg_bar,
    )
    torch.testing.assert_close(vs, t(exp_vs), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(pg, t(exp_pg), rtol=1e-10, atol=1e-10)
    assert not vs.requires_grad and not pg.requires_grad


def test_vtrace_default_thresholds_are_one():
    g = torch.Generator().manual_seed(5)
    x = [torch.randn(4, 2, generator=g, dtype=F64) for _ in range(3)]
    bootstrap = torch.randn(2, generator=g, dtype=F64)
    discounts = torch.full((4, 2), 0.9, dtype=F64)
    vs, pg = vtrace(x[0], discounts, x[1], x[2], bootstrap)
    exp_vs, exp_pg = vtrace_direct(x[0].tolist(), discounts.tolist(), x[1].tolist(), x[2].tolist(),
                                   bootstrap.tolist(), 1.0, 1.0, 1.0)
    torch.testing.assert_close(vs, t(exp_vs), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(pg, t(exp_pg), rtol=1e-10, atol=1e-10)


def test_vtrace_hand_computed():
    # T=2, B=1, rho = [2, 0.5] clipped at 1 -> rho_bar = [1, 0.5], c = [1, 0.5]; gamma 0.9
    # d1 = 0.5 * (1 + 0.9*4 - 2) = 1.3 -> vs1 = 3.3; d0 = 1 * (0 + 0.9*2 - 1) = 0.8
    # vs0 = 1 + 0.8 + 0.9 * 1 * 1.3 = 2.97; pg0 = 1 * (0 + 0.9*3.3 - 1) = 1.97; pg1 = 0.5 * 2.6 = 1.3
    vs, pg = vtrace(t([[math.log(2.0)], [math.log(0.5)]]), t([[0.9], [0.9]]), t([[0.0], [1.0]]),
                    t([[1.0], [2.0]]), t([4.0]))
    torch.testing.assert_close(vs, t([[2.97], [3.3]]), rtol=0, atol=1e-12)
    torch.testing.assert_close(pg, t([[1.97], [1.3]]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("thresholds", [(None, None, None), (1.0, 1.0, 1.0)])
def test_vtrace_on_policy_equals_gae_lambda_one(thresholds):
    rewards, values, dones, bootstrap = _rand_rollout(T=8, B=4, seed=3)
    gamma = 0.97
    vs, pg = vtrace(torch.zeros_like(rewards), gamma * (1.0 - dones), rewards, values, bootstrap, *thresholds)
    adv, ret = gae(rewards, values, dones, bootstrap, gamma, 1.0)
    torch.testing.assert_close(vs, ret, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pg, adv, rtol=1e-12, atol=1e-12)


def test_vtrace_float32():
    g = torch.Generator().manual_seed(2)
    x = [torch.randn(5, 2, generator=g, dtype=F64) for _ in range(3)]
    bootstrap = torch.randn(2, generator=g, dtype=F64)
    discounts = torch.full((5, 2), 0.9, dtype=F64)
    vs32, pg32 = vtrace(*(y.float() for y in (x[0], discounts, x[1], x[2], bootstrap)))
    exp_vs, exp_pg = vtrace_direct(x[0].tolist(), discounts.tolist(), x[1].tolist(), x[2].tolist(),
                                   bootstrap.tolist(), 1.0, 1.0, 1.0)
    assert vs32.dtype == torch.float32
    torch.testing.assert_close(vs32.double(), t(exp_vs), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pg32.double(), t(exp_pg), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------
# Group baselines
# ----------------------------------------------------------------------------------------
def test_grpo_hand_computed():
    # [1,2,3,4]: mean 2.5, unbiased std sqrt(5/3); [5,5,5,5]: std 0 -> 0; [0,1]: mean .5, std sqrt(.5)
    rewards = t([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0]])
    adv = grpo_advantages(rewards)
    std = math.sqrt(5.0 / 3.0)
    torch.testing.assert_close(adv, t([[x / (std + 1e-6) for x in (-1.5, -0.5, 0.5, 1.5)], [0.0] * 4]), rtol=1e-12, atol=0)
    adv = grpo_advantages(t([[0.0, 1.0]]), eps=0.5)
    s = math.sqrt(0.5)
    torch.testing.assert_close(adv, t([[-0.5 / (s + 0.5), 0.5 / (s + 0.5)]]), rtol=1e-12, atol=0)


def test_rloo_hand_computed():
    # r_i - mean of the others: 1-3, 2-8/3, 3-7/3, 4-2; group 2: 0-1, 2-0 ... [0, 2]: -2, 2
    adv = rloo_advantages(t([[1.0, 2.0, 3.0, 4.0], [0.0, 2.0, 0.0, 2.0]]))
    torch.testing.assert_close(
        adv, t([[-2.0, -2.0 / 3.0, 2.0 / 3.0, 2.0], [-4.0 / 3.0, 4.0 / 3.0, -4.0 / 3.0, 4.0 / 3.0]]), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages])
def test_group_baselines_random_and_no_grad(fn):
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(3, 5, generator=g, dtype=F64, requires_grad=True)
    out = fn(rewards)
    rows = rewards.detach().tolist()
    if fn is grpo_advantages:
        exp = []
        for row in rows:
            m = sum(row) / len(row)
            sd = math.sqrt(sum((x - m) ** 2 for x in row) / (len(row) - 1))
            exp.append([(x - m) / (sd + 1e-6) for x in row])
    else:
        exp = [[x - (sum(row) - x) / (len(row) - 1) for x in row] for row in rows]
    torch.testing.assert_close(out, t(exp), rtol=1e-12, atol=1e-12)
    assert not out.requires_grad


@pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages])
@pytest.mark.parametrize("shape", [(4,), (3, 1), (2, 3, 4)])
def test_group_baselines_reject_bad_shapes(fn, shape):
    with pytest.raises(ValueError, match=r"\[G, n\]"):
        fn(torch.zeros(shape))


# ----------------------------------------------------------------------------------------
# The estimator registry (--advantage)
# ----------------------------------------------------------------------------------------
GROUPS = [[1.0, 2.0, 3.0], [0.0, 0.0, 1.0], [5.0, 5.0, 5.0]]
# grpo: (r - mean) / (unbiased std + 1e-6); group 2: mean 1/3, std sqrt(1/3); group 3: std 0 -> 0.
S3 = math.sqrt(1.0 / 3.0)
GROUPS_GRPO = [[-1.0 / (1 + 1e-6), 0.0, 1.0 / (1 + 1e-6)],
               [(-1 / 3) / (S3 + 1e-6), (-1 / 3) / (S3 + 1e-6), (2 / 3) / (S3 + 1e-6)], [0.0, 0.0, 0.0]]
# rloo: r_i - mean of the two others.
GROUPS_RLOO = [[-1.5, 0.0, 1.5], [-0.5, -0.5, 1.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize("name, expected", [("grpo", GROUPS_GRPO), ("rloo", GROUPS_RLOO)])
def test_group_estimators_on_synthetic_groups(name, expected):
    from async_rl.algo import advantage_estimator

    est = advantage_estimator(name)
    assert (est.where, est.unit, est.needs_critic, est.needs_group_rollouts) == ("replay", "step", False, True)
    returns = t(GROUPS).requires_grad_(True)
    adv = est.group_advantages(returns)
    torch.testing.assert_close(adv, t(expected), rtol=1e-12, atol=1e-12)
    assert not adv.requires_grad  # no_grad: advantages are targets, not part of the graph
    torch.testing.assert_close(adv.sum(dim=1), t([0.0, 0.0, 0.0]), rtol=0, atol=1e-9)  # zero-mean per group


def test_registry_says_where_each_estimator_runs_and_refuses_what_cannot_run():
    from async_rl.algo import ESTIMATORS, advantage_estimator, check_advantage
    from async_rl.errors import ConfigError

    assert {"gae", "vtrace", "grpo", "rloo"} <= set(ESTIMATORS.names())
    gae_, vt = advantage_estimator("gae"), advantage_estimator("vtrace")
    assert (gae_.where, gae_.unit, gae_.needs_critic) == ("worker", "step", True)
    assert (vt.where, vt.unit, vt.needs_critic) == ("trainer", "segment", True)
    assert check_advantage("vtrace") == "vtrace"
    assert check_advantage("grpo") == "grpo"
    with pytest.raises(ConfigError, match="unknown advantage estimator 'gea' \\(did you mean 'gae'\\?\\)"):
        advantage_estimator("gea")
    from async_rl.config import load_config

    for name in ("grpo", "rloo"):  # refused before Ray starts, in one line, without groups
        with pytest.raises(ConfigError, match=f"^advantage '{name}' compares the episodes of a group: pass "
                                              r"--group-size 2 or more \(e.g. --group-size 8\), got 1$"):
            load_config(["--advantage", name])
        assert load_config(["--advantage", name, "--group-size", "8"]).group_size == 8
    with pytest.raises(ConfigError, match=r"^advantage 'gae' makes no use of groups: drop --group-size 4"):
        load_config(["--group-size", "4"])
    assert load_config(["--advantage", "vtrace"]).advantage == "vtrace"


def segment_batch(seed, done, a):
    """A minibatch of segments (``done`` [b, T]) with random observations, actions, log-probs, values and
    rewards; returns the generator too, for what the test draws next."""
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(seed)
    b, T = done.shape
    steps = TensorDict({"obs": TensorDict({"x": torch.randn(b, T, 1, generator=g)}, [b, T]),
                        "action": torch.randn(b, T, a, generator=g), "logp": torch.randn(b, T, a, generator=g),
                        "value": torch.randn(b, T, generator=g), "reward": torch.randn(b, T, generator=g),
                        "done": done}, [b, T])
    mb = TensorDict({"steps": steps, "bootstrap_obs": TensorDict({"x": torch.randn(b, 1, generator=g)}, [b])}, [b])
    return g, steps, mb


def test_vtrace_estimator_matches_vtrace_per_segment():
    """The trainer-side V-trace: flattening [B, T] segments and going time-major changes nothing."""
    from types import SimpleNamespace

    from async_rl.algo import TrainModel, advantage_estimator

    b, T, a = 2, 4, 3
    g, steps, mb = segment_batch(3, torch.tensor([[False, True, False, False], [False, False, False, True]]), a)
    logp_now = torch.randn(b * T, a, generator=g)
    values_now = torch.randn(b * T, generator=g)
    model = TrainModel(evaluate=lambda obs, action: (logp_now, torch.zeros_like(logp_now), values_now),
                       value=lambda obs: obs["x"].squeeze(-1), action_key="action")
    cfg = SimpleNamespace(gamma=0.9, vtrace_clip_rho=1.0, vtrace_clip_c=0.8, vtrace_clip_pg_rho=1.2,
                          normalize_advantages=False, kl_ref_coef=0.0)
    got = advantage_estimator("vtrace").loss_inputs(mb, model, cfg)
    for i in range(b):
        rows = slice(i * T, (i + 1) * T)
        vs, adv = vtrace((logp_now[rows] - steps["logp"][i]).sum(-1, keepdim=True),
                         0.9 * (1.0 - steps["done"][i].float()).unsqueeze(-1), steps["reward"][i].unsqueeze(-1),
                         values_now[rows].unsqueeze(-1), mb["bootstrap_obs", "x"][i], 1.0, 0.8, 1.2)
        torch.testing.assert_close(got.advantage[rows], adv.squeeze(-1))
        torch.testing.assert_close(got.value_target[rows], vs.squeeze(-1))
    torch.testing.assert_close(got.logp_old, steps["logp"].reshape(b * T, a))
    torch.testing.assert_close(got.value_old, steps["value"].reshape(b * T))


def test_estimators_carry_reference_and_group_fields_and_vtrace_penalises_rewards():
    """A reference on the model reaches LossInputs; vtrace subtracts the KL from the rewards (kl_ref_as reward);
    step records pass their group fields on."""
    from types import SimpleNamespace

    from async_rl.algo import TrainModel, advantage_estimator

    b, T, a = 2, 3, 2
    g, steps, mb = segment_batch(5, torch.zeros(b, T, dtype=torch.bool), a)
    logp_now, logp_ref = torch.randn(b * T, a, generator=g), torch.randn(b * T, a, generator=g)
    model = TrainModel(evaluate=lambda obs, action: (logp_now, torch.zeros_like(logp_now), torch.zeros(len(action))),
                       value=lambda obs: obs["x"].squeeze(-1), action_key="action", reference=lambda obs, action: logp_ref)
    cfg = SimpleNamespace(gamma=0.9, vtrace_clip_rho=1.0, vtrace_clip_c=1.0, vtrace_clip_pg_rho=1.0,
                          normalize_advantages=False, kl_ref_coef=0.5, kl_ref_as="reward", kl_ref_estimator="k1")
    got = advantage_estimator("vtrace").loss_inputs(mb, model, cfg)
    assert torch.equal(got.logp_ref, logp_ref)
    flat = steps.reshape(b * T)
    penalised = flat["reward"] - 0.5 * (flat["logp"] - logp_ref).sum(-1)  # k1 of the behaviour's actions
    tm = lambda x: x.reshape(b, T).transpose(0, 1)  # noqa: E731
    _, adv = vtrace(tm((logp_now - flat["logp"]).sum(-1)), 0.9 * torch.ones(T, b), tm(penalised), torch.zeros(T, b),
                    mb["bootstrap_obs", "x"].squeeze(-1), 1.0, 1.0, 1.0)
    torch.testing.assert_close(got.advantage, adv.transpose(0, 1).reshape(-1))
    # step records: the group fields pass through as they are
    flat["group_id"], flat["success"] = torch.arange(b * T) // 3, torch.arange(b * T) % 2 == 0
    flat["advantage"], flat["value_target"] = torch.zeros(b * T), torch.zeros(b * T)
    got = advantage_estimator("grpo").loss_inputs(flat, model, cfg)
    assert torch.equal(got.group_id, flat["group_id"]) and torch.equal(got.success, flat["success"])
    assert torch.equal(got.logp_ref, logp_ref) and got.value_target is None


def test_group_estimators_batch_scaling_cannot_blow_up_a_constant_super_batch():
    # naive keeps no baseline, so a super-batch whose returns are all equal and non-zero has a batch std of 0:
    # dividing by it (plus 1e-8) multiplied the advantages by ~1e8. The scale is the RMS, which only vanishes
    # when every advantage is 0 (and then there is nothing to scale).
    from types import SimpleNamespace

    from tensordict import TensorDict

    from async_rl.algo import advantage_estimator, distributed_normalize

    on = SimpleNamespace(normalize_advantages=True, normalize_group_advantages=True, normalize_advantages_per="batch")
    for value in (2.5, -0.25):
        batch = TensorDict({"advantage": torch.full((8,), value)}, [8])
        for name in ("naive", "grpo", "rloo"):
            got = advantage_estimator(name).prepare(batch, on)["advantage"]
            torch.testing.assert_close(got, torch.full((8,), math.copysign(1.0, value)), msg=name)
    zeros = distributed_normalize(torch.zeros(5), center=False)
    assert torch.equal(zeros, torch.zeros(5))  # an all-zero batch (every group tied) stays 0, not NaN
    # A batch with mean 0 (grpo's and rloo's advantages over whole groups): the RMS is the std, as before.
    centred = grpo_advantages(t([[1.0, 2.0, 4.0], [0.0, 0.0, 3.0]])).reshape(-1)
    torch.testing.assert_close(distributed_normalize(centred, center=False), centred / centred.std(unbiased=False))


def test_grpo_gives_a_group_of_tied_float32_returns_no_advantage():
    # In float32 the mean of equal values can be off by an ulp; dividing that ulp by a std made of the same
    # ulp gave every member of a tied group the same advantage near +-0.93 (a push on all its actions).
    from async_rl.algo import group_relative

    for value in (0.1, 3.3333, 12345.678, 1e6 / 3):
        for n in (3, 7, 8):
            returns = torch.full((2, n), value, dtype=torch.float32)
            returns[1, 0] = value * 0.5  # a group with spread next to the tied one
            adv = grpo_advantages(returns)
            assert adv.dtype == torch.float32 and torch.equal(adv[0], torch.zeros(n)), (value, n, adv[0])
            assert adv[1].abs().max() > 0.3
    # PACS calls it on scores that carry gradients: they still flow, in the input's dtype.
    score = torch.full((4,), 3.3333, dtype=torch.float32, requires_grad=True)
    out = group_relative(score * torch.tensor([1.0, 1.0, 1.0, 2.0]), torch.tensor([0, 0, 0, 1]), "grpo")
    assert out.dtype == torch.float32 and torch.equal(out.detach()[:3], torch.zeros(3))  # a lone member keeps its own
    out.sum().backward()
    assert score.grad is not None and torch.isfinite(score.grad).all()
