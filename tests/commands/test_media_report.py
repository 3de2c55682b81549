"""What a user sees of a run: episode videos, the end-of-run report, the dashboards' files, and a
log that reads well when redirected to a file.

One real launch (MetaWorld, a few epochs, stdout/stderr to a file) serves the end-to-end checks;
the others need no Ray.
"""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2

from async_rl.logger import MetricsLogger
from async_rl.media import frame_of, log_videos
from async_rl.report import FIGURES, figure_tags
from async_rl.report import main as report_main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One short MetaWorld run through its launch script, its output redirected to a file."""
    log_dir = tmp_path_factory.mktemp("launch") / "run"
    log_file = log_dir.parent / "stdout.txt"
    cmd = [sys.executable, str(ROOT / "launch" / "ds_metaworld_ppo_mlp.py"), "--clip-mode", "soft_clip",
           "--log-dir", str(log_dir), "--max-epochs", "4", "--swanlab-mode", "disabled", "--num-trainers", "1",
           "--env-kwargs", "{benchmark: MT1, task: reach-v3, max_episode_steps: 40}", "--eval-interval-epochs", "2",
           "--eval-episodes", "1", "--video-interval-evals", "1", "--video-episodes", "1", "--log-interval-seconds", "0.01",
           "--updates-per-epoch", "1", "--train-batch-size", "32", "--super-batch-size", "32"]
    with open(log_file, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT, timeout=600)
    text = log_file.read_text()
    assert proc.returncode == 0, text[-4000:]
    return log_dir, text


def test_redirected_log_has_status_lines_and_no_error_lines(launched):
    _, text = launched
    status = re.findall(r"^epoch (\d+)/4 .*steps/s", text, flags=re.M)
    assert len(status) >= 2, text[-3000:]
    assert [int(e) for e in status] == sorted(int(e) for e in status)
    # Ray's core-worker error lines look like "[2026-.. E 1234 ...] core_worker..."; any "Error" line is a failure's.
    errors = [line for line in text.splitlines()
              if re.search(r"\bE\s+\d+\s", line) or "Error" in line or "Traceback" in line]
    assert not errors, errors
    assert "report: " in text
    assert "\x1b[" not in text, "colour codes in a redirected log"
    assert "Token authentication" not in text, "Ray's token advice on a loopback-only cluster"


def test_run_writes_videos_mp4_and_report(launched):
    log_dir, _ = launched
    events = EventAccumulator(str(log_dir), size_guidance={"images": 0}).Reload()
    videos = [t for t in events.Tags()["images"] if t.startswith("eval_video/")]
    assert videos, events.Tags()
    gif = events.Images(videos[0])[0]
    assert gif.encoded_image_string[:6] in (b"GIF87a", b"GIF89a") and gif.width == gif.height == 128
    mp4s = sorted((log_dir / "videos").glob("epoch-*-reach-v3-0.mp4"))
    assert mp4s, list(log_dir.rglob("*"))
    import imageio.v2 as imageio

    frames = imageio.mimread(str(mp4s[0]), memtest=False)
    assert len(frames) == 41 and frames[0].shape == (128, 128, 3)  # reset + 40 steps
    assert np.std(frames[0]) > 10, "a rendered scene, not a blank frame"
    assert "eval/media_seconds_render_per_episode" in events.Tags()["scalars"]

    report = log_dir / "report" / "report.md"
    text = report.read_text()
    for stem in ("return", "success", "losses", "clip_ess", "throughput", "policy_lag"):
        assert (log_dir / "report" / f"{stem}.png").stat().st_size > 1000, stem
        assert f"({stem}.png)" in text
    assert "checkpoints/epoch-000004" in text and "clip_mode=\"soft_clip\"" in text
    assert re.search(r"\| rollout/env_steps_per_sec \| \d", text), text


def test_report_compares_runs_and_names_a_bad_dir(launched, tmp_path, capsys):
    log_dir, _ = launched
    out = tmp_path / "cmp"
    assert report_main([str(log_dir), str(log_dir), "--out", str(out)]) == 0
    assert (out / "losses.png").exists() and (out / "report.md").read_text().count("## ") >= 4
    assert report_main([str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_every_train_tag_is_plotted():
    tags = ["train/policy_loss", "train/clip_frac", "train/ess", "train/ratio_max", "train/some_new_stat",
            "rollout/env_steps_per_sec", "rollout/policy_lag", "health/worker_restarts"]
    grouped = figure_tags(tags)
    assert grouped["losses"] == ["train/policy_loss"]
    assert grouped["clip_ess"] == ["train/clip_frac", "train/ess", "train/ratio_max"]
    assert grouped["train_diagnostics"] == ["train/some_new_stat"]
    assert {s for s, _, _ in FIGURES} >= set(grouped)
    assert "health/worker_restarts" not in sum(grouped.values(), [])


def test_swanlab_offline_log_and_tensorboard_layout(tmp_path):
    logger = MetricsLogger(str(tmp_path), "offline", {"clip_mode": "sapo"})
    for step in range(3):
        logger.log({"train/policy_loss": 0.5 - step / 10, "eval/success_rate": step / 2}, step)
    logger.close()
    runs = list((tmp_path / "swanlab").glob("run-*"))
    assert len(runs) == 1
    records = b"".join(p.read_bytes() for p in runs[0].glob("*.swanlab"))
    assert b"train/policy_loss" in records and b"eval/success_rate" in records
    assert "sapo" in (runs[0] / "files" / "config.yaml").read_text()

    events = EventAccumulator(str(tmp_path)).Reload()
    layout = layout_pb2.Layout.FromString(events.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    assert [c.title for c in layout.category] == ["train", "rollout", "eval", "health", "sync", "replay"]
    charts = {ch.title: list(ch.multiline.tag) for c in layout.category for ch in c.chart}
    assert any(re.match(p, "train/policy_loss") for p in charts["losses"])


def test_frames_from_images_or_renderer():
    image = np.full((8, 8, 3), 7, np.uint8)
    assert frame_of(object(), {"proprio": np.zeros(3, np.float32), "agentview": image}).sum() == 7 * 192
    assert frame_of(object(), np.zeros(39, np.float32)) is None

    class Rendering:
        def render_frame(self):
            return image + 1

    assert frame_of(Rendering(), np.zeros(3)).max() == 8


def test_log_videos_writes_tensorboard_and_mp4(tmp_path):
    frames = np.random.default_rng(0).integers(0, 255, (6, 64, 64, 3), dtype=np.uint8)
    logger = MetricsLogger(str(tmp_path), "disabled")
    paths = log_videos(logger.tb, {"pick up the bowl-0": frames}, 3, str(tmp_path), fps=10)
    logger.close()
    assert [p.name for p in paths] == ["epoch-000003-pick_up_the_bowl-0.mp4"]
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0}).Reload()
    assert events.Tags()["images"] == ["eval_video/pick_up_the_bowl-0"]
