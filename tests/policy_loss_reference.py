"""Reference policy losses for tests/algo/test_algo_losses.py and tests/test_algo_loss_config.py: per element
(r, A) -> (loss, d loss / d logp, clipped?, extra diagnostics), written here from the specification in
float64 Python (never from the code under test), and the cases they are compared on."""
from __future__ import annotations

import math

import torch

from async_rl.algo import compute_policy_loss

ALL_MODES = {
    "clip",
    "soft_clip",
    "soft_clip_alpha-1",
    "soft_clip_alpha-2",
    "sapo",
    "sapo_soft_clip",
    "sapo_gate",
    "ce-gppo_clip",
    "cispo",
    "cispo_clip",
    "is_clip",
    "is_weight_clip",
    "pacs",
}
PARAM_KEYS = [
    "clip_eps",
    "clip_eps_low",
    "clip_eps_high",
    "dual_clip_c",
    "soft_clip_alpha",
    "tau_pos",
    "tau_neg",
    "beta1",
    "beta2",
    "is_eps_low",
    "is_eps_high",
    "ratio_level",
    "beta",
    "score",
    "score_against",
    "adv_estimator",
    "use_weight",
    "weight_mode",
]


# ----------------------------------------------------------------------------------------
# Reference: per element (r, A) -> (loss ell, d ell / d logp, clipped?, extra diagnostics)
# ----------------------------------------------------------------------------------------
def _params(p: dict) -> dict:
    eps = p.get("clip_eps", 0.2)
    lo = p.get("clip_eps_low", eps)
    hi = p.get("clip_eps_high", eps)
    return {
        "lo": 1.0 - lo,
        "hi": 1.0 + hi,
        "c": p.get("dual_clip_c"),
        "alpha": p.get("soft_clip_alpha", 1.0),
        "tau_pos": p.get("tau_pos", 1.0),
        "tau_neg": p.get("tau_neg", 1.05),
        "beta1": p.get("beta1", 0.75),
        "beta2": p.get("beta2", 1.0),
        "is_lo": 1.0 - p.get("is_eps_low", lo),
        "is_hi": 1.0 + p.get("is_eps_high", hi),
    }


def _dual(ell, g, clipped, A, c):
    if c is not None and A < 0 and ell > -c * A:
        return -c * A, 0.0, True
    return ell, g, clipped


def ref_clip(r, A, q):
    # Pessimistic PPO bound written per advantage sign: A >= 0 caps r at hi, A < 0 floors it at lo.
    if A >= 0:
        ell, g = -A * min(r, q["hi"]), (-A * r if r < q["hi"] else 0.0)
    else:
        ell, g = -A * max(r, q["lo"]), (-A * r if r > q["lo"] else 0.0)
    ell, g, clipped = _dual(ell, g, not (q["lo"] <= r <= q["hi"]), A, q["c"])
    return ell, g, clipped, {}


def ref_soft_clip(r, A, q):
    coeff = min(r, 1.0 / r) ** q["alpha"]
    return -r * A * coeff, -r * A * coeff, False, {"soft_clip_coeff_mean": coeff}


def ref_sapo(r, A, q):
    tau = q["tau_pos"] if A > 0 else q["tau_neg"]
    s = 1.0 / (1.0 + math.exp(-tau * (r - 1.0)))
    weight = 4.0 * s * (1.0 - s)
    extra = {"sapo_gate_weight_mean": weight, "sapo_gate_saturation_frac": float(weight < 0.1)}
    # d/dlogp of -(4/tau) s(tau (r-1)) A = -(4/tau) s (1-s) tau r A
    return -(4.0 / tau) * s * A, -weight * r * A, False, extra


