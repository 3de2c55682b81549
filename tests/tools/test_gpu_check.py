"""scripts/gpu_check.sh's CPU-visible parts: the one-line answer on a machine without a GPU, argument
errors, and how each step's exit code and output become the one JSON (steps run by a stand-in
interpreter that answers as pytest and the three benchmarks would)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402

# Answers as the steps would: pytest's closing line; the weight-sync benchmark writes its --out JSON and
# succeeds; the LM step writes its JSON and fails (a check that did not hold); bench_lm_peers writes its JSON
# (or, with LM_PEERS_KILLED set, only its .partial.json, as a run stopped at its limit) and keeps its command line.
STAND_IN = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
out = args[args.index("--out") + 1] if "--out" in args else None
if args[:2] == ["-m", "pytest"]:
    print("tests/gpu/test_x.py ..s"); print("2 passed, 1 skipped in 3.1s"); sys.exit(0)
if args[0].endswith("bench_weight_sync.py"):
    json.dump({"broadcast_100mib_seconds": 0.02, "backend": "gloo (host)", "rows": [1, 2]}, open(out, "w")); sys.exit(0)
if args[0].endswith("gpu_lm_grads.py"):
    json.dump({"raw_grads_finite": True, "lora_tensors": 420, "nonfinite_lora_tensors": 0, "cudnn_nonfinite_lora_tensors": 7,
               "sdpa_ops_ran": "aten::_scaled_dot_product_cudnn_attention", "padded_rows": 5, "micro_batches": [{"width": 70}]},
              open(out, "w")); sys.exit(0)
if args[0].endswith("gpu_lm_grpo.py"):
    if os.environ.get("LM_GRPO_SKIPS"):  # a run whose checks it does not fail itself, but which skipped updates
        json.dump({"global_step": 5, "skipped_updates": int(os.environ["LM_GRPO_SKIPS"])}, open(out, "w")); sys.exit(0)
    json.dump({"generation_tokens_per_sec": 1234.5, "zero2_bf16_update_ok": False, "epochs_arg": args[args.index("--epochs") + 1]},
              open(out, "w")); sys.exit(1)
if args[0].endswith("bench_lm_peers.py"):
    json.dump(args, open(out + ".argv", "w"))
    figures = {"ours_completions_per_sec": 6.5, "trl_completions_per_sec": 2.5, "device": "cuda: shared",
               "ours_generation_phase_tokens_per_sec": 4321.0, "ours_cpu_s/ray::TrainerActor": 9.5}
    if os.environ.get("LM_PEERS_KILLED"):
        json.dump({"ours_completions_per_sec": 6.5}, open(out[:-len(".json")] + ".partial.json", "w")); sys.exit(124)
    json.dump(figures, open(out, "w")); sys.exit(0)
sys.exit(9)
"""


