"""StatsActor: aggregates what workers report, per task, between two snapshots."""
from __future__ import annotations

import time
from collections import defaultdict, deque

import numpy as np
import ray

# Episodes behind the running success rate (the status line's): a snapshot every few seconds holds one or
# two LIBERO episodes, so its own mean flips between 0 and 1; SB3 shows the last 100 the same way.
RECENT_EPISODES = 100
# Env counters of text envs (envs/_text.py) that the snapshot also turns into a rate and a mean.
COMPLETION_COUNTERS = ("completions", "completion_tokens")


class StatsAggregator:
    def __init__(self) -> None:
        self.total_env_steps = 0
        self.total_episodes = 0
        self._episodes: dict[str, list[tuple[float, int, bool]]] = defaultdict(list)
        self._recent_success: deque[bool] = deque(maxlen=RECENT_EPISODES)
        self._steps_since = 0
        self._since = time.monotonic()
        # Failures survived: worker_restarts, inference_restarts, dropped_episodes, ...
        self.health: dict[str, int] = defaultdict(int)
        # Running totals an environment counts itself (e.g. CompilerGym's skipped programs).
        self.env_counters: dict[str, int] = defaultdict(int)
        # Each reward function's values since the last snapshot (text envs: reward/<name> mean and std).
        self._reward_components: dict[str, list[float]] = defaultdict(list)
        # Text envs: responses and their tokens since the last snapshot (completions/s, tokens per completion).
        self._completions_since: dict[str, int] = defaultdict(int)

    def record_health(self, key: str, n: int = 1) -> None:
        self.health[key] += n

    def record_env_counters(self, deltas: dict[str, int]) -> None:
        """Add what an environment counted since its last report."""
        for key, n in deltas.items():
            self.env_counters[key] += n
            if key in COMPLETION_COUNTERS:
                self._completions_since[key] += n

    def record_reward_components(self, values: dict[str, list[float]]) -> None:
        """Add an env's per-reward values (``{reward name: [value per episode]}``) since its last report."""
        for name, got in values.items():
            self._reward_components[name].extend(float(v) for v in got)

    def state_dict(self) -> dict:
        """Running totals (what a checkpoint keeps; per-snapshot means restart empty)."""
        return {"total_env_steps": self.total_env_steps, "total_episodes": self.total_episodes, "health": dict(self.health),
                "env_counters": dict(self.env_counters)}

    def load_state_dict(self, state: dict) -> None:
        self.total_env_steps, self.total_episodes = state["total_env_steps"], state["total_episodes"]
        self.health.update(state["health"])
        self.env_counters.update(state.get("env_counters", {}))  # absent in checkpoints made before they existed

    def record_steps(self, source: str, n: int) -> None:
        self.total_env_steps += n
        self._steps_since += n

    def record_episode(self, task: str, episode_return: float, length: int, success: bool, seconds: float) -> None:
        self.total_episodes += 1
        self._episodes[task].append((episode_return, length, success))
        self._recent_success.append(bool(success))

    def record_collected(self, source: str, steps: int, episodes: list[tuple[str, float, int, bool, float]]) -> None:
        """A rollout worker's report of one round: env steps pushed and the episodes that ended
        (``record_episode``'s arguments each); one call instead of one per push and per episode."""
        self.record_steps(source, steps)
        for episode in episodes:
            self.record_episode(*episode)

    def snapshot(self) -> dict:
        """Per-task and overall means since the last snapshot, plus running totals."""
        now = time.monotonic()
        per_task = {
            task: {
                "episode_return": float(np.mean([e[0] for e in eps])),
                "episode_length": float(np.mean([e[1] for e in eps])),
                "success_rate": float(np.mean([e[2] for e in eps])),
                "episodes": len(eps),
            }
            for task, eps in self._episodes.items()
        }
        all_eps = [e for eps in self._episodes.values() for e in eps]
        out = {
            "tasks": per_task,
            "episodes": len(all_eps),
            "env_steps_per_sec": self._steps_since / max(now - self._since, 1e-9),
            "total_env_steps": self.total_env_steps,
            "total_episodes": self.total_episodes,
            "health": dict(self.health),
            "env_counters": dict(self.env_counters),
        }
        if all_eps:
            out["episode_return"] = float(np.mean([e[0] for e in all_eps]))
            out["episode_length"] = float(np.mean([e[1] for e in all_eps]))
            out["success_rate"] = float(np.mean([e[2] for e in all_eps]))
        if "completions" in self.env_counters:  # a text env: completions/s, which speak where steps/s round to 0
            done = self._completions_since["completions"]
            out["completions_per_sec"] = done / max(now - self._since, 1e-9)
            if done:
                out["completion_tokens"] = self._completions_since["completion_tokens"] / done
        if self._reward_components:
            out["reward_components"] = {name: {"mean": float(np.mean(v)), "std": float(np.std(v)), "n": len(v)}
                                        for name, v in self._reward_components.items()}
        if self._recent_success:  # kept across snapshots: the last RECENT_EPISODES episodes, all tasks
            out["success_rate_recent"] = float(np.mean(self._recent_success))
            out["recent_episodes"] = len(self._recent_success)
        self._episodes.clear()
        self._reward_components.clear()
        self._completions_since.clear()
        self._steps_since, self._since = 0, now
        return out


@ray.remote
class StatsActor(StatsAggregator):
    pass
