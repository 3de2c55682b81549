"""Recording the scripted expert's successful episodes, and measuring its success rate."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any, Optional

from tqdm import tqdm

from async_rl.demos.expert_episodes import ExpertWorker, episode_seed, libero_task_set, run_jobs
from async_rl.demos.storage import FORMAT, MANIFEST, episode_file, write_episode, write_manifest
from envs.libero_expert import ExpertSettings


def _progress(total: int, description: str, quiet: bool) -> Any:
    return tqdm(total=total, desc=description, unit="ep", disable=quiet, dynamic_ncols=True)


@dataclasses.dataclass(frozen=True)
class RecordingJob:
    """Episode ``episode`` of the task set's task ``task_index``, from initial state ``init_state``."""

    task_index: int
    episode: int
    init_state: int
    seed: int  # the recording's seed
    max_attempts: int
    out_dir: str


def record_one(worker: ExpertWorker, job: RecordingJob) -> dict[str, Any]:
    """Try the episode with up to ``max_attempts`` noise seeds; write the first success.
    Returns its manifest entry, or one with ``"file": None`` and the attempts when all failed."""
    ts = worker.task_set
    for attempt in range(job.max_attempts):
        seed = episode_seed(job.seed, job.task_index, job.episode, attempt)
        result = worker.run(job.task_index, job.init_state, seed, record=True)
        if not result.success:
            continue
        entry: dict[str, Any] = {"file": episode_file(job.task_index, job.episode), "task_index": job.task_index,
                 "task_name": ts.task_names[job.task_index], "instruction": ts.instructions[job.task_index],
                 "init_state": job.init_state, "seed": seed, "steps": result.steps}
        write_episode(Path(job.out_dir) / entry["file"], result.tensors, entry)
        return {**entry, "attempts": attempt + 1}
    return {"file": None, "task_index": job.task_index, "episode": job.episode, "init_state": job.init_state,
            "attempts": job.max_attempts}


def clear_recording(out_dir: Path) -> None:
    """--overwrite: remove an earlier recording's manifest first (so that a crash from here on leaves
    no manifest), then its episode folders; anything else in the folder is left alone."""
    (out_dir / MANIFEST).unlink(missing_ok=True)
    for folder in out_dir.glob("task*"):
        if folder.is_dir() and all(f.suffix in (".safetensors", ".tmp") for f in folder.iterdir()):
            shutil.rmtree(folder)


def record_demos(env_kwargs: dict[str, Any], episodes: int, noise: float, seed: int, out_dir: Path,
                 workers: int = 1, max_attempts: int = 5, settings: Optional[ExpertSettings] = None,
                 quiet: bool = False) -> dict[str, Any]:
    """Record ``episodes`` successful expert episodes per task of ``envs.make_task_set("libero",
    **env_kwargs)``; episode k of a task starts from ``init_states[k % len(init_states)]``.
    Returns the manifest (written last) plus ``failed``: the episodes no attempt succeeded in."""
    settings = settings or ExpertSettings()
    worker_args = (env_kwargs, seed, noise, settings)
    ts = libero_task_set(env_kwargs)
    choices = [ts.init_state_choices(t) for t in range(len(ts))]
    jobs = [RecordingJob(t, k, choices[t][k % len(choices[t])], seed, max_attempts, str(out_dir))
            for t in range(len(ts)) for k in range(episodes)]
    out_dir.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    attempts = 0
    with _progress(len(jobs), "recording", quiet) as bar:
        for entry in run_jobs(worker_args, record_one, jobs, workers):
            attempts += entry["attempts"]
            (entries if entry["file"] else failed).append(entry)
            bar.update(1)
            bar.set_postfix(attempts=attempts, failed=len(failed))
    entries.sort(key=lambda e: (e["task_index"], e["file"]))
    manifest = {
        "format": FORMAT,
        "env": "libero",
        "env_kwargs": env_kwargs,
        "expert": {"settings": dataclasses.asdict(settings), "noise": noise},
        "seed": seed,
        "episodes": [{k: v for k, v in e.items() if k != "attempts"} for e in entries],
    }
    write_manifest(out_dir, manifest)
    return {**manifest, "failed": failed, "attempts": attempts}


def evaluate_one(worker: ExpertWorker, item: tuple[int, int, int]) -> tuple[int, int, bool, int]:
    task_index, init_state, seed = item
    result = worker.run(task_index, init_state, seed, record=False)
    return task_index, init_state, result.success, result.steps


def evaluate_expert(env_kwargs: dict[str, Any], noise: float, seed: int, workers: int = 1,
                    settings: Optional[ExpertSettings] = None, quiet: bool = False) -> dict[str, Any]:
    """The expert's success per task, one episode from each of the task set's initial states
    (``init_states``), physics only; the noise seed of each is ``episode_seed(seed, task, init_state)``."""
    settings = settings or ExpertSettings()
    env_kwargs = {**env_kwargs, "cameras": []}
    worker_args = (env_kwargs, seed, noise, settings)
    ts = libero_task_set(env_kwargs)
    items = [(t, k, episode_seed(seed, t, k)) for t in range(len(ts)) for k in ts.init_state_choices(t)]
    outcomes: dict[int, dict[int, bool]] = {t: {} for t in range(len(ts))}
    steps: list[int] = []
    with _progress(len(items), "evaluating", quiet) as bar:
        for task_index, init_state, success, n in run_jobs(worker_args, evaluate_one, items, workers):
            outcomes[task_index][init_state] = success
            steps.append(n)
            bar.update(1)
    per_task = {ts.task_names[t]: sum(o.values()) / len(o) for t, o in outcomes.items()}
    return {
        "success_rate": sum(per_task.values()) / len(per_task),
        "per_task": per_task,
        "failed_init_states": {ts.task_names[t]: sorted(k for k, ok in o.items() if not ok) for t, o in outcomes.items()},
        "episodes_per_task": {ts.task_names[t]: len(o) for t, o in outcomes.items()},
        "mean_steps": sum(steps) / len(steps),
        "noise": noise,
        "seed": seed,
        "env_kwargs": env_kwargs,
        "expert": dataclasses.asdict(settings),
    }