def test_no_gpu_is_one_line_and_exit_3(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--out", str(tmp_path / "g.json")],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "no CUDA GPU" in done.stderr
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize("argv, problem", [(["--budget-minutes", "0"], "give 1 to 60 minutes"),
                                           (["--skip", "everything"], "invalid choice"),
                                           (["--lm-model-path", "a", "--lm-random-smollm2-shape", "b"], "not both")])
def test_bad_arguments_exit_2(argv, problem, capsys):
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(argv, detect=lambda: "Fake GPU")
    assert exc.value.code == 2 and problem in capsys.readouterr().err


def stand_in_python(tmp_path: Path) -> Path:
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    return stand_in


def test_steps_become_one_json(tmp_path, capsys):
    stand_in = stand_in_python(tmp_path)
    out = tmp_path / "check" / "gpu_check.json"
    code = gpu_check.main(["--out", str(out), "--python", str(stand_in)], detect=lambda: "Fake GPU")
    figures = json.loads(out.read_text())
    assert code == 1 and figures["all_ok"] is False  # the LM step failed
    assert figures["device_name"] == "Fake GPU"
    assert (figures["tests_ok"], figures["tests_passed"], figures["tests_skipped"], figures["tests_failed"]) == \
        (True, 2, 1, 0)
    assert figures["weight_sync_ok"] is True and figures["weight_sync_broadcast_100mib_seconds"] == 0.02
    assert "weight_sync_rows" not in figures  # lists stay in the step's own file
    assert figures["lm_grpo_ok"] is False and figures["lm_grpo_generation_tokens_per_sec"] == 1234.5
    assert figures["lm_grpo_epochs_arg"] == str(gpu_check.LM_GRPO_EPOCHS) and gpu_check.LM_GRPO_EPOCHS >= 5
    assert figures["lm_grads_ok"] is True and figures["lm_grads_raw_grads_finite"] is True
    assert figures["lm_grads_cudnn_nonfinite_lora_tensors"] == 7 and "lm_grads_micro_batches" not in figures
    assert figures["skipped_updates"] == 0
    assert figures["lm_peers_ok"] is True and figures["lm_peers_ours_completions_per_sec"] == 6.5
    assert figures["lm_peers_ours_generation_phase_tokens_per_sec"] == 4321.0 and figures["lm_peers_device"] == "cuda: shared"
    assert all(isinstance(figures[f"{s}_seconds"], float) for s in gpu_check.STEPS)
    printed = capsys.readouterr().out
    assert "lm_grpo: FAILED" in printed and "failed: lm_grpo" in printed
    assert (out.parent / "steps" / "tests.log").read_text().endswith("2 passed, 1 skipped in 3.1s\n")


def test_skipped_steps_are_not_run(tmp_path):
    out = tmp_path / "g.json"
    code = gpu_check.main(["--out", str(out), "--python", str(stand_in_python(tmp_path)), "--skip", "lm_grpo", "lm_peers"],
                          detect=lambda: "GPU")
    figures = json.loads(out.read_text())
    assert code == 0 and figures["all_ok"] is True and figures["lm_grpo_ok"] is None and figures["lm_peers_ok"] is None
    assert "lm_grpo_seconds" not in figures and "lm_peers_seconds" not in figures
    assert not (tmp_path / "steps" / "lm_peers.log").exists()


def lm_peers_run(tmp_path: Path, monkeypatch, trl_missing, *flags: str) -> tuple[dict, list[str], str]:
    """gpu_check with only the lm_peers step (TRL's install as ``trl_missing`` says): its figures, the
    benchmark's command line and what gpu_check printed."""
    monkeypatch.setattr(gpu_check, "missing_peers", lambda: trl_missing)
    out = tmp_path / "g.json"
    code = gpu_check.main(["--out", str(out), "--python", str(stand_in_python(tmp_path)), "--skip", "tests",
                           "weight_sync", "lm_grads", "lm_grpo", *flags], detect=lambda: "GPU")
    argv = json.loads((tmp_path / "steps" / "lm_peers.json.argv").read_text())
    figures = json.loads(out.read_text())
    assert figures["all_ok"] is (code == 0)
    return figures, argv, out.parent.joinpath("steps", "lm_peers.log").read_text()


def test_lm_peers_runs_the_gpu_preset_quick_with_trl_when_installed(tmp_path, monkeypatch, capsys):
    figures, argv, _ = lm_peers_run(tmp_path, monkeypatch, None, "--lm-model-path", "/models/m")
    assert argv[0].endswith("bench_lm_peers.py") and {"--gpu", "--quick"} <= set(argv)
    assert argv[argv.index("--updates") + 1] == str(gpu_check.LM_PEERS_UPDATES)
    assert argv[argv.index("--heldout") + 1] == str(gpu_check.LM_PEERS_HELDOUT)
    assert argv[argv.index("--systems") + 1: argv.index("--systems") + 3] == ["ours", "trl"]
    assert argv[argv.index("--model-path") + 1] == "/models/m"
    assert figures["lm_peers_ok"] is True and figures["lm_peers_trl_completions_per_sec"] == 2.5
    assert "lm_peers_trl_skipped" not in figures and "TRL skipped" not in capsys.readouterr().out


def test_lm_peers_without_trl_runs_ours_and_says_why(tmp_path, monkeypatch, capsys):
    figures, argv, _ = lm_peers_run(tmp_path, monkeypatch, "TRL is not installed in X: run `make peers`")
    after = argv[argv.index("--systems") + 1:]
    assert after[0] == "ours" and after[1].startswith("--")  # ours alone: the benchmark would refuse trl
    assert "--model-path" not in argv
    assert figures["lm_peers_ok"] is True and figures["lm_peers_trl_skipped"].startswith("TRL is not installed")
    assert "lm_peers: TRL skipped: TRL is not installed" in capsys.readouterr().out


def test_lm_peers_stopped_at_its_limit_keeps_its_partial_figures(tmp_path, monkeypatch):
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "lm_peers.json").write_text('{"ours_completions_per_sec": 99.0}')  # an earlier check's
    monkeypatch.setenv("LM_PEERS_KILLED", "1")
    figures, _, _ = lm_peers_run(tmp_path, monkeypatch, None)
    assert figures["lm_peers_ok"] is False and figures["lm_peers_ours_completions_per_sec"] == 6.5
    assert figures["all_ok"] is False


