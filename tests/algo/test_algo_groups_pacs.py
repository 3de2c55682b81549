"""Group baselines over ragged groups, the PACS loss, and the KL to a reference policy.

References are written here from the definitions (PACS's paper, Schulman's KL estimators), group by
group in plain loops, never with the scatter ops of the code under test; gradients come from
closed forms where there is one, otherwise from autograd through those loops.
"""
from __future__ import annotations

import math

import pytest
import torch

from async_rl.algo import (
    LossInputs,
    Objective,
    advantage_estimator,
    compute_policy_loss,
    group_relative,
    grpo_advantages,
    kl_penalty,
    naive_advantages,
    resolve_policy_loss_params,
)
from async_rl.errors import ConfigError

F64 = torch.float64
softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731
sigmoid = lambda x: 1.0 / (1.0 + math.exp(-x))  # noqa: E731

# Ten actions in four groups, shuffled (a minibatch holds parts of groups): group 9 has one member.
GROUPS = [7, 7, 3, 7, 3, 9, 3, 7, 12, 12]


def _members(ids, valid):
    groups: dict[int, list[int]] = {}
    for i, (g, v) in enumerate(zip(ids, valid)):
        if v:
            groups.setdefault(g, []).append(i)
    return groups


def group_reference(values, ids, method, valid, scale_by_std=True, eps=1e-6):
    """Loop reference of group_relative on a list of 0-d tensors (autograd-friendly)."""
    out = [torch.zeros((), dtype=F64) for _ in values]
    for members in _members(ids, valid).values():
        n = len(members)
        for i in members:
            if n == 1 or method == "naive":
                out[i] = values[i]
            elif method == "rloo":
                out[i] = values[i] - sum(values[j] for j in members if j != i) / (n - 1)
            else:
                mean = sum(values[j] for j in members) / n
                out[i] = values[i] - mean
                if scale_by_std:
                    out[i] = out[i] / (torch.sqrt(sum((values[j] - mean) ** 2 for j in members) / (n - 1)) + eps)
    return torch.stack(out)


# ----------------------------------------------------------------------------------------
# group_relative: forward and gradient
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("method,scale_by_std", [("grpo", True), ("grpo", False), ("rloo", True), ("naive", True)])
@pytest.mark.parametrize("masked", [False, True], ids=["all", "masked"])
def test_group_relative_matches_loop_reference(method, scale_by_std, masked):
    g = torch.Generator().manual_seed(1)
    values = torch.randn(len(GROUPS), generator=g, dtype=F64)
    valid = torch.ones(len(GROUPS), dtype=torch.bool)
    if masked:  # out of every statistic; a NaN there must not leak
        valid[[1, 8]] = False
        values[8] = float("nan")
    weights = torch.randn(len(GROUPS), generator=g, dtype=F64)
    x = values.clone().requires_grad_(True)
    out = group_relative(x, torch.tensor(GROUPS), method, scale_by_std=scale_by_std, valid=valid)
    (out * weights).sum().backward()
    leaves = [values[i].clone().requires_grad_(True) for i in range(len(GROUPS))]
    expected = group_reference(leaves, GROUPS, method, valid.tolist(), scale_by_std)
    (expected * weights).sum().backward()
    torch.testing.assert_close(out.detach(), expected.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, torch.stack([v.grad if v.grad is not None else torch.zeros((), dtype=F64)
                                                    for v in leaves]), rtol=1e-10, atol=1e-12)
    assert out[5].item() == pytest.approx(values[5].item(), abs=0)  # a group of one keeps its value
    if masked:
        assert out[1].item() == 0.0 and out[8].item() == 0.0
        assert torch.isfinite(x.grad).all()


def test_group_relative_rloo_and_dr_grpo_gradients_closed_form():
    # d out_i / d v_k: rloo 1 (i = k), -1/(n-1) (same group); centring only: 1 - 1/n, -1/n
    ids = torch.tensor([0, 0, 0, 1, 1])
    for method, kw, same, own in [("rloo", {}, lambda n: -1 / (n - 1), lambda n: 1.0),
                                  ("grpo", {"scale_by_std": False}, lambda n: -1 / n, lambda n: 1 - 1 / n)]:
        jac = torch.autograd.functional.jacobian(lambda v: group_relative(v, ids, method, **kw),
                                                 torch.tensor([1.0, 2.0, 4.0, 0.5, -1.0], dtype=F64))
        sizes = [3, 3, 3, 2, 2]
        expected = torch.tensor([[(own(sizes[i]) if i == k else same(sizes[i])) if ids[i] == ids[k] else 0.0
                                  for k in range(5)] for i in range(5)], dtype=F64)
        torch.testing.assert_close(jac, expected, rtol=1e-12, atol=1e-12)


