"""Scripted-expert demonstrations: recorded with ``python -m async_rl.demos record``, read with
``load_demos``; ``python -m async_rl.demos evaluate-expert`` measures the expert's success rate.

Format ``async_rl.demos/1`` (a folder)::

    manifest.json          written last (atomically): a folder without one is an unfinished recording
    task<i>/ep<kkkk>.safetensors   episode k of the task set's task i (written to a temp file, then renamed)

``manifest.json``::

    {"format": "async_rl.demos/1", "env": "libero",
     "env_kwargs": {...},          # exactly what envs.make_task_set("libero", **env_kwargs) was given
     "expert": {"settings": {...ExpertSettings...}, "noise": 0.3},
     "seed": S,                    # the recording's seed; every env was made with seed=S
     "episodes": [{"file": "task0/ep0000.safetensors", "task_index": 0,   # index into the task set
                   "task_name": ..., "instruction": ..., "init_state": k,  # the reset's init_state
                   "seed": s,      # the expert's noise seed for this episode
                   "steps": T}, ...]}

Each episode file (safetensors; its header metadata repeats the manifest entry, JSON-encoded)::

    obs.<camera>   uint8   [T, H, W, 3]   the image as the policy sees it (the env's observation dict)
    obs.proprio    float32 [T, 8]
    action         float32 [T, 7]         executed (with noise); the env stepped exactly these values
    expert_action  float32 [T, 7]         the expert's clean command: the behaviour-cloning label
    sim_state      float64 [T + 1, S]     LiberoTaskEnv.sim_state() before each step and after the last

obs[t] is what action[t] was chosen from. Only successful episodes are kept: episode k of a task
starts from ``init_states[k % len(init_states)]`` and, if the expert fails there, is tried again
with the next noise seed (``--max-attempts`` in all). Replay: ``env = task_set.make_env(task_index,
seed=manifest["seed"])``, ``env.reset(init_state=episode.init_state)``, then step ``episode.action``;
the states equal ``episode.sim_state``.
"""
from async_rl.demos.storage import FORMAT, DemoEpisode, DemoSet, load_demos

__all__ = ["FORMAT", "DemoEpisode", "DemoSet", "load_demos"]