def ref_ce_gppo(r, A, q):
    if A < 0 and r < q["lo"]:
        ell, g, clipped = -q["beta1"] * q["lo"] * A, -q["beta1"] * q["lo"] * A, True
    elif A > 0 and r > q["hi"]:
        ell, g, clipped = -q["beta2"] * q["hi"] * A, -q["beta2"] * q["hi"] * A, True
    else:
        ell, g, clipped = -r * A, -r * A, False
    ell, g, clipped = _dual(ell, g, clipped, A, q["c"])
    return ell, g, clipped, {}


def ref_cispo(r, A, q):
    w = min(max(r, q["is_lo"]), q["is_hi"])
    return -w * A, -w * A, not (q["is_lo"] <= r <= q["is_hi"]), {}


# alias -> (reference, params the alias fixes)
MODES = {
    "clip": (ref_clip, {}),
    "soft_clip": (ref_soft_clip, {}),
    "soft_clip_alpha-1": (ref_soft_clip, {"soft_clip_alpha": 1.0}),
    "soft_clip_alpha-2": (ref_soft_clip, {"soft_clip_alpha": 2.0}),
    "sapo": (ref_sapo, {}),
    "sapo_soft_clip": (ref_sapo, {}),
    "sapo_gate": (ref_sapo, {}),
    "ce-gppo_clip": (ref_ce_gppo, {}),
    "cispo": (ref_cispo, {}),
    "cispo_clip": (ref_cispo, {}),
    "is_clip": (ref_cispo, {}),
    "is_weight_clip": (ref_cispo, {}),
}
DUAL_MODES = {"clip", "ce-gppo_clip"}
EXTRA_KEYS = {
    ref_soft_clip: {"soft_clip_coeff_mean"},
    ref_sapo: {"sapo_gate_weight_mean", "sapo_gate_saturation_frac"},
}

# Parameter sets per canonical mode; the ratio grid below keeps every ratio >= 5% away from
# every bound. Aliases are checked with their own fixed params and against their canonical mode.
PARAM_SETS = {
    "default": {},
    "eps0.3": {"clip_eps": 0.3},
    "asym": {"clip_eps_low": 0.1, "clip_eps_high": 0.28},
    "dual": {"dual_clip_c": 3.0},
    "asym_dual": {"clip_eps_low": 0.3, "clip_eps_high": 0.1, "dual_clip_c": 2},
    "beta": {"beta1": 0.5, "beta2": 0.9},
    "beta0": {"beta1": 0.0, "beta2": 0.0},
    "tau": {"tau_pos": 2.0, "tau_neg": 0.5},
    "alpha0.5": {"soft_clip_alpha": 0.5},
    "alpha0": {"soft_clip_alpha": 0},
    "is_eps": {"is_eps_low": 0.5, "is_eps_high": 2.0},
    "is_no_low": {"is_eps_low": 1.5},  # 1 - is_eps_low < 0: no lower IS bound
}
MODE_PARAM_SETS = {
    "clip": ["default", "eps0.3", "asym", "dual", "asym_dual"],
    "ce-gppo_clip": ["default", "eps0.3", "asym", "dual", "asym_dual", "beta", "beta0"],
    "soft_clip": ["default", "alpha0.5", "alpha0"],
    "sapo": ["default", "tau"],
    "cispo": ["default", "asym", "is_eps", "is_no_low"],
}
RATIOS = [0.3, 0.6, 0.95, 1.05, 1.5, 4.0, 8.0]
ADVS = [1.3, -0.7, 2.0, -1.9, 0.4, -0.25, 1.1, -3.0, 0.6]