def test_group_relative_equal_values_and_row_wrappers():
    x = torch.full((4,), 0.7, dtype=F64, requires_grad=True)
    out = group_relative(x, torch.zeros(4, dtype=torch.long), "grpo")
    out.sum().backward()
    assert torch.equal(out, torch.zeros(4, dtype=F64)) and torch.isfinite(x.grad).all()  # no NaN from sqrt(0)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]], dtype=F64)
    torch.testing.assert_close(grpo_advantages(rewards, scale_by_std=False), rewards - rewards.mean(1, keepdim=True))
    assert torch.equal(naive_advantages(rewards), rewards) and naive_advantages(rewards[:, :1]).shape == (2, 1)
    with pytest.raises(ValueError, match="unknown group method 'mean'"):
        group_relative(rewards[0], torch.zeros(4), "mean")


# ----------------------------------------------------------------------------------------
# PACS
# ----------------------------------------------------------------------------------------
def _weights(labels, ids, valid, mode):
    if mode == "only_positive":
        return [float(y) for y in labels]
    if mode == "only_negative":
        return [1.0 - y for y in labels]
    w = [1.0] * len(labels)
    for members in _members(ids, valid).values():  # sklearn 'balanced' within each group present
        n, k = len(members), sum(labels[i] for i in members)
        for i in members:
            if 0 < k < n:
                w[i] = n / (2 * k) if labels[i] else n / (2 * (n - k))
    return w


def pacs_reference(logp, logp_anchor, ids, labels, mask, beta, score, estimator, weight_mode):
    """Mean over valid actions of w * BCE-with-logits(group estimator(score), success); score log_ratio is
    beta * sum(logp - logp_anchor), mean_logp beta * mean(logp)."""
    B, A = logp.shape
    elems = [[j for j in range(A) if mask[b][j]] for b in range(B)]
    valid = [bool(e) for e in elems]
    scores = [beta * (sum(logp[b, j] - logp_anchor[b, j] for j in elems[b]) if score == "log_ratio"
                      else sum(logp[b, j] for j in elems[b]) / max(len(elems[b]), 1)) for b in range(B)]
    logits = group_reference(scores, ids, estimator, valid)
    w = _weights(labels, ids, valid, weight_mode) if weight_mode else [1.0] * B
    rows = [b for b in range(B) if valid[b]]
    loss = sum(w[b] * torch.nn.functional.softplus(-logits[b] if labels[b] else logits[b]) for b in rows) / len(rows)
    return loss, scores, rows


def _pacs_case(seed=0):
    g = torch.Generator().manual_seed(seed)
    B, A = len(GROUPS), 3
    logp = -torch.rand(B, A, generator=g, dtype=F64) * 2
    logp_ref = logp - 0.3 * torch.randn(B, A, generator=g, dtype=F64)
    labels = [1, 0, 1, 1, 0, 1, 0, 0, 1, 1]  # group 7: 2 of 4 (one masked out), 3: 1 of 3, 12: all positive
    mask = torch.ones(B, A, dtype=torch.bool)
    mask[0, 2] = mask[4, 0] = False
    mask[3] = False  # an action masked out entirely: out of its group and of the mean
    return logp, logp_ref, labels, mask


