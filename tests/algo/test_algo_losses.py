"""compute_policy_loss: every clip mode and alias, forward, gradient, metrics and errors.

The expected numbers come from references written from the specification, element by element in
float64 Python (never from the code under test: tests/policy_loss_reference.py), plus hand-computed
tables.
"""
from __future__ import annotations

import math

import pytest
import torch
from policy_loss_reference import (
    ALL_MODES,
    DUAL_MODES,
    MODE_PARAM_SETS,
    MODES,
    PARAM_KEYS,
    PARAM_SETS,
    make_case,
    reference,
    reference_per_action,
    run_loss,
)

from async_rl.algo import PolicyLossParams, compute_policy_loss, policy_loss_modes, resolve_policy_loss_params
from async_rl.errors import ConfigError

TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 3e-2}
SHAPES = {  # name -> (logp shape, advantages shape)
    "B": ((14,), (14,)),
    "BD": ((7, 3), (7, 3)),
    "BD_adv_B1": ((7, 3), (7, 1)),
    "BT_adv_B1": ((3, 7), (3, 1)),
}
CASES = [(mode, pname) for mode, names in MODE_PARAM_SETS.items() for pname in names]
ALIASES = sorted(set(MODES) - set(MODE_PARAM_SETS))


def _check(mode, params, shape_name, dtype, masked):
    shape, adv_shape = SHAPES[shape_name]
    inputs = make_case(shape, adv_shape, dtype, masked)
    loss, grad, metrics = run_loss(mode, params, *inputs)
    exp_loss, exp_grad, exp_metrics = reference(mode, params, *inputs)
    tol = TOL[dtype]
    assert loss.dtype == dtype and loss.shape == ()
    assert loss.item() == pytest.approx(exp_loss, rel=tol, abs=tol)
    assert grad.dtype == dtype
    torch.testing.assert_close(grad.double(), exp_grad, rtol=tol, atol=tol)
    for key, value in exp_metrics.items():
        assert isinstance(metrics[key], float), key
        assert metrics[key] == pytest.approx(value, rel=tol, abs=tol), key
    return metrics


@pytest.mark.parametrize("mode,pname", CASES)
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_policy_loss_matches_reference_float64(mode, pname, shape_name, masked):
    _check(mode, PARAM_SETS[pname], shape_name, torch.float64, masked)


@pytest.mark.parametrize("mode", ALIASES)
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_alias_matches_reference_float64(mode, masked):
    _check(mode, {}, "BD_adv_B1", torch.float64, masked)


# ----------------------------------------------------------------------------------------
# Ratio levels: one ratio per action (row), the joint one (sum of the row's log-ratios) or the
# geometric one (their mean, GSPO), through the same per-element references
# ----------------------------------------------------------------------------------------
LEVEL_CASES = [(m, "default") for m in MODE_PARAM_SETS] + [("clip", "asym_dual"), ("cispo", "is_no_low")]


