"""The on-disk demonstration format (see the package docstring): writing episodes and the
manifest atomically, and reading them back lazily (an episode's tensors are read on first use)."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

FORMAT = "async_rl.demos/1"
MANIFEST = "manifest.json"
OBS_PREFIX = "obs."


def episode_file(task_index: int, episode: int) -> str:
    """The manifest's ``file`` of episode ``episode`` of the task set's task ``task_index``."""
    return f"task{task_index}/ep{episode:04d}.safetensors"


def _replace_atomically(path: Path, write: Any) -> None:
    """``write(tmp_path)`` then rename over ``path``: readers and interrupted runs never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_episode(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, Any]) -> None:
    """One episode's safetensors file; ``metadata`` (JSON-able values) goes in its header too."""
    from safetensors.numpy import save_file  # noqa: PLC0415 (the demos CLI answers --help without it)

    header = {k: json.dumps(v) for k, v in metadata.items()}
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    _replace_atomically(path, lambda tmp: save_file(arrays, tmp, metadata=header))


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> Path:
    """Written last: a folder with a manifest is a complete recording."""
    path = out_dir / MANIFEST
    text = json.dumps(manifest, indent=1) + "\n"
    _replace_atomically(path, lambda tmp: Path(tmp).write_text(text))
    return path


@dataclass
class DemoEpisode:
    """One recorded episode; its arrays are read from ``path`` on first access and then kept."""

    path: Path
    task_index: int  # index into the recording's task set (``manifest["env_kwargs"]``)
    task_name: str
    instruction: str
    init_state: int
    seed: int
    steps: int
    _cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _read_prefixes: set[str] = field(default_factory=set, repr=False)

    def _tensors(self, prefix: str) -> dict[str, np.ndarray]:
        """The file's tensors whose names start with ``prefix`` (read once, without the others)."""
        if prefix not in self._read_prefixes:
            from safetensors import safe_open  # noqa: PLC0415 (as in write_episode)

            with safe_open(str(self.path), framework="np") as f:
                for key in f.keys():
                    if key.startswith(prefix) and key not in self._cache:
                        self._cache[key] = f.get_tensor(key)
            self._read_prefixes.add(prefix)
        return {k: v for k, v in self._cache.items() if k.startswith(prefix)}

    @property
    def obs(self) -> dict[str, np.ndarray]:
        """{"agentview": uint8 [T, H, W, 3] (one entry per recorded camera), "proprio": float32 [T, 8]}."""
        return {k[len(OBS_PREFIX):]: v for k, v in self._tensors(OBS_PREFIX).items()}

    @property
    def action(self) -> np.ndarray:
        """float32 [T, 7]: what the env executed (the expert's command plus noise)."""
        return self._tensors("action")["action"]

    @property
    def expert_action(self) -> np.ndarray:
        """float32 [T, 7]: the expert's clean command for obs[t] (the behaviour-cloning label)."""
        return self._tensors("expert_action")["expert_action"]

    @property
    def sim_state(self) -> np.ndarray:
        """float64 [T + 1, S]: the simulator's flattened state before each step and after the last."""
        return self._tensors("sim_state")["sim_state"]


@dataclass
class DemoSet:
    """A recording: its manifest and its episodes (in the manifest's order)."""

    path: Path
    manifest: dict[str, Any]
    episodes: list[DemoEpisode]

    def __len__(self) -> int:
        return len(self.episodes)


def load_demos(path: Union[str, Path], tasks: Optional[list[int]] = None) -> DemoSet:
    """Read a recording's manifest (the episode files are read lazily); ``tasks`` keeps only
    episodes of those task-set indices."""
    root = Path(path)
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path} does not exist: {root} is not a complete demonstration recording "
                                f"(record one with: python -m async_rl.demos record ...)")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{manifest_path} has format {manifest.get('format')!r}; this reader knows {FORMAT!r}")
    episodes = [DemoEpisode(path=root / e["file"], task_index=int(e["task_index"]), task_name=e["task_name"],
                            instruction=e["instruction"], init_state=int(e["init_state"]), seed=int(e["seed"]),
                            steps=int(e["steps"]))
                for e in manifest["episodes"] if tasks is None or int(e["task_index"]) in tasks]
    return DemoSet(path=root, manifest=manifest, episodes=episodes)
