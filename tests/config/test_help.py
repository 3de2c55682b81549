"""Help that helps: TRL's flag names answered with this project's, the docs' TRL table equal to the code's,
``--help`` defaults equal to what the run uses, and help text on every flag of every launch script."""
import argparse
import re
import runpy
import sys
from pathlib import Path

import pytest

from async_rl.config import load_config
from async_rl.config.loader import build_arg_parser
from async_rl.config.trl_names import TRL_NAMES, markdown_table
from async_rl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
LM = str(ROOT / "configs" / "lm_arithmetic.yaml")
sys.path.insert(0, str(ROOT / "launch"))
from ds_lm_grpo import SHORTHANDS, expand_shorthands  # noqa: E402


def _flags() -> set[str]:
    parser = build_arg_parser("")
    return {opt for action in parser._actions for opt in action.option_strings}


def test_every_trl_name_points_to_a_flag_that_exists():
    flags = _flags() | {f"--{flag.replace('_', '-')}" for flag in SHORTHANDS}  # ds_lm_grpo's --data, --reward
    assert len(TRL_NAMES) >= 30 and len({e.trl for e in TRL_NAMES}) == len(TRL_NAMES)
    for entry in TRL_NAMES:
        assert entry.flag is None or entry.flag in flags, entry
        assert entry.note and not set("|()") & set(entry.note), entry  # a table cell; the error line's parentheses


def test_trl_clip_params_are_clip_params():
    from async_rl.algo.losses import PolicyLossParams

    for entry in TRL_NAMES:
        if entry.flag == "--clip-params":
            assert re.match(r"'\{(\w+):", entry.note)[1] in PolicyLossParams.model_fields, entry


@pytest.mark.parametrize("argv, line", [
    (["--num-generations", "8"], "--num-generations is TRL's name: use --group-size (completions per prompt)"),
    (["--num_generations=8"], "--num_generations is TRL's name: use --group-size (completions per prompt)"),
    (["--beta", "0.04"], "--beta is TRL's name: use --kl-ref-coef"),
    (["--learning-rate", "1e-5"], "--learning-rate is TRL's name: use --lr-policy"),
    (["--max-completion-length", "256"], "--max-completion-length is TRL's name: use --policy.max-new-tokens"),
    (["--use-vllm"], "--use-vllm is TRL's name: use --policy.generation-engine (vllm: "),
    (["--group_size", "8"], "--group_size: flags are written with dashes; use --group-size"),
    (["--lora_alpha", "8"], "--lora_alpha: flags are written with dashes; use --lora-alpha"),
    (["--policy.max_new_tokens", "8"], "--policy.max_new_tokens: flags are written with dashes; use --policy.max-new-tokens"),
])
def test_trl_names_and_underscores_get_the_flag_to_use(argv, line):
    with pytest.raises(ConfigError) as err:
        load_config(argv, LM)
    assert str(err.value).startswith(line)
    assert "did you mean" not in str(err.value)


def test_other_unknown_flags_still_get_the_nearest_one():
    with pytest.raises(ConfigError, match=r"unknown flag '--group-sise' \(did you mean '--group-size'\?\)"):
        load_config(["--group-sise", "8"], LM)


def test_the_launch_refuses_a_trl_name_in_one_line_before_ray(tmp_path):
    import subprocess

    proc = subprocess.run([sys.executable, str(ROOT / "launch" / "ds_lm_grpo.py"), "--num-generations", "4"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == "error: --num-generations is TRL's name: use --group-size (completions per prompt)\n"
    assert list(tmp_path.iterdir()) == []


def test_the_docs_table_is_the_code_table():
    docs = (ROOT / "docs" / "language_models.md").read_text()
    assert markdown_table() in docs


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as done:
        load_config(argv, LM)
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps the help text


def test_help_defaults_are_those_of_the_variant_the_data_chooses(tmp_path, capsys):
    arithmetic = _help(["--help"], capsys)
    assert "max_new_tokens: 24" in arithmetic and "(default: runs/lm_arithmetic)" in arithmetic
    data = _help(expand_shorthands(["--data", str(tmp_path / "train.jsonl"), "--help"]), capsys)
    assert "max_new_tokens: 48" in data and "max_new_tokens: 24" not in data
    assert "(default: runs/lm_prompts)" in data and "(default: prompts)" in data
    assert "Defaults are those of lm_arithmetic.yaml, lm_arithmetic.yaml's env prompts variant, the flags given" in data
    # flags given are what the run uses, so help shows them too
    assert "(default: 3)" in _help(["--group-size", "3", "-h"], capsys)


def test_help_defaults_follow_a_config_file(tmp_path, capsys):
    (tmp_path / "mine.yaml").write_text("lr_policy: 5.0e-06\nenv: humaneval\n")
    out = _help(["--config", str(tmp_path / "mine.yaml"), "--help"], capsys)
    assert "the policy's peak learning rate (default: 5.0e-06)" in out
    assert "(default: runs/lm_humaneval)" in out  # the humaneval variant of lm_arithmetic.yaml


def _launch_parser(script: Path, monkeypatch) -> argparse.ArgumentParser:
    """The parser that answers ``script --help``."""
    shown = []

    def record(parser, file=None):
        shown.append(parser)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "print_help", record)
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit):
        runpy.run_path(str(script), run_name="__main__")
    assert shown, f"{script.name} --help printed nothing"
    return shown[-1]


LAUNCHES = sorted(p.name for p in (ROOT / "launch").glob("*.py"))


@pytest.mark.parametrize("script", LAUNCHES)
def test_every_flag_of_every_launch_has_help(script, monkeypatch):
    parser = _launch_parser(ROOT / "launch" / script, monkeypatch)
    bare = [action.option_strings[0] for action in parser._actions
            if not re.sub(r"\(default: .*\)$", "", action.help or "", flags=re.S).strip()]
    assert bare == [], f"{script}: flags without help"


def test_max_epochs_says_what_an_epoch_is(capsys):
    out = _help(["--help"], capsys)
    text = out[out.index("--max-epochs MAX_EPOCHS"):]
    assert "one optimiser step" in text[:600] and "super_batch_size" in text[:600]
