"""Checkpoints: one directory per save, in safe formats only, committed atomically.

Layout of ``<log_dir>/checkpoints/epoch-000012/``::

    meta.json                    epoch, policy version, config, stats and replay counters (written last)
    model.safetensors            the trainable weights (every weight without LoRA; with LoRA the
                                 adapters plus the parameters trained in full, e.g. heads)
    adapter/                     with LoRA: the adapter in peft format (PeftModel.from_pretrained loads it)
    trainer-<rank>.pt            that rank's ZeRO-2 optimizer partition, scheduler, counters and RNG
                                 states: plain tensors, lists and numbers (torch.load(weights_only=True))
    pending-trainer-<rank>-<i>.safetensors   super-batches a trainer had fetched but not trained on
    replay.safetensors           the replay buffer's live items in insertion order (+ its state)

A save is written under ``.tmp-...`` and renamed into place once complete, so a kill during a
save leaves the previous checkpoint intact; only the last ``keep`` complete ones are kept.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tensordict import TensorDict

from async_rl.errors import ConfigError

META = "meta.json"
PREFIX = "epoch-"
FORMAT = 1
# Keys that fix the shapes of what a checkpoint holds; a resume must use the same values.
SHAPE_KEYS = ("env", "env_kwargs", "policy", "policy_kwargs", "lora_rank", "lora_target_modules", "lora_trainable",
              "advantage", "num_trainers", "rollout_local_buf", "precision")


def checkpoint_root(log_dir: str) -> Path:
    return Path(log_dir) / "checkpoints"


def complete_checkpoints(root: Path) -> list[Path]:
    """Committed checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / META).is_file())


def staging_dir(root: Path, epoch: int) -> Path:
    """A fresh temporary directory for the save of ``epoch`` (renamed by ``commit``)."""
    path = root / f".tmp-{PREFIX}{epoch:06d}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    return path


def commit(staging: Path, meta: Mapping[str, Any], keep: int) -> Path:
    """Write ``meta.json`` last, rename the staging dir into place and prune to ``keep``."""
    epoch = int(meta["epoch"])
    tmp_meta = staging / (META + ".tmp")
    tmp_meta.write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
    os.replace(tmp_meta, staging / META)
    final = staging.parent / f"{PREFIX}{epoch:06d}"
    if final.exists():  # the same epoch saved again (e.g. the end of a resumed run that trained no epoch)
        shutil.rmtree(final)
    os.replace(staging, final)
    for old in complete_checkpoints(staging.parent)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def discard_staging(root: Path) -> None:
    """Remove unfinished saves (left by a kill during a save, or by a failed one)."""
    if root.is_dir():
        for path in root.iterdir():
            if path.name.startswith(".tmp-"):
                shutil.rmtree(path, ignore_errors=True)


def resolve_resume(path: str) -> Path:
    """The checkpoint ``--resume`` names: a checkpoint dir, or a dir of them (the newest)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"--resume {path}: no such directory; pass a checkpoint dir such as <log-dir>/checkpoints")
    if (p / META).is_file():
        return p
    found = complete_checkpoints(p) or complete_checkpoints(p / "checkpoints")
    if not found:
        raise ConfigError(f"--resume {path}: not a checkpoint (no {META} in it or in an {PREFIX}* dir under it); "
                          "pass a dir written by a run, e.g. <log-dir>/checkpoints")
    return found[-1]


def read_meta(path: Path) -> dict[str, Any]:
    return json.loads((path / META).read_text())


def check_resumable(path: Path, cfg: Any) -> None:
    """Raise ConfigError if ``cfg`` cannot continue the run saved at ``path``."""
    try:
        meta = read_meta(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--resume {path}: unreadable {META} ({exc}); pass another checkpoint") from None
    if meta.get("format") != FORMAT:
        raise ConfigError(f"--resume {path}: checkpoint format {meta.get('format')!r}, this version reads {FORMAT}")
    saved = meta["config"]
    current = cfg.model_dump()
    for key in SHAPE_KEYS:
        if key in saved and saved[key] != current.get(key):
            raise ConfigError(f"--resume {path}: it was written with {key}={saved[key]!r} but this run has "
                              f"{key}={current.get(key)!r}; pass --{key.replace('_', '-')} with the saved value")


# ---- TensorDicts as safetensors ------------------------------------------------------------
def save_tensordict(td: TensorDict, path: Path) -> None:
    """Leaves under '/'-joined keys; the batch size goes in the file's metadata."""
    leaves = {"/".join(k if isinstance(k, tuple) else (k,)): v.contiguous()
              for k, v in td.items(include_nested=True, leaves_only=True)}
    save_file(leaves, str(path), metadata={"batch_size": json.dumps(list(td.batch_size))})


def load_tensordict(path: Path) -> TensorDict:
    with safe_open(str(path), "pt") as f:
        batch_size = json.loads(f.metadata()["batch_size"])
    flat = load_file(str(path))
    td = TensorDict({}, batch_size=batch_size)
    for key, value in flat.items():
        td[tuple(key.split("/"))] = value
    return td


# ---- model weights -------------------------------------------------------------------------
def has_lora(module: torch.nn.Module) -> bool:
    return bool(getattr(module, "peft_config", None))


def _checkpointed_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The live tensors a checkpoint holds for ``module``: every weight, or with LoRA the
    trainable ones and the buffers (the frozen base is rebuilt from the config)."""
    if not has_lora(module):
        return module.state_dict()
    tensors = {n: p for n, p in module.named_parameters() if p.requires_grad}
    tensors.update(dict(module.named_buffers()))
    return tensors


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint must hold to restore ``module``, as detached contiguous CPU copies."""
    return {k: v.detach().cpu().contiguous() for k, v in _checkpointed_tensors(module).items()}


def save_model(module: torch.nn.Module, directory: Path) -> None:
    save_file(trainable_state(module), str(directory / "model.safetensors"))
    if has_lora(module):
        from peft import get_peft_model_state_dict

        adapter = directory / "adapter"
        adapter.mkdir()
        module.peft_config["default"].save_pretrained(str(adapter))
        # Key names as PeftModel.save_pretrained writes them (the policy sits at base_model.model).
        state = {f"base_model.model.{k}": v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(module).items()}
        save_file(state, str(adapter / "adapter_model.safetensors"))


def load_model(module: torch.nn.Module, directory: Path) -> None:
    """Copy the saved weights into ``module`` in place (views DeepSpeed holds stay valid)."""
    state = load_file(str(directory / "model.safetensors"))
    expected = _checkpointed_tensors(module).keys()  # names only: no copy of the weights
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{directory}/model.safetensors does not fit this model: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    result = module.load_state_dict(state, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys


# ---- RNG states ----------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Python, numpy and torch generators as tensors, lists and numbers (weights-only loadable)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(), "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_weights_only(obj: Any, path: Path) -> None:
    torch.save(obj, str(path))


def load_weights_only(path: Path) -> Any:
    """torch.load that refuses anything but tensors, containers and numbers (no pickled code)."""
    return torch.load(str(path), map_location="cpu", weights_only=True)


def latest_checkpoint(log_dir: str) -> Optional[Path]:
    found = complete_checkpoints(checkpoint_root(log_dir))
    return found[-1] if found else None
