"""Scripted-expert demonstrations (async_rl/demos) on libero_spatial task 0, and the LIBERO env's
``init_states`` subset that holds initial states out of them.

One recording of two short episodes (32x32 images) serves the format, reader and replay tests;
the replay and the schedule run on a physics-only env, and the CLI's bad-input lines are checked
in-process (one real subprocess checks the exit status).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from async_rl.errors import ConfigError

if importlib.util.find_spec("libero") is None:
    pytest.skip("LIBERO is not installed (run: make setup)", allow_module_level=True)

import envs
from async_rl.demos import (
    FORMAT,
    load_demos,
    recording,
)
from async_rl.demos.cli import main as demos_main
from async_rl.demos.expert_episodes import ExpertEpisode, episode_seed
from envs.libero import InitStateSchedule

ROOT = Path(__file__).resolve().parents[2]
SEED, NOISE = 3, 0.3
ENV_KWARGS = {"suite": "libero_spatial", "tasks": [0], "cameras": ["agentview"], "init_states": "4-5", "image_size": 32}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos") / "rec"
    result = recording.record_demos(dict(ENV_KWARGS), episodes=2, noise=NOISE, seed=SEED, out_dir=out, quiet=True)
    assert not result["failed"]
    return out


@pytest.fixture(scope="module")
def physics_env():
    """The recording's task set without cameras, made with the recording's seed (as a replay must be)."""
    task_set = envs.make_task_set("libero", **{**ENV_KWARGS, "cameras": []})
    env = task_set.make_env(0, seed=SEED)
    yield env
    env.close()


# ---- the format and the reader ----------------------------------------------------------
def test_manifest_and_episode_files(recorded):
    manifest = json.loads((recorded / "manifest.json").read_text())
    assert manifest["format"] == FORMAT and manifest["env"] == "libero" and manifest["seed"] == SEED
    assert manifest["env_kwargs"] == ENV_KWARGS and manifest["expert"]["noise"] == NOISE
    assert manifest["expert"]["settings"]["gain"] > 0
    entries = manifest["episodes"]
    assert [e["file"] for e in entries] == ["task0/ep0000.safetensors", "task0/ep0001.safetensors"]
    assert [e["init_state"] for e in entries] == [4, 5]  # episode k starts from init_states[k % len]
    assert all(e["task_index"] == 0 and e["instruction"].startswith("pick up the black bowl") for e in entries)
    assert entries[0]["seed"] in [episode_seed(SEED, 0, 0, a) for a in range(5)]
    from safetensors.numpy import load_file

    tensors = load_file(recorded / entries[0]["file"])
    steps = entries[0]["steps"]
    assert 50 < steps < 220
    assert tensors["obs.agentview"].shape == (steps, 32, 32, 3) and tensors["obs.agentview"].dtype == np.uint8
    assert tensors["obs.proprio"].shape == (steps, 8) and tensors["obs.proprio"].dtype == np.float32
    for key in ("action", "expert_action"):
        assert tensors[key].shape == (steps, 7) and tensors[key].dtype == np.float32
    assert tensors["sim_state"].shape[0] == steps + 1 and tensors["sim_state"].dtype == np.float64
    assert not np.array_equal(tensors["action"][:, :3], tensors["expert_action"][:, :3])  # noise on the executed
    np.testing.assert_array_equal(tensors["action"][:, 3:], tensors["expert_action"][:, 3:])
    assert tensors["obs.agentview"].std() > 5  # real pictures
    assert not [p for p in recorded.rglob("*") if p.name.startswith(".")]  # no temp files left


def test_reader_round_trips(recorded):
    from safetensors.numpy import load_file

    demos = load_demos(recorded)
    assert len(demos) == 2 and demos.manifest["env_kwargs"] == ENV_KWARGS
    for episode, entry in zip(demos.episodes, demos.manifest["episodes"]):
        raw = load_file(recorded / entry["file"])
        assert set(episode.obs) == {"agentview", "proprio"}
        np.testing.assert_array_equal(episode.obs["agentview"], raw["obs.agentview"])
        np.testing.assert_array_equal(episode.obs["proprio"], raw["obs.proprio"])
        np.testing.assert_array_equal(episode.action, raw["action"])
        np.testing.assert_array_equal(episode.expert_action, raw["expert_action"])
        np.testing.assert_array_equal(episode.sim_state, raw["sim_state"])
        assert (episode.task_index, episode.task_name, episode.instruction) == (0, entry["task_name"], entry["instruction"])
        assert (episode.init_state, episode.seed, episode.steps) == (entry["init_state"], entry["seed"], entry["steps"])
    assert len(load_demos(recorded, tasks=[1]).episodes) == 0
    with pytest.raises(FileNotFoundError, match="not a complete demonstration recording"):
        load_demos(recorded / "task0")


def test_recorded_demonstrations_replay_to_the_same_states(recorded, physics_env):
    """The executed actions, replayed from the same init state on an env of the same seed (physics
    only: rendering does not touch the state), pass through the recorded states exactly, and the
    observation each action was chosen from is the recorded one."""
    env = physics_env
    for episode in load_demos(recorded).episodes:
        obs = env.reset(init_state=episode.init_state)
        states = episode.sim_state
        np.testing.assert_allclose(env.sim_state(), states[0], rtol=0, atol=1e-12)
        for t, action in enumerate(episode.action):
            np.testing.assert_array_equal(obs["proprio"], episode.obs["proprio"][t])
            obs, _, terminated, truncated, info = env.step(action.astype(np.float64))
            np.testing.assert_allclose(env.sim_state(), states[t + 1], rtol=0, atol=1e-12, err_msg=f"step {t}")
        assert terminated and info["success"] and not truncated  # only successes are kept


def test_same_arguments_same_tensors_whatever_the_workers(recorded, tmp_path):
    """Recorded again in two spawned processes (physics only, which leaves the state alone), the
    episodes are the same: each depends only on its init state and seed, not on the worker."""
    again = recording.record_demos({**ENV_KWARGS, "cameras": []}, episodes=2, noise=NOISE, seed=SEED,
                                   out_dir=tmp_path / "again", workers=2, quiet=True)
    first = load_demos(recorded)
    assert again["episodes"] == first.manifest["episodes"]
    for a, b in zip(load_demos(tmp_path / "again").episodes, first.episodes):
        assert set(a.obs) == {"proprio"}
        for key in ("action", "expert_action", "sim_state"):
            np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)
        np.testing.assert_array_equal(a.obs["proprio"], b.obs["proprio"])


def test_retry_takes_the_next_seed_and_gives_up_after_max_attempts(tmp_path):
    class FailingTwice:
        task_set = envs.make_task_set("libero", suite="libero_spatial", tasks=[0], cameras=[])

        def __init__(self):
            self.seeds = []

        def run(self, task_index, init_state, seed, record):
            self.seeds.append(seed)
            ok = len(self.seeds) > 2
            return ExpertEpisode(ok, 3, {"action": np.zeros((3, 7), np.float32)} if ok else None)

    worker = FailingTwice()
    job = recording.RecordingJob(task_index=0, episode=7, init_state=9, seed=1, max_attempts=5, out_dir=str(tmp_path))
    entry = recording.record_one(worker, job)
    assert worker.seeds == [episode_seed(1, 0, 7, a) for a in range(3)] and worker.seeds[1] == worker.seeds[0] + 1
    assert entry["attempts"] == 3 and entry["seed"] == worker.seeds[-1] and entry["file"] == "task0/ep0007.safetensors"
    assert (tmp_path / entry["file"]).is_file()
    gave_up = recording.record_one(FailingTwice(), recording.RecordingJob(0, 8, 9, 1, 2, str(tmp_path)))
    assert gave_up["file"] is None and gave_up["attempts"] == 2


def test_an_interrupted_recording_leaves_no_manifest(tmp_path, monkeypatch):
    def interrupted(worker_args, job, items, workers=1):
        yield {"file": "task0/ep0000.safetensors", "task_index": 0, "attempts": 1}
        raise KeyboardInterrupt

    monkeypatch.setattr(recording, "run_jobs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        recording.record_demos(dict(ENV_KWARGS), episodes=2, noise=0.0, seed=0, out_dir=tmp_path / "out", quiet=True)
    assert not (tmp_path / "out" / "manifest.json").exists()


# ---- the command line -------------------------------------------------------------------
RECORD = ["record", "--tasks", "0", "--episodes", "1", "--quiet"]


@pytest.mark.parametrize("args, words", [
    (["--suite", "libero_spatail"], ["option 'suite' = 'libero_spatail'", "did you mean 'libero_spatial'"]),
    (["--init-states", "10-5"], ["range '10-5' is empty", "0-39"]),
    (["--init-states", "0-50"], ["goes past the last initial state", "0..49"]),
    (["--init-states", "zero"], ["is not a range"]),
    (["--episodes", "0"], ["--episodes 0 must be at least 1"]),
    (["--noise", "-1"], ["--noise -1.0 is outside 0..1"]),
    (["--workers", "0"], ["--workers 0 must be at least 1"]),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, words):
    out = tmp_path / "out"
    assert demos_main([*RECORD, "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    for w in words:
        assert w in err
    assert not out.exists()


def test_a_non_empty_out_needs_overwrite(tmp_path):
    """Through a real process: exit status 2, one line, the folder untouched."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "async_rl.demos", *RECORD, "--out", str(out)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().count("\n") == 0 and "is not empty" in res.stderr and "--overwrite" in res.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_evaluate_expert_writes_its_report(tmp_path, capsys):
    report_path = tmp_path / "expert.json"
    assert demos_main(["evaluate-expert", "--tasks", "0", "--init-states", "4-4", "--quiet", "--json", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    name = "pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate"
    assert report["per_task"] == {name: 1.0} and report["success_rate"] == 1.0
    assert report["env_kwargs"]["cameras"] == [] and report["episodes_per_task"] == {name: 1}
    assert "success_rate 1.000" in capsys.readouterr().out


# ---- the env's init_states subset -------------------------------------------------------
def test_init_state_subset_is_what_resets_draw_from(physics_env):
    env = physics_env
    assert env.init_state_choices == [4, 5]
    assert {env.reset() and env.init_state_index for _ in range(4)} == {4, 5}
    env.reset(start=3)
    assert env.init_state_index == 5  # a group's start picks from the subset too
    env.reset(init_state=30)  # an explicit index may be any of the task's
    assert env.init_state_index == 30


def test_init_state_schedule_with_a_subset():
    subset = [10, 20, 30]
    cycle = InitStateSchedule(50, "cycle", seed=1, subset=subset)
    drawn = [cycle.next() for _ in range(6)]
    assert sorted(drawn[:3]) == subset and drawn[3:] == drawn[:3]
    sampled = InitStateSchedule(50, "sample", seed=1, subset=subset)
    assert set(sampled.next() for _ in range(30)) == set(subset)
    # Without a subset the schedule is what it always was.
    assert [InitStateSchedule(50, "cycle", seed=s).next() for s in range(5)] == \
           [int(np.random.default_rng(s).integers(50)) for s in range(5)]
    with pytest.raises(ValueError):
        InitStateSchedule(50, "cycle", seed=1, subset=[50])


def test_task_set_init_states_option():
    ts = envs.make_task_set("libero", suite="libero_spatial", tasks=[0, 1], cameras=[], init_states=[7, 2])
    assert ts.init_states == [2, 7] and ts.init_state_choices(1) == [2, 7]
    everything = envs.make_task_set("libero", suite="libero_spatial", tasks=[0], cameras=[])
    assert everything.init_states is None and everything.init_state_choices(0) == list(range(50))
    for bad, words in [([], "must not be []"), ([1, 1], "lists an index twice"), ([-1], "greater than or equal to 0"),
                       ("3-1", "is empty"), ("0-50", "0..49")]:
        with pytest.raises(ConfigError, match=None) as err:
            envs.make_task_set("libero", suite="libero_spatial", tasks=[0], cameras=[], init_states=bad)
        assert words in str(err.value) and "\n" not in str(err.value)
