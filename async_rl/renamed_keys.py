"""Config keys renamed since earlier versions. A config file or flag that still uses an old key is refused in one
line with the new spelling (``RunConfig.renamed_keys``); a checkpoint saved under an old key is read under the new
one (``saved_config_now``), so a run saved before a rename still resumes and evaluates."""
from __future__ import annotations

from typing import Any, Optional

# Run config key: old -> new (same meaning, same value).
RUN_KEYS: dict[str, str] = {"rollout_local_buf": "rollout_steps"}
# Options of one env (env_kwargs): env -> {old -> new}; the env's options model refuses the old spelling itself.
ENV_OPTION_KEYS: dict[str, dict[str, str]] = {"compilergym": {"baseline_thre": "leaky_above"}}
# Env names: old -> new (the same env). A config naming the old one is refused with the new name; a checkpoint
# saved under it reads as the new one.
ENV_NAMES: dict[str, str] = {"compiler_gym": "compilergym"}


def renamed_run_keys() -> dict[str, str]:
    """Old run config key -> how to write it now (``renamed_keys`` of ``RunConfig``)."""
    return _how_to_write(RUN_KEYS)


def renamed_env_option_keys(env: str) -> dict[str, str]:
    """Old option key of env ``env`` -> how to write it now (``renamed_keys`` of its options model)."""
    return _how_to_write(ENV_OPTION_KEYS.get(env, {}))


def _how_to_write(renames: dict[str, str]) -> dict[str, str]:
    return {old: f"'{new}' (same meaning, same value)" for old, new in renames.items()}


def renamed_flag(flag: str) -> Optional[str]:
    """Today's spelling of an old flag (``--rollout-local-buf``, ``--env.baseline-thre``), else None."""
    kind, dot, key = flag.removeprefix("--").replace("-", "_").rpartition(".")
    if dot and kind == "env":
        new = next((env_keys[key] for env_keys in ENV_OPTION_KEYS.values() if key in env_keys), None)
        return f"--env.{new.replace('_', '-')}" if new else None
    new = RUN_KEYS.get(key) if not dot else None
    return f"--{new.replace('_', '-')}" if new else None


def saved_config_now(config: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's saved config under today's keys: renamed keys and env options take their new names, and a key
    added since gets the value that the older version behaved as."""
    out = {RUN_KEYS.get(key, key): value for key, value in config.items()}
    if isinstance(out.get("env"), str):
        out["env"] = ENV_NAMES.get(out["env"], out["env"])
    env_renames = ENV_OPTION_KEYS.get(out.get("env", ""), {})
    if env_renames and isinstance(out.get("env_kwargs"), dict):
        out["env_kwargs"] = {env_renames.get(key, key): value for key, value in out["env_kwargs"].items()}
    out.setdefault("normalize_advantages_per", "batch")  # written before the key existed: batch whitening
    return out