@pytest.mark.parametrize("estimator", ["rloo", "grpo", "naive"])
@pytest.mark.parametrize("score", ["log_ratio", "mean_logp"])
@pytest.mark.parametrize("weight_mode", [None, "question", "only_positive", "only_negative"])
@pytest.mark.parametrize("score_against", ["behaviour", "reference"])
def test_pacs_matches_loop_reference(estimator, score, weight_mode, score_against):
    logp, logp_ref, labels, mask = _pacs_case()
    params = {"beta": 0.5, "score": score, "adv_estimator": estimator, "score_against": score_against}
    if weight_mode:
        params.update(use_weight=True, weight_mode=weight_mode)
    x = logp.clone().requires_grad_(True)
    # score log_ratio is taken against the policy before the update (the PACS authors' old_log_probs) or the reference.
    logp_old = logp - 0.1 * torch.arange(logp.numel(), dtype=F64).reshape(logp.shape).sin()
    loss, m = compute_policy_loss("pacs", x, logp_old, torch.zeros(len(GROUPS), 1, dtype=F64), mask=mask,
                                  params=params, logp_ref=logp_ref, group_id=torch.tensor(GROUPS),
                                  success=torch.tensor(labels, dtype=torch.bool))
    loss.backward()
    ref_x = logp.clone().requires_grad_(True)
    anchor = logp_old if score_against == "behaviour" else logp_ref
    expected, scores, rows = pacs_reference(ref_x, anchor, GROUPS, labels, mask.tolist(), 0.5, score, estimator,
                                            weight_mode)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-10, abs=1e-12)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-9, atol=1e-12)
    assert m["pacs_loss"] == pytest.approx(expected.item(), rel=1e-10)
    assert m["pacs_pos_frac"] == pytest.approx(sum(labels[b] for b in rows) / len(rows))
    assert m["pacs_score_mean"] == pytest.approx(sum(float(scores[b].detach()) for b in rows) / len(rows))
    log_ratio = torch.where(mask, logp - logp_old, 0.0).sum(-1)
    assert m["ratio_mean"] == pytest.approx(sum(math.exp(log_ratio[b].item()) for b in rows) / len(rows))


def test_pacs_hand_computed():
    logp_old = torch.zeros(2, 1, dtype=F64)  # score log_ratio: against the policy before the update
    # naive, beta 2: scores (= logits) 2 * 0.5 = 1 (success) and 2 * -1 = -2 (failure)
    logp = torch.tensor([[0.5], [-1.0]], dtype=F64, requires_grad=True)
    loss, _ = compute_policy_loss("pacs", logp, logp_old, torch.zeros(2, 1), params={"beta": 2, "adv_estimator": "naive"},
                                  group_id=torch.tensor([0, 1]), success=torch.tensor([1.0, 0.0]))
    loss.backward()
    assert loss.item() == pytest.approx((softplus(-1.0) + softplus(-2.0)) / 2)
    # d/dlogp = beta * (sigmoid(logit) - y) / B
    torch.testing.assert_close(logp.grad, torch.tensor([[sigmoid(1.0) - 1.0], [sigmoid(-2.0)]], dtype=F64))
    # rloo, one group of two: logits s1 - s2 = 0.5 and -0.5; loss softplus(-0.5); ds1 = -sigmoid(-0.5)
    logp = torch.tensor([[0.3], [-0.2]], dtype=F64, requires_grad=True)
    loss, _ = compute_policy_loss("pacs", logp, logp_old + 5.0, torch.zeros(2, 1), logp_ref=logp_old,
                                  params={"score_against": "reference"}, group_id=torch.tensor([5, 5]),
                                  success=torch.tensor([1.0, 0.0]))
    loss.backward()
    assert loss.item() == pytest.approx(softplus(-0.5))
    torch.testing.assert_close(logp.grad, torch.tensor([[-sigmoid(-0.5)], [sigmoid(-0.5)]], dtype=F64))


def test_pacs_class_weights_hand_computed():
    # one group of four, one success: weights 4/2 = 2 and 4/6; only_negative drops the success
    logp = torch.tensor([[0.2], [0.1], [-0.1], [-0.3]], dtype=F64)
    args = dict(logp_ref=torch.zeros(4, 1, dtype=F64), group_id=torch.zeros(4, dtype=torch.long),
                success=torch.tensor([1.0, 0.0, 0.0, 0.0]))
    logits = [0.2 - (0.1 - 0.1 - 0.3) / 3, 0.1 - (0.2 - 0.1 - 0.3) / 3, -0.1 - (0.2 + 0.1 - 0.3) / 3,
              -0.3 - (0.2 + 0.1 - 0.1) / 3]
    bce = [softplus(-logits[0])] + [softplus(z) for z in logits[1:]]
    for mode, w in [("question", [2.0, 2 / 3, 2 / 3, 2 / 3]), ("only_negative", [0.0, 1.0, 1.0, 1.0])]:
        loss, _ = compute_policy_loss("pacs", logp, torch.zeros_like(logp), torch.zeros(4, 1),
                                      params={"use_weight": True, "weight_mode": mode}, **args)
        assert loss.item() == pytest.approx(sum(wi * b for wi, b in zip(w, bce)) / 4)


