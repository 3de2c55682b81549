"""A command line argparse refuses (a missing value, an unknown choice, two exclusive flags, no argument at
all) is one line on stderr and exit code 2 in every command, as the project's other bad input is: argparse's
usage block would come first and bury it."""
import importlib.util
from pathlib import Path

import pytest

from async_rl import report
from async_rl.config import load_config
from async_rl.demos import cli as demos_cli
from async_rl.sandbox import _main as sandbox_main
from benchmarks import common as bench_common

ROOT = Path(__file__).resolve().parents[2]


def _launch(name: str):
    spec = importlib.util.spec_from_file_location(f"command_line_{name}", ROOT / "launch" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = {
    "launch": (lambda: load_config(["--max-epochs"], str(ROOT / "configs" / "metaworld_mt1_ppo.yaml")),
               "argument --max-epochs: expected one argument"),
    "eval_lm": (lambda: _launch("eval_lm").parse_args(["--checkpoint", "a", "--model-path", "b", "--problems", "p",
                                                        "--out", "o"]),
                "argument --model-path: not allowed with argument --checkpoint"),
    "export_lm": (lambda: _launch("export_lm").main(["--out", "exported"]),
                  "the following arguments are required: --checkpoint"),
    "eval_ctrl": (lambda: _launch("eval_ctrl").parse_args(["--init-from", "a", "--checkpoint", "b"]),
                  "argument --checkpoint: not allowed with argument --init-from"),
    "eval_compilergym": (lambda: _launch("eval_compilergym").main(["--out", "x.json"]),
                         "the following arguments are required: --checkpoint"),
    "report": (lambda: report.main([]), "the following arguments are required: RUN_DIR"),
    "sandbox": (lambda: sandbox_main(["code.py"]), "the following arguments are required: tests_file"),
    "demos": (lambda: demos_cli.main(["replay-everything"]), "invalid choice: 'replay-everything'"),
    "benchmark": (lambda: bench_common.parser("doc", "quick").parse_args(["--quick", "--out"]),
                  "argument --out: expected one argument"),
}


@pytest.mark.parametrize("command", sorted(CASES))
def test_a_refused_command_line_is_one_line_and_exit_2(command, capsys):
    call, problem = CASES[command]
    with pytest.raises(SystemExit) as exited:
        call()
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and problem in err, err
    assert err.rstrip().endswith("--help"), err  # where the usage is