def test_the_steps_fit_the_budget():
    assert set(gpu_check.SHARES) == set(gpu_check.STEPS) and sum(gpu_check.SHARES.values()) <= 1.0
    budget = gpu_check.BUDGET_MINUTES
    assert gpu_check.SHARES["lm_peers"] * budget >= 2.5  # minutes of the default budget: two start-ups and evaluations
    assert gpu_check.SHARES["lm_grpo"] * budget * 60 > 154  # its 3-epoch run on an H200 (RESULTS section 20)


def test_a_skipped_update_fails_the_check_even_when_its_step_passed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LM_GRPO_SKIPS", "2")
    out = tmp_path / "g.json"
    code = gpu_check.main(["--out", str(out), "--python", str(stand_in_python(tmp_path)), "--skip", "lm_peers"],
                          detect=lambda: "GPU")
    figures = json.loads(out.read_text())
    assert figures["lm_grpo_ok"] is True and figures["lm_grpo_skipped_updates"] == 2
    assert code == 1 and figures["all_ok"] is False and figures["skipped_updates"] == 2
    assert "2 optimiser update(s) skipped" in capsys.readouterr().out
    assert gpu_check.skipped_updates({"lm_peers_ours_skipped_updates": 1, "lm_grpo_skipped_updates": 0,
                                      "lm_grpo_ok": True}) == 1


def test_help_answers_without_a_gpu():
    for command in (["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--help"],
                    [sys.executable, str(ROOT / "benchmarks" / "gpu_lm_grads.py"), "--help"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "usage:" in done.stdout, done.stderr
    assert "lm_grads" in gpu_check.__doc__ and "skipped_updates" in gpu_check.__doc__


def test_the_gradient_probe_runs_on_cpu(tmp_path):
    """benchmarks/gpu_lm_grads.py's CPU-runnable part, on a tiny causal LM (the GPU step runs the real model): its
    figures per micro-batch, the LoRA gradients and the attention operators that ran."""
    import torch
    import transformers
    from test_lm_model_families import SHAPE, char_tokenizer

    folder = tmp_path / "tiny_lm"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE)).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    out = tmp_path / "grads.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_lm_grads.py"), "--device", "cpu", "--rows", "20",
                           "--model-path", str(folder), "--out", str(out)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["raw_grads_finite"] is True and figures["nonfinite_lora_tensors"] == 0
    assert figures["lora_tensors"] == 2 * 2 * 7  # 2 layers x 7 target modules x (A, B)
    assert figures["math_nonfinite_lora_tensors"] == 0 and "cudnn_nonfinite_lora_tensors" not in figures  # CPU
    assert "scaled_dot_product" in figures["sdpa_ops_ran"] and figures["attn_implementation"] == "sdpa"
    assert set(figures) >= {"sdpa_flag_cudnn", "sdpa_flag_flash", "sdpa_flag_efficient", "sdpa_flag_math"}
    batches = figures["micro_batches"]
    assert [b["rows"] for b in batches] == [16, 4]  # lm_arithmetic's train_batch_size 16
    assert figures["max_width"] == max(b["width"] for b in batches)
    assert figures["padded_rows"] == sum(b["padded_rows"] for b in batches) > 0  # mixed prompt lengths


def test_padding_shape_and_lora_gradients_read_what_attention_gets():
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_lm_grads

    mask = torch.tensor([[0, 0, 0, 1, 1], [0, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    response = torch.tensor([[5, 6, -1, -1], [5, -1, -1, -1], [5, 6, 7, -1]])
    # the all-padding first column is trimmed: width 4 + 3 used response columns; rows 0 and 2 keep padding
    assert gpu_lm_grads.padding_shape(mask * 9, mask, response) == {"width": 7, "rows": 3, "padded_rows": 2,
                                                                    "left_pad_positions": 3}
    model = torch.nn.Module()
    model.lora_A = torch.nn.Parameter(torch.ones(2))
    model.lora_B = torch.nn.Parameter(torch.ones(2))
    model.base = torch.nn.Parameter(torch.ones(2))
    (model.lora_A * model.base).sum().backward()
    assert gpu_lm_grads.lora_gradients(model) == (2, ["lora_B"])  # no gradient at all counts too
    model.lora_B.grad = torch.tensor([1.0, float("nan")])
    assert gpu_lm_grads.lora_gradients(model) == (2, ["lora_B"])


def test_pytest_counts_reads_the_closing_line():
    assert gpu_check.pytest_counts("x\n1 failed, 3 passed, 2 skipped, 1 error in 5s") == \
        {"passed": 3, "failed": 1, "skipped": 2, "errors": 1}
    assert gpu_check.pytest_counts("") == {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