def test_pacs_gradcheck_grpo():
    logp, logp_ref, labels, mask = _pacs_case(seed=4)
    kw = dict(params={"adv_estimator": "grpo", "use_weight": True}, logp_ref=logp_ref, group_id=torch.tensor(GROUPS),
              success=torch.tensor(labels, dtype=F64))
    assert torch.autograd.gradcheck(
        # anchored at logp_ref as the policy before the update: scores spread within their groups (grpo's std > 0)
        lambda lp: compute_policy_loss("pacs", lp, logp_ref, torch.zeros(len(GROUPS), 1, dtype=F64), mask=mask, **kw)[0],
        (logp.clone().requires_grad_(True),))


def test_pacs_needs_its_fields_and_scores_whole_actions():
    with pytest.raises(ValueError, match="'pacs' needs group_id and success"):
        compute_policy_loss("pacs", torch.zeros(2, 1), torch.zeros(2, 1), torch.zeros(2, 1), logp_ref=torch.zeros(2, 1))
    with pytest.raises(ConfigError, match="'ratio_level' does not apply to clip mode 'pacs'"):
        resolve_policy_loss_params("pacs", {"ratio_level": "geometric"})
    p = resolve_policy_loss_params("pacs", {"score": "mean_logp", "beta": 3})  # YAML ints are fine for floats
    assert (p.score, p.beta, p.adv_estimator, p.use_weight) == ("mean_logp", 3.0, "rloo", False)


@pytest.mark.parametrize("old", [1, "2"])
def test_pacs_reward_method_of_earlier_versions_is_refused_with_its_new_spelling(old):
    with pytest.raises(ConfigError) as exc:
        resolve_policy_loss_params("pacs", {"reward_method": old})
    msg = str(exc.value)
    assert msg.startswith("clip param 'reward_method' is now 'score': reward_method 1 is score: log_ratio, "
                          "reward_method 2 is score: mean_logp"), msg
    assert "\n" not in msg
    with pytest.raises(ConfigError, match="'score' = 1: Input should be 'log_ratio' or 'mean_logp'"):
        resolve_policy_loss_params("pacs", {"score": 1})


# ----------------------------------------------------------------------------------------
# KL to the reference: objective term, reward penalty, estimators, config
# ----------------------------------------------------------------------------------------
def _inputs(with_ref=True):
    logp = torch.tensor([[-1.0, -0.5], [-2.0, -0.2]], dtype=F64, requires_grad=True)
    return LossInputs(logp=logp, logp_old=logp.detach() - 0.1, entropy=torch.zeros(2, 2, dtype=F64),
                      value=torch.zeros(2, dtype=F64), value_old=torch.zeros(2, dtype=F64), value_target=None,
                      advantage=torch.tensor([1.0, -1.0], dtype=F64),
                      logp_ref=torch.tensor([[-1.5, -0.5], [-1.0, -0.7]], dtype=F64) if with_ref else None)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_ref_loss_term_forward_and_gradient(kind):
    x = _inputs()
    out = Objective("clip", kl_ref_coef=0.3, kl_ref_estimator=kind)(x)
    out.loss.backward()
    lr = [[-0.5, 0.0], [1.0, -0.5]]  # log r = logp_ref - logp
    per = {"k1": lambda u: -u, "k2": lambda u: 0.5 * u * u, "k3": lambda u: math.exp(u) - u - 1.0}[kind]
    dper = {"k1": lambda u: 1.0, "k2": lambda u: -u, "k3": lambda u: 1.0 - math.exp(u)}[kind]  # d/dlogp
    kl = sum(per(u) for row in lr for u in row) / 2  # KL of the whole action, mean over the batch
    assert out.terms["kl_ref"] == pytest.approx(kl)
    y = _inputs()
    plain = Objective("clip")(y)
    plain.loss.backward()
    assert out.terms["loss"] == pytest.approx(plain.terms["loss"] + 0.3 * kl)
    expected = y.logp.grad + 0.3 * torch.tensor([[dper(u) for u in row] for row in lr], dtype=F64) / 2
    torch.testing.assert_close(x.logp.grad, expected, rtol=1e-12, atol=1e-12)


