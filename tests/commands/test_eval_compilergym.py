"""launch/eval_compilergym.py: bad input is one line and exit code 2 before anything starts; a
checkpoint (written as trainers write one) is loaded in process and searched with on real programs."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from envs.compilergym.client import compilergym_unavailable_reason
from envs.compilergym.programs import BUNDLED_PROGRAMS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "launch" / "eval_compilergym.py"
UNAVAILABLE = compilergym_unavailable_reason()
ENV_KWARGS = {"mode": "per_step", "max_steps": 4, "train_seeds": [0, 1], "eval_seeds": [1000000, 1]}


def _servers() -> set[int]:
    return {p.pid for p in psutil.process_iter(["cmdline"]) if any("_compilergym_server" in a for a in p.info["cmdline"] or [])}


def _write_checkpoint(run_dir: Path, env: str = "compilergym", model=None) -> Path:
    """<run_dir>/checkpoints/epoch-000003 with meta.json (the run's config) and model.safetensors."""
    from async_rl import checkpoint as ckpt

    path = run_dir / "checkpoints" / "epoch-000003"
    path.mkdir(parents=True)
    if model is not None:
        ckpt.save_model(model, path)
    config = {"env": env, "env_kwargs": ENV_KWARGS, "policy": "mlp", "policy_kwargs": {"hidden_sizes": [16]}}
    (path / ckpt.META).write_text(json.dumps({"format": ckpt.FORMAT, "epoch": 3, "config": config}))
    return path


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_bad_input_is_one_line_and_exit_code_2_before_anything_starts(tmp_path, capsys):
    from launch.eval_compilergym import main

    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "progs").mkdir()
    (tmp_path / "progs" / "a.c").write_text("int main(void){return 0;}\n")
    _write_checkpoint(tmp_path / "run")
    _write_checkpoint(tmp_path / "metaworld_run", env="metaworld")
    good = ["--checkpoint", str(tmp_path / "run"), "--benchmark-dir", str(tmp_path / "progs"), "--search", "beam-2",
            "--budget", "10", "--out", str(tmp_path / "out.json")]

    def swap(flag: str, value: str) -> list[str]:
        args = list(good)
        args[args.index(flag) + 1] = value
        return args

    cases = [
        (swap("--checkpoint", str(tmp_path / "missing")), "--checkpoint .*missing: no such directory"),
        (swap("--checkpoint", str(empty)), "no checkpoint there"),
        (swap("--checkpoint", str(tmp_path / "metaworld_run")), "env 'metaworld', not compilergym"),
        (swap("--benchmark-dir", str(empty)), "--benchmark-dir .*empty: holds no .c/.cpp/.bc files \\(nor .cc/.ll\\); pass a folder of them"),
        (swap("--benchmark-dir", str(tmp_path / "nope")), "--benchmark-dir .*nope: no such directory"),
        (swap("--search", "beam"), "--search 'beam' is not a search; valid: greedy, best-of-K or beam-K"),
        (swap("--search", "none"), "--search 'none' is not a search"),
        (swap("--budget", "0"), "--budget must be a positive number"),
        (swap("--out", str(tmp_path / "no" / "out.json")), "--out .*: no directory"),
        (good, "no model.safetensors"),  # the run's checkpoint holds no weights
    ]
    before = _servers()
    for args, message in cases:
        code = main(args)
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(lines) == 1, (args, lines)
        assert lines[0].startswith("error: ") and re.search(message, lines[0]), (message, lines[0])
        assert not (tmp_path / "out.json").exists()
    assert not _servers() - before  # no compiler was started for any of them
    # As a command: the exit code is the process's.
    done = _run(*swap("--search", "best-of-x"))
    assert done.returncode == 2 and done.stderr.strip().splitlines() == ["error: --search 'best-of-x' is not a search; "
                                                                        "valid: greedy, best-of-K or beam-K (K >= 1, "
                                                                        "e.g. best-of-16, beam-4)"]


def test_the_benchmarks_searches_are_checked_by_the_same_validator_one_line_exit_2(capsys):
    """benchmarks/bench_compilergym.py: a bad --searches entry, before any run or compiler starts."""
    from benchmarks.bench_compilergym import main

    assert main(["--checkpoint", "runs/none", "--searches", "greedy,beam-{beam}", "--beam-width", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --searches entry 'beam-0' is not a search; valid: greedy, best-of-K or beam-K (K >= 1, e.g. best-of-16, "
        "beam-4)"]


def test_a_server_failure_during_the_search_is_one_line_exit_1_and_nothing_written(tmp_path, capsys, monkeypatch):
    import launch.eval_compilergym as cli
    from envs.compilergym.client import CompilerGymServerError

    def server_dies(*args, **kwargs):
        raise CompilerGymServerError("the CompilerGym server exited (code -9) while applying -sroa")

    monkeypatch.setattr(cli, "check_args", lambda args: (tmp_path, {}, None, None))
    monkeypatch.setattr(cli, "evaluate", server_dies)
    out = tmp_path / "out.json"
    code = cli.main(["--checkpoint", str(tmp_path), "--benchmark-dir", str(tmp_path), "--search", "greedy",
                     "--budget", "5", "--out", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and lines == ["error: the CompilerGym server failed during the search, nothing written: the "
                                   "CompilerGym server exited (code -9) while applying -sroa"]
    assert not out.exists()


@pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))
def test_a_checkpoint_is_searched_with_on_a_folder_and_the_results_written(tmp_path):
    import torch

    from async_rl.policies import build_policy
    from envs import make_task_set

    task_set = make_task_set("compilergym", **ENV_KWARGS)
    torch.manual_seed(0)
    model = build_policy("mlp", dict(task_set.obs_spec), task_set.action_dim, hidden_sizes=[16])
    with torch.no_grad():  # weights far from a fresh build's, so loading them is visible in the actions
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    _write_checkpoint(tmp_path / "run", model=model)
    progs = tmp_path / "progs"
    progs.mkdir()
    shutil.copy(BUNDLED_PROGRAMS / "gcd_lcm.c", progs / "gcd_lcm.c")
    out = tmp_path / "eval.json"

    from async_rl.checkpoint import resolve_checkpoint
    from launch.eval_compilergym import load_policy, main, read_run_config

    checkpoint = resolve_checkpoint(str(tmp_path / "run"))  # a run dir: its newest checkpoint
    _, loaded, _ = load_policy(checkpoint, read_run_config(checkpoint), str(progs))
    for (name, saved), (_, got) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(saved, got), name

    assert main(["--checkpoint", str(tmp_path / "run"), "--benchmark-dir", str(progs), "--search", "best-of-2",
                 "--budget", "6", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["search"] == "best-of-2" and result["budget"] == 6 and result["epoch"] == 3
    [row] = result["rows"]
    assert row["program"] == "gcd_lcm" and row["benchmark"] == f"file://{progs / 'gcd_lcm.c'}"
    # Two sampled episodes of at most 4 passes, cut at 6 compilations; random search as many.
    assert row["compilations"] == row["random_compilations"] == 6
    assert row["count"] <= row["o0_count"] and row["vs_oz"] == pytest.approx(row["oz_count"] / row["count"])
    assert len(row["passes"]) <= 4
    assert result["geomean_vs_oz"] == pytest.approx(row["vs_oz"])
    assert result["random_search_geomean_vs_oz"] == pytest.approx(row["random_vs_oz"])