@pytest.mark.parametrize("mode,pname", LEVEL_CASES)
@pytest.mark.parametrize("level", ["sequence", "geometric"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_ratio_levels_match_reference(mode, pname, level, masked):
    logp, logp_old, adv, mask = make_case((7, 3), (7, 1), torch.float64, masked)
    params = {**PARAM_SETS[pname], "ratio_level": level}
    loss, grad, metrics = run_loss(mode, params, logp, logp_old, adv, mask)
    exp_loss, exp_grad, exp_metrics = reference_per_action(mode, PARAM_SETS[pname], logp, logp_old, adv, mask, level)
    assert loss.item() == pytest.approx(exp_loss, rel=1e-10, abs=1e-10)
    torch.testing.assert_close(grad, exp_grad, rtol=1e-10, atol=1e-10)
    for key, value in exp_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-10, abs=1e-10), key


def test_ratio_levels_hand_computed():
    # rows: ratios (1.1, 1.0), (2, 2), and a row masked out entirely; clip eps 0.2, A = 1
    logp_old = torch.zeros(3, 2, dtype=torch.float64)
    logp = torch.tensor([[1.1, 1.0], [2.0, 2.0], [50.0, 50.0]], dtype=torch.float64).log()
    mask = torch.tensor([[True, True], [True, True], [False, False]])
    adv = torch.ones(3, 1, dtype=torch.float64)
    # joint: R = 1.1 (inside: loss -1.1, d/dlogp_j = -1.1), R = 4 (clipped at 1.2, flat); mean over 2 actions
    loss, grad, m = run_loss("clip", {"ratio_level": "sequence"}, logp, logp_old, adv, mask)
    assert loss.item() == pytest.approx((-1.1 - 1.2) / 2)
    torch.testing.assert_close(grad, torch.tensor([[-0.55, -0.55], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64))
    assert (m["ratio_max"], m["clip_frac"]) == (pytest.approx(4.0), 0.5)
    # geometric: R = sqrt(1.1), d/dlogp_j = -R / 2; R = 2 clipped
    loss, grad, _ = run_loss("clip", {"ratio_level": "geometric"}, logp, logp_old, adv, mask)
    g = math.sqrt(1.1)
    assert loss.item() == pytest.approx((-g - 1.2) / 2)
    torch.testing.assert_close(grad, torch.tensor([[-g / 4, -g / 4], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64))
    # token level (the default) is per element, as before
    assert run_loss("clip", {"ratio_level": "token"}, logp, logp_old, adv, mask)[0].item() == pytest.approx(
        run_loss("clip", {}, logp, logp_old, adv, mask)[0].item(), abs=0)


@pytest.mark.parametrize("logp_shape,adv_shape", [((4, 3), (4, 3)), ((4,), (4,))])
def test_ratio_levels_need_one_advantage_per_action(logp_shape, adv_shape):
    with pytest.raises(ValueError, match="ratio level 'sequence' needs logp \\[B, A\\] and one advantage per action"):
        compute_policy_loss("clip", torch.zeros(logp_shape), torch.zeros(logp_shape), torch.ones(adv_shape),
                            params={"ratio_level": "sequence"})


@pytest.mark.parametrize("mode,pname", [(m, "dual" if m in DUAL_MODES else "default") for m in MODE_PARAM_SETS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_policy_loss_low_precision(mode, pname, dtype, masked):
    _check(mode, PARAM_SETS[pname], "BD_adv_B1", dtype, masked)


def test_reference_grid_exercises_every_branch():
    """The case grid hits clipped/dead/dual/saturated elements, so the tests above can fail."""
    inputs = make_case(*SHAPES["BD_adv_B1"], torch.float64, masked=False)
    m = reference("clip", PARAM_SETS["dual"], *inputs)[2]
    assert 0 < m["dead_grad_frac"] < m["clip_frac"] < 1
    m = reference("sapo", {}, *inputs)[2]
    assert 0 < m["sapo_gate_saturation_frac"] < 1
    m = reference("ce-gppo_clip", PARAM_SETS["beta0"], *inputs)[2]
    assert 0 < m["dead_grad_frac"]


# ----------------------------------------------------------------------------------------
# Hand-computed tables: (mode, params, ratios, advantages, per-element loss, per-element grad)
# grad is d l_i / d logp_i; the mean loss and its gradient divide by N.
# ----------------------------------------------------------------------------------------
S = 1.0 / (1.0 + math.exp(-1.0))  # sigma(1)
HAND = [
    # clip, eps 0.2: inside -> -rA, grad -rA; A>0 r>1.2 -> -1.2A flat; A<0 r<0.8 -> -0.8A flat
    ("clip", {}, [1.1, 0.9, 1.5, 0.5, 0.5, 1.5], [2, -1, 1, -1, 1, -1],
     [-2.2, 0.9, -1.2, 0.8, -0.5, 1.5], [-2.2, 0.9, 0, 0, -0.5, 1.5]),
    # dual clip c=3: A=-1, r=4 -> min(4, 3) = 3, flat
    ("clip", {"dual_clip_c": 3}, [4.0, 2.0], [-1, -1], [3.0, 2.0], [0, 2.0]),
    ("clip", {"clip_eps_low": 0.1, "clip_eps_high": 0.5}, [1.4, 0.85], [1, -2], [-1.4, 1.8], [-1.4, 0]),
    # soft clip alpha 1: coeff = min(r, 1/r); r=2 -> 0.5, r=0.5 -> 0.5
    ("soft_clip", {}, [2.0, 0.5, 1.0], [1, -2, 3], [-1.0, 0.5, -3.0], [-1.0, 0.5, -3.0]),
    ("soft_clip_alpha-2", {}, [2.0, 0.5], [1, -2], [-0.5, 0.25], [-0.5, 0.25]),
    # sapo: r=1 -> -2A/tau, grad -A; r=2, tau=1 -> -4 sigma(1) A, grad -4 s(1-s) 2 A
    ("sapo", {}, [1.0, 1.0, 2.0], [1, -1, 1], [-2.0, 2.0 / 1.05, -4 * S], [-1.0, 1.0, -8 * S * (1 - S)]),
    # ce-gppo: A<0 r<0.8 -> -0.75*0.8*A = 0.6|A|; A>0 r>1.2 -> -1.2A; gradients survive scaled
    ("ce-gppo_clip", {}, [0.5, 1.5, 1.0, 0.5], [-1, 1, 2, 1], [0.6, -1.2, -2.0, -0.5], [0.6, -1.2, -2.0, -0.5]),
    ("ce-gppo_clip", {"dual_clip_c": 2.5}, [3.0, 0.5], [-2, -2], [5.0, 1.2], [0, 1.2]),
    # cispo: w = clip(r, 0.8, 1.2); forward -wA, gradient -wA
    ("cispo", {}, [1.5, 0.5, 1.1], [1, -1, 2], [-1.2, 0.8, -2.2], [-1.2, 0.8, -2.2]),
    ("is_clip", {"is_eps_low": 0.6, "is_eps_high": 1.0}, [3.0, 0.2, 1.1], [1, 1, -1], [-2.0, -0.4, 1.1], [-2.0, -0.4, 1.1]),
    # cispo, is_eps_low >= 1: no lower IS bound (MiniMax-M1); the upper one stays at 1.2
    ("cispo", {"is_eps_low": 1.0}, [0.01, 0.5, 3.0], [1, -1, 1], [-0.01, 0.5, -1.2], [-0.01, 0.5, -1.2]),
    ("cispo", {"is_eps_low": 5.0}, [0.001, 1.5], [-2, 1], [0.002, -1.2], [0.002, -1.2]),
]


@pytest.mark.parametrize("mode,params,ratios,advs,per_elem,per_grad", HAND)
def test_policy_loss_hand_computed(mode, params, ratios, advs, per_elem, per_grad):
    logp_old = torch.full((len(ratios),), -1.5, dtype=torch.float64)
    logp = logp_old + torch.tensor(ratios, dtype=torch.float64).log()
    loss, grad, _ = run_loss(mode, params, logp, logp_old, torch.tensor(advs, dtype=torch.float64), None)
    n = len(ratios)
    assert loss.item() == pytest.approx(sum(per_elem) / n, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor(per_grad, dtype=torch.float64) / n, rtol=1e-12, atol=1e-12)


def test_metrics_hand_computed():
    # r = [1, 2] valid, 50 masked out: ess = 3^2 / (2 * 5) = 0.9, kl = (0 + 1 - ln 2) / 2
    logp_old = torch.zeros(3, dtype=torch.float64)
    logp = torch.tensor([1.0, 2.0, 50.0], dtype=torch.float64).log()
    mask = torch.tensor([True, True, False])
    adv = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    _, m = compute_policy_loss("clip", logp, logp_old, adv, mask=mask)
    assert m["ess"] == pytest.approx(0.9)
    assert m["ratio_mean"] == pytest.approx(1.5)
    assert m["ratio_max"] == pytest.approx(2.0)
    assert m["approx_kl"] == pytest.approx((1.0 - math.log(2.0)) / 2)
    assert m["clip_frac"] == pytest.approx(0.5)  # r=2 is outside [0.8, 1.2]
    assert m["dead_grad_frac"] == pytest.approx(0.5)  # and A > 0 there: flat
    # on-policy: every ratio 1
    _, m = compute_policy_loss("clip", logp_old, logp_old, adv)
    assert (m["ess"], m["ratio_mean"], m["approx_kl"], m["clip_frac"]) == (1.0, 1.0, 0.0, 0.0)


def test_sapo_saturation_metric():
    # tau=1: r=8 -> sigma(7), gate weight 4 s (1-s) = 0.0036 < 0.1 (saturated); r=1 -> weight 1
    logp_old = torch.zeros(4, dtype=torch.float64)
    logp = torch.tensor([8.0, 1.0, 1.0, 1.5], dtype=torch.float64).log()
    _, m = compute_policy_loss("sapo_gate", logp, logp_old, torch.tensor([1.0, 1.0, -1.0, 1.0], dtype=torch.float64))
    s7, s05 = 1 / (1 + math.exp(-7.0)), 1 / (1 + math.exp(-0.5))
    assert m["sapo_gate_saturation_frac"] == pytest.approx(0.25)
    assert m["sapo_gate_weight_mean"] == pytest.approx((4 * s7 * (1 - s7) + 2.0 + 4 * s05 * (1 - s05)) / 4)
    assert m["clip_frac"] == 0.0 and m["dead_grad_frac"] == 0.0


def test_soft_clip_never_clips():
    logp = torch.tensor([3.0, -3.0, 0.1], dtype=torch.float64)
    _, m = compute_policy_loss("soft_clip", logp, torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))
    assert m["clip_frac"] == 0.0 and m["dead_grad_frac"] == 0.0
    assert m["soft_clip_coeff_mean"] == pytest.approx((math.exp(-3.0) * 2 + math.exp(-0.1)) / 3)


def test_all_masked_out_is_finite():
    logp = torch.zeros(3, requires_grad=True)
    loss, m = compute_policy_loss("clip", logp, torch.zeros(3), torch.ones(3), mask=torch.zeros(3, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logp.grad, torch.zeros(3))
    assert all(math.isfinite(v) for v in m.values())


# ----------------------------------------------------------------------------------------
# Modes, aliases and errors
# ----------------------------------------------------------------------------------------
def test_registry_lists_every_mode_and_alias():
    assert set(policy_loss_modes()) == ALL_MODES


@pytest.mark.parametrize("alias,canonical,params", [
    ("soft_clip_alpha-1", "soft_clip", {"soft_clip_alpha": 1.0}),
    ("soft_clip_alpha-2", "soft_clip", {"soft_clip_alpha": 2.0}),
    ("sapo_soft_clip", "sapo", {"tau_pos": 2.0}),
    ("sapo_gate", "sapo", {}),
    ("cispo_clip", "cispo", {"is_eps_high": 1.0}),
    ("is_clip", "cispo", {}),
    ("is_weight_clip", "cispo", {"is_eps_low": 0.5}),
])
def test_alias_equals_canonical(alias, canonical, params):
    logp, logp_old, adv, mask = make_case((5, 4), (5, 1), torch.float64, masked=True, seed=3)
    alias_params = {k: v for k, v in params.items() if k not in MODES[alias][1]}
    a_loss, a_grad, a_m = run_loss(alias, alias_params, logp, logp_old, adv, mask)
    c_loss, c_grad, c_m = run_loss(canonical, params, logp, logp_old, adv, mask)
    assert a_loss.item() == c_loss.item() and torch.equal(a_grad, c_grad) and a_m == c_m


def test_unknown_mode_lists_every_mode_and_alias():
    with pytest.raises(ConfigError) as exc:
        compute_policy_loss("ppo_clipp", torch.zeros(2), torch.zeros(2), torch.ones(2))
    msg = str(exc.value)
    assert "'ppo_clipp'" in msg
    for mode in ALL_MODES:
        assert mode in msg


@pytest.mark.parametrize("params,key", [
    ({"clip_epsilon": 0.2}, "clip_epsilon"),  # unknown key
    ({"clip_eps": "0.2"}, "clip_eps"),  # wrong type
    ({"clip_eps": True}, "clip_eps"),
    ({"clip_eps": 1.5}, "clip_eps"),  # out of range
    ({"clip_eps_low": 0.0}, "clip_eps_low"),
    ({"dual_clip_c": 0.5}, "dual_clip_c"),
    ({"tau_pos": 0.0}, "tau_pos"),
    ({"tau_neg": -1.0}, "tau_neg"),
    ({"soft_clip_alpha": -1.0}, "soft_clip_alpha"),
    ({"beta1": -0.1}, "beta1"),
    ({"is_eps_low": -0.1}, "is_eps_low"),
    ({"ratio_level": "tokens"}, "ratio_level"),
    ({"score": "ratio"}, "score"),
    ({"weight_mode": "both"}, "weight_mode"),
    ({"is_eps_high": [1.0]}, "is_eps_high"),
])
def test_bad_params_name_key_and_list_valid_keys(params, key):
    with pytest.raises(ConfigError) as exc:
        compute_policy_loss("clip", torch.zeros(2), torch.zeros(2), torch.ones(2), params=params)
    msg = str(exc.value)
    assert f"'{key}'" in msg
    for valid in PARAM_KEYS:
        assert valid in msg
    assert "\n" not in msg


@pytest.mark.parametrize("mode", sorted(ALL_MODES - DUAL_MODES))
def test_dual_clip_refused_where_it_does_not_apply(mode):
    with pytest.raises(ConfigError) as exc:
        resolve_policy_loss_params(mode, {"dual_clip_c": 3.0})
    msg = str(exc.value)
    assert "dual_clip_c" in msg and f"'{mode}'" in msg
    assert "clip" in msg and "ce-gppo_clip" in msg


@pytest.mark.parametrize("alias,alpha", [("soft_clip_alpha-1", 2.0), ("soft_clip_alpha-2", 1.0), ("soft_clip_alpha-2", "2")])
def test_alias_conflicting_alpha_refused(alias, alpha):
    with pytest.raises(ConfigError) as exc:
        resolve_policy_loss_params(alias, {"soft_clip_alpha": alpha})
    assert "soft_clip_alpha" in str(exc.value) and alias in str(exc.value)


def test_params_defaults_and_accepted_forms():
    p = resolve_policy_loss_params("clip", None)
    assert (p.clip_eps, p.eps_low, p.eps_high, p.dual_clip_c) == (0.2, 0.2, 0.2, None)
    assert (p.soft_clip_alpha, p.tau_pos, p.tau_neg, p.beta1, p.beta2) == (1.0, 1.0, 1.05, 0.75, 1.0)
    assert (p.is_low, p.is_high) == (0.2, 0.2)
    p = resolve_policy_loss_params("cispo", {"clip_eps_low": 0.1, "clip_eps_high": 0.3})
    assert (p.is_low, p.is_high) == (0.1, 0.3)
    assert resolve_policy_loss_params("clip", {"dual_clip_c": 3}).dual_clip_c == 3.0  # ints are fine
    assert resolve_policy_loss_params("soft_clip_alpha-2", {}).soft_clip_alpha == 2.0
    assert resolve_policy_loss_params("soft_clip_alpha-2", {"soft_clip_alpha": 2}).soft_clip_alpha == 2.0
    # a PolicyLossParams object works like the dict it came from
    logp, logp_old, adv, _ = make_case((6,), (6,), torch.float64, masked=False)
    obj = PolicyLossParams(clip_eps=0.3)
    assert compute_policy_loss("clip", logp, logp_old, adv, params=obj)[0].item() == pytest.approx(
        compute_policy_loss("clip", logp, logp_old, adv, params={"clip_eps": 0.3})[0].item(), abs=0
    )


@pytest.mark.parametrize("adv_shape,mask_shape", [((4, 2), None), ((4, 3, 1), None), ((4, 1), (4,))])
def test_shape_errors(adv_shape, mask_shape):
    mask = None if mask_shape is None else torch.ones(mask_shape, dtype=torch.bool)
    with pytest.raises(ValueError, match="shape"):
        compute_policy_loss("clip", torch.zeros(4, 3), torch.zeros(4, 3), torch.ones(adv_shape), mask=mask)