def test_kl_ref_as_reward_is_logged_not_added_and_missing_ref_is_refused():
    out = Objective("clip", kl_ref_coef=0.3, kl_ref_as="reward")(_inputs())
    assert out.terms["kl_ref"] > 0 and out.terms["loss"] == pytest.approx(Objective("clip")(_inputs()).terms["loss"])
    assert not Objective("clip").needs_reference and not Objective("pacs").needs_reference
    assert Objective("pacs", {"score_against": "reference"}).needs_reference
    assert not Objective("pacs", {"score": "mean_logp", "score_against": "reference"}).needs_reference
    assert "kl_ref" not in Objective("clip")(_inputs()).terms
    with pytest.raises(ValueError, match="no logp_ref"):
        Objective("clip", kl_ref_coef=0.1)(_inputs(with_ref=False))


def test_config_keys_and_what_each_estimator_allows():
    from async_rl.config import load_config

    cfg = load_config(["--kl-ref-coef", "0.1", "--kl-ref-estimator", "k2"])
    assert (cfg.kl_ref_coef, cfg.kl_ref_estimator, cfg.kl_ref_as, cfg.grpo_scale_by_std) == (0.1, "k2", "loss", True)
    assert Objective.from_config(cfg).needs_reference
    assert load_config(["--advantage", "vtrace", "--kl-ref-coef", "0.1", "--kl-ref-as", "reward"]).kl_ref_as == "reward"
    with pytest.raises(ConfigError, match="^kl_ref_as 'reward' needs an estimator that reads rewards on the trainer "
                                          r"\(vtrace\); advantage 'gae' computes them on the workers: use --kl-ref-as loss$"):
        load_config(["--kl-ref-coef", "0.1", "--kl-ref-as", "reward"])
    with pytest.raises(ConfigError, match="^clip mode 'pacs' compares the episodes of a group"):
        load_config(["--clip-mode", "pacs"])
    with pytest.raises(ConfigError, match="^clip mode 'pacs' compares the members of a group: pass --group-size 2 or "
                                          r"more \(e.g. --group-size 8\), got 1$"):
        load_config(["--clip-mode", "pacs", "--advantage", "naive"])  # naive alone takes groups of 1; PACS cannot
    cfg = load_config(["--clip-mode", "pacs", "--advantage", "naive", "--group-size", "4", "--no-grpo-scale-by-std"])
    assert cfg.clip_mode == "pacs" and not cfg.grpo_scale_by_std
    # PACS's group statistics run over a minibatch: a minibatch that cannot hold whole groups is refused.
    with pytest.raises(ConfigError, match="^clip mode 'pacs' compares the members of a group within a minibatch: "
                                          r"train_batch_size 20 must be a multiple of group_size 8 \(e.g. 16 or 24"):
        load_config(["--clip-mode", "pacs", "--advantage", "grpo", "--group-size", "8", "--train-batch-size", "20",
                     "--accumulation-steps", "1", "--super-batch-size", "20"])
    assert load_config(["--advantage", "grpo", "--group-size", "8", "--train-batch-size", "20",  # GRPO: per episode
                        "--accumulation-steps", "1", "--super-batch-size", "20"]).train_batch_size == 20
    returns = torch.tensor([1.0, 0.0, 0.0, 1.0])
    dr = advantage_estimator("grpo").episode_advantages(returns, cfg)
    torch.testing.assert_close(dr, returns - 0.5)
    assert torch.equal(advantage_estimator("naive").episode_advantages(returns, cfg), returns)


def test_kl_penalty_is_what_the_objective_uses():
    x = _inputs()
    out = Objective("clip", kl_ref_coef=1.0)(x)
    assert out.terms["kl_ref"] == pytest.approx(kl_penalty(x.logp, x.logp_ref).sum(-1).mean().item())
