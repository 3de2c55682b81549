"""CompilerGym episode ends at the pass budget (``time_limit``) and the no-op penalty, on the real server."""
from contextlib import closing

import numpy as np
import pytest

from async_rl.errors import ConfigError
from envs import make_task_set
from envs.compilergym.client import compilergym_unavailable_reason
from envs.compilergym.programs import BUNDLED_PROGRAMS as ROOT_PROGRAMS

UNAVAILABLE = compilergym_unavailable_reason()
needs_server = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))


@needs_server
@pytest.mark.parametrize("bad, match", [
    ({"time_limit": "bootstrap"}, "option 'time_limit' = 'bootstrap': Input should be 'terminal' or 'truncate'"),
    ({"noop_penalty": -0.1}, "option 'noop_penalty' = -0.1: Input should be greater than or equal to 0"),
    ({"noop_penalty": True}, "option 'noop_penalty' = True: Input should be less than 1"),
    ({"success_vs_oz": 0}, "option 'success_vs_oz' = 0: Input should be greater than 0")])
def test_bad_time_limit_or_noop_penalty_is_one_config_error(bad, match):
    with pytest.raises(ConfigError) as err:
        make_task_set("compilergym", **bad)
    assert match in str(err.value) and "\n" not in str(err.value)


@needs_server
def test_truncate_mode_and_noop_penalty():
    """``time_limit: truncate`` reports the budget as a cut (bootstrapped by the worker); a pass that
    leaves the count unchanged costs ``noop_penalty``, and the return still sums the step rewards."""
    ts = make_task_set("compilergym", mode="per_step", max_steps=3, train_seeds=[1000002, 1], eval_seeds=[0, 1],
                       time_limit="truncate", noop_penalty=0.05, success_vs_oz=0.5)
    mem2reg, instcombine = ts.flags.index("-mem2reg"), ts.flags.index("-instcombine")
    with closing(ts.make_env(0, seed=0)) as env:
        env.reset()
        c0, oz = env.program["o0_count"], env.program["oz_count"]
        total, count = 0.0, c0
        for t, action in enumerate([mem2reg, mem2reg, instcombine]):
            _, reward, terminated, truncated, info = env.step(np.array([action]))
            total += reward
            changed = info["ir_count"] != count
            assert info["noop"] == (not changed) and (t != 1 or info["noop"])  # mem2reg twice: the second does nothing
            assert reward == pytest.approx((count - info["ir_count"]) / (c0 - oz) - (0.0 if changed else 0.05))
            assert not terminated and truncated == (t == 2)
            assert info["success"] == (oz / info["ir_count"] >= 0.5)  # the label's threshold, not -Oz itself
            count = info["ir_count"]
        assert info["end_reason"] == "max_steps"
        assert total == pytest.approx(ts.reward.reduction(c0, count, oz) - 0.05)


@needs_server
def test_mask_noops_rules_out_passes_that_did_nothing_and_the_policy_never_picks_them():
    import torch

    from async_rl.policies import build_policy, build_preprocessor

    ts = make_task_set("compilergym", mode="per_step", max_steps=4, train_seeds=[1000002, 1], eval_seeds=[0, 1],
                       mask_noops=True)
    assert ts.obs_spec["action_mask"] is True
    mem2reg, instcombine = ts.flags.index("-mem2reg"), ts.flags.index("-instcombine")
    model = build_policy("mlp", ts.obs_spec, ts.action_dim, hidden_sizes=[16])
    preprocess = build_preprocessor("mlp", ts.obs_spec)
    with closing(ts.make_env(0, seed=0)) as env:
        obs = env.reset()
        assert obs["action_mask"].all()
        obs, *_, info = env.step(np.array([mem2reg]))  # shrinks the program: nothing is ruled out
        assert not info["noop"] and obs["action_mask"].all()
        obs, *_, info = env.step(np.array([mem2reg]))  # again: does nothing, so it is ruled out
        assert info["noop"] and not obs["action_mask"][mem2reg] and obs["action_mask"].sum() == len(ts.flags) - 1
        x = torch.stack([preprocess(obs, "compilergym")] * 64)
        # Push the policy towards the ruled-out pass: it still never samples nor picks it.
        with torch.no_grad():
            model.policy_net[-1].bias[mem2reg] = 50.0
        out = model.act(x, torch.tensor([False] * 63 + [True]))
        assert (out["action"] != mem2reg).all()
        logp, entropy, _ = model.evaluate(x, torch.full((64, 1), mem2reg))
        assert (logp < -1e6).all() and torch.isfinite(entropy).all()
        obs, *_, info = env.step(np.array([instcombine]))  # the program changes: everything is allowed again
        assert not info["noop"] and obs["action_mask"].all()


@needs_server
def test_eval_command_mask_noops_moves_greedy_past_a_pass_that_did_nothing(tmp_path):
    """A policy whose first choice does nothing to the program: greedy repeats it without the mask
    (the program stays at -O0) and moves on to its second choice with ``--mask-noops``."""
    import json

    import torch

    from async_rl import checkpoint as ckpt
    from async_rl.policies import build_policy
    from launch.eval_compilergym import main

    env_kwargs = {"mode": "per_step", "max_steps": 4, "train_seeds": [0, 1], "eval_seeds": [1000000, 1]}
    ts = make_task_set("compilergym", **env_kwargs)
    model = build_policy("mlp", ts.obs_spec, ts.action_dim, hidden_sizes=[16])
    with torch.no_grad():
        model.policy_net[-1].bias[ts.flags.index("-constmerge")] = 50.0  # nothing to merge in -O0 code
        model.policy_net[-1].bias[ts.flags.index("-mem2reg")] = 40.0
    path = tmp_path / "run" / "checkpoints" / "epoch-000001"
    path.mkdir(parents=True)
    ckpt.save_model(model, path)
    config = {"env": "compilergym", "env_kwargs": env_kwargs, "policy": "mlp", "policy_kwargs": {"hidden_sizes": [16]}}
    (path / ckpt.META).write_text(json.dumps({"format": ckpt.FORMAT, "epoch": 1, "config": config}))
    progs = tmp_path / "progs"
    progs.mkdir()
    (progs / "gcd.c").write_text((ROOT_PROGRAMS / "gcd_lcm.c").read_text())
    results = {}
    for mask in (False, True):
        out = tmp_path / f"out_{mask}.json"
        args = ["--checkpoint", str(tmp_path / "run"), "--benchmark-dir", str(progs), "--search", "greedy",
                "--budget", "4", "--out", str(out)]
        assert main(args + (["--mask-noops"] if mask else [])) == 0
        results[mask] = json.loads(out.read_text())
    plain, masked = results[False], results[True]
    assert (plain["mask_noops"], masked["mask_noops"]) == (False, True)
    row, mrow = plain["rows"][0], masked["rows"][0]
    assert row["count"] == row["o0_count"] and row["passes"] == []  # -constmerge four times: nothing changed
    assert mrow["count"] < mrow["o0_count"] and mrow["passes"][:2] == ["-constmerge", "-mem2reg"]