def make_case(shape, adv_shape, dtype, masked, seed=0):
    """logp, logp_old, advantages, mask with ratios from RATIOS (masked-out ones extreme)."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    ratios = torch.tensor([RATIOS[(3 * i) % len(RATIOS)] for i in range(n)], dtype=torch.float64)
    logp_old = -torch.rand(n, generator=g, dtype=torch.float64) * 2.0 - 0.1
    mask = None
    if masked:
        mask = torch.tensor([(i % 3) != 1 for i in range(n)]).reshape(shape)
        ratios = torch.where(mask.reshape(-1), ratios, torch.tensor(50.0, dtype=torch.float64))
    logp = logp_old + ratios.log()
    m = math.prod(adv_shape)
    adv = torch.tensor([ADVS[(i * 5 + 1) % len(ADVS)] for i in range(m)], dtype=torch.float64)
    return (
        logp.reshape(shape).to(dtype),
        logp_old.reshape(shape).to(dtype),
        adv.reshape(adv_shape).to(dtype),
        mask,
    )


def reference(mode, params, logp, logp_old, adv, mask):
    """Expected loss, d loss / d logp, and metrics from the float64 value of the inputs."""
    ref, fixed = MODES[mode]
    q = _params({**params, **fixed})
    lp, lpo = logp.double(), logp_old.double()
    r_all = torch.exp(lp - lpo).reshape(-1).tolist()
    a_all = adv.double().expand(logp.shape).reshape(-1).tolist()
    valid = [True] * len(r_all) if mask is None else mask.reshape(-1).tolist()
    n = sum(valid)
    grads, loss, rows = [], 0.0, []
    for r, A, v in zip(r_all, a_all, valid):
        ell, g, clipped, extra = ref(r, A, q)
        grads.append(g / n if v else 0.0)
        if v:
            loss += ell / n
            rows.append((r, g, clipped, extra))
    rs = [row[0] for row in rows]
    metrics = {
        "clip_frac": sum(row[2] for row in rows) / n,
        "dead_grad_frac": sum(row[1] == 0.0 for row in rows) / n,
        "ess": sum(rs) ** 2 / (n * sum(r * r for r in rs)),
        "ratio_mean": sum(rs) / n,
        "ratio_max": max(rs),
        "ratio_min": min(rs),
        "approx_kl": sum((r - 1.0) - math.log(r) for r in rs) / n,
    }
    for key in EXTRA_KEYS.get(ref, ()):
        metrics[key] = sum(row[3][key] for row in rows) / n
    return loss, torch.tensor(grads, dtype=torch.float64).reshape(logp.shape), metrics


def run_loss(mode, params, logp, logp_old, adv, mask):
    logp = logp.clone().requires_grad_(True)
    logp_old = logp_old.clone().requires_grad_(True)
    adv = adv.clone().requires_grad_(True)
    loss, metrics = compute_policy_loss(mode, logp, logp_old, adv, mask=mask, params=params)
    loss.backward()
    # gradients flow through logp only
    assert logp_old.grad is None and adv.grad is None
    return loss, logp.grad, metrics


def reference_per_action(mode, params, logp, logp_old, adv, mask, level):
    ref, fixed = MODES[mode]
    q = _params({**params, **fixed})
    lr = (logp.double() - logp_old.double()).tolist()
    valid = [[True] * len(lr[0])] * len(lr) if mask is None else mask.tolist()
    rows = [b for b in range(len(lr)) if any(valid[b])]
    n = len(rows)
    grad = [[0.0] * len(lr[0]) for _ in lr]
    loss, ratios, clipped = 0.0, [], 0
    for b in rows:
        elems = [j for j, v in enumerate(valid[b]) if v]
        per = 1 if level == "sequence" else len(elems)  # d log R / d logp_j: 1 (sum) or 1/len (mean)
        r = math.exp(sum(lr[b][j] for j in elems) / per)
        ell, g, c, _ = ref(r, adv[b, 0].item(), q)
        loss += ell / n
        for j in elems:
            grad[b][j] = g / per / n
        ratios.append(r)
        clipped += c
    metrics = {"clip_frac": clipped / n, "ratio_mean": sum(ratios) / n, "ratio_max": max(ratios),
               "approx_kl": sum(r - 1.0 - math.log(r) for r in ratios) / n}
    return loss, torch.tensor(grad, dtype=torch.float64), metrics
