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

A save is written under ``.tmp-...``; ``commit`` writes ``meta.json`` (with every file's size)
last, fsyncs every file and directory, and renames the directory into place; a checkpoint is
removed only after its successor is committed, by renaming it to ``.trash-...`` first. So a
kill (or power loss) at any point leaves every checkpoint ``complete_checkpoints`` lists whole;
only the last ``keep`` complete ones are kept. Saving an epoch again (a resumed run that ends
before training one) commits ``epoch-000012-1``, newer than ``epoch-000012``.
"""
from __future__ import annotations

import copy
import json
import os
import random
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tensordict import TensorDict

from async_rl.errors import ConfigError
from async_rl.renamed_keys import saved_config_now

if TYPE_CHECKING:
    import pydantic

META = "meta.json"
PREFIX = "epoch-"
FORMAT = 1
# Keys that fix the shapes of what a checkpoint holds, and the seed its RNG streams derive from;
# a resume must use the same values.
SHAPE_KEYS = ("env", "env_kwargs", "policy", "policy_kwargs", "lora_rank", "lora_target_modules", "lora_trainable",
              "advantage", "num_trainers", "rollout_steps", "precision", "seed",
              "normalize_advantages_per")  # "task": stored steps carry a task field
# policy_kwargs entries a policy's prepare hook fills in before the run (the resolved model
# directory): a saved config holds them, the command line that resumes it does not.
RESOLVED_POLICY_KWARGS = ("model_path",)


def checkpoint_root(log_dir: str) -> Path:
    return Path(log_dir) / "checkpoints"


def _order(path: Path) -> tuple[int, int]:
    """(epoch, re-save) of ``epoch-000012`` or ``epoch-000012-1``; names that are neither sort first."""
    epoch, _, again = path.name[len(PREFIX):].partition("-")
    try:
        return int(epoch), int(again or 0)
    except ValueError:
        return -1, 0


def complete_checkpoints(root: Path) -> list[Path]:
    """Committed checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / META).is_file()]
    return sorted(found, key=lambda p: (_order(p), p.name))


def staging_dir(root: Path, epoch: int) -> Path:
    """A fresh temporary directory for the save of ``epoch`` (renamed by ``commit``)."""
    path = root / f".tmp-{PREFIX}{epoch:06d}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    return path


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory's entries: a rename or a new file survives a power loss)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_tree(root: Path) -> dict[str, int]:
    """fsync every file and directory under ``root`` (other processes wrote most of them: the
    trainers and the replay buffer); returns each file's size by relative path."""
    sizes = {}
    for directory, _, files in os.walk(root, topdown=False):  # a directory after its entries
        for name in files:
            path = Path(directory, name)
            fsync_path(path)
            sizes[str(path.relative_to(root))] = path.stat().st_size
        fsync_path(Path(directory))
    return sizes


def _final_name(root: Path, epoch: int) -> Path:
    """``epoch-000012``, or ``epoch-000012-<n>`` when that epoch was committed before: the older
    one stays until this one is committed (pruning removes it then)."""
    final, again = root / f"{PREFIX}{epoch:06d}", 0
    while final.exists():
        again += 1
        final = root / f"{PREFIX}{epoch:06d}-{again}"
    return final


def _remove(path: Path) -> None:
    """Delete a checkpoint so that a kill half-way never leaves a torn one listed: out of the
    listing by an atomic rename first, then deleted."""
    trash = path.parent / f".trash-{path.name}-{uuid.uuid4().hex[:8]}"
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def commit(staging: Path, meta: Mapping[str, Any], keep: int) -> Path:
    """Write ``meta.json`` last (with the size of every file), fsync everything, rename the
    staging dir into place and prune to the newest ``keep``."""
    root = staging.parent
    meta = {**meta, "files": _sync_tree(staging)}
    tmp_meta = staging / (META + ".tmp")
    with open(tmp_meta, "w") as f:
        f.write(json.dumps(meta, indent=1, sort_keys=True, default=str))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp_meta, staging / META)
    fsync_path(staging)
    final = _final_name(root, int(meta["epoch"]))
    os.rename(staging, final)
    fsync_path(root)  # the rename itself survives a power loss
    for old in complete_checkpoints(root)[:-keep]:
        _remove(old)
    return final


def discard_staging(root: Path) -> None:
    """Remove unfinished saves and half-deleted checkpoints (left by a kill or a failed save)."""
    if root.is_dir():
        for path in root.iterdir():
            if path.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(path, ignore_errors=True)


def verify(path: Path) -> None:
    """Raise ConfigError if a file ``meta.json`` lists is missing or has another size."""
    for name, size in read_meta(path).get("files", {}).items():
        actual = (path / name).stat().st_size if (path / name).is_file() else None
        if actual != size:
            found = "missing" if actual is None else f"{actual} bytes, not {size}"
            raise ConfigError(f"--resume {path}: {name} is {found} (damaged checkpoint); pass an older one")


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
    """A checkpoint's meta.json, its saved config under today's keys (``async_rl/renamed_keys.py``)."""
    meta = json.loads((path / META).read_text())
    if isinstance(meta.get("config"), dict):
        meta["config"] = saved_config_now(meta["config"])
    return meta


def trained_config(checkpoint: Path, key: str, expected: str) -> dict[str, Any]:
    """The config ``checkpoint`` (a ``--checkpoint`` argument) was trained with; ConfigError unless it
    is readable, its ``key`` is ``expected`` (e.g. ``policy`` ``causal_lm``) and the weights are there."""
    try:
        config = read_meta(checkpoint)["config"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"--checkpoint {checkpoint}: unreadable {META} ({exc!r}); pass another checkpoint") from None
    if config.get(key) != expected:
        raise ConfigError(f"--checkpoint {checkpoint}: a run of {key} '{config.get(key)}', not {expected}")
    if not (checkpoint / "model.safetensors").is_file():
        raise ConfigError(f"--checkpoint {checkpoint}: no model.safetensors (damaged checkpoint); pass an older one")
    return config


def check_resumable(path: Path, cfg: pydantic.BaseModel) -> None:
    """Raise ConfigError if ``cfg`` (the run config, read through its ``model_dump``) cannot continue the run saved
    at ``path``."""
    try:
        meta = read_meta(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--resume {path}: unreadable {META} ({exc}); pass another checkpoint") from None
    if meta.get("format") != FORMAT:
        raise ConfigError(f"--resume {path}: checkpoint format {meta.get('format')!r}, this version reads {FORMAT}")
    verify(path)
    saved, current = dict(meta["config"]), cfg.model_dump()
    for config in (saved, current):
        config["policy_kwargs"] = {k: v for k, v in (config.get("policy_kwargs") or {}).items()
                                   if k not in RESOLVED_POLICY_KWARGS}
    if saved.get("model_path") and not current.get("model_path"):  # else the default model would be built
        raise ConfigError(f"--resume {path}: it was written with model_path={saved['model_path']!r}; pass "
                          "--model-path with that model (its directory may have moved)")
    for key in SHAPE_KEYS:
        if key in saved and saved[key] != current.get(key):
            raise ConfigError(f"--resume {path}: it was written with {key}={saved[key]!r} but this run has "
                              f"{key}={current.get(key)!r}; pass --{key.replace('_', '-')} with the saved value")


# ---- TensorDicts as safetensors ------------------------------------------------------------
def save_tensordict(td: TensorDict, path: Path) -> None:
    """Leaves under '/'-joined keys; the batch size goes in the file's metadata."""
    leaves = {"/".join(k if isinstance(k, tuple) else (k,)): v.contiguous()
              for k, v in td.items(include_nested=True, leaves_only=True)}
    save_file(leaves, str(path), metadata={"batch_size": json.dumps(list(td.batch_size))})  # type: ignore[arg-type]  # leaves only: Tensors


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
    trainable ones and the persistent buffers (the frozen base is rebuilt from the config;
    non-persistent buffers such as rotary frequencies are rebuilt with it)."""
    state = module.state_dict(keep_vars=True)  # references, no copies
    if not has_lora(module):
        return state
    tensors: dict[str, torch.Tensor] = {n: p for n, p in module.named_parameters() if p.requires_grad}
    tensors.update({n: b for n, b in module.named_buffers() if n in state})
    return tensors


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint must hold to restore ``module``, as detached contiguous CPU copies."""
    return {k: v.detach().cpu().contiguous() for k, v in _checkpointed_tensors(module).items()}


def save_model(module: torch.nn.Module, directory: Path) -> None:
    save_file(trainable_state(module), str(directory / "model.safetensors"))
    if has_lora(module):
        save_adapter(module, directory / "adapter")


def save_adapter(module: torch.nn.Module, adapter: Path) -> None:
    """The LoRA adapters in peft's format, relative to the Hugging Face model the policy holds
    (``hf_model_attr``): ``PeftModel.from_pretrained(AutoModel....from_pretrained(base), adapter)`` loads every
    tensor, and ``base_model_name_or_path`` names that base. Tensors outside that model (a value head) and
    tensors trained whole are not adapters: they stay in model.safetensors only."""
    from peft import get_peft_model_state_dict  # noqa: PLC0415 (peft imports transformers: only LoRA runs save adapters)

    root = getattr(module, "hf_model_attr", "")
    prefix = f"{root}." if root else ""
    model = module.get_submodule(root) if root else module
    config: Any = copy.deepcopy(module.peft_config["default"])  # type: ignore[index]  # peft's attribute, unknown to torch's types
    adapted = sorted(name[len(prefix):].rpartition(".lora_A")[0]
                     for name, _ in module.named_parameters() if name.startswith(prefix) and ".lora_A." in name)
    leaves = sorted({name.rpartition(".")[2] for name in adapted})
    # peft matches a list by name suffix: the leaf names when they pick exactly the adapted layers, else the full names.
    every_leaf = [name for name, _ in model.named_modules() if name.rpartition(".")[2] in leaves]
    config.target_modules = leaves if sorted(every_leaf) == adapted else adapted
    config.base_model_name_or_path = getattr(model, "name_or_path", None) or None
    config.inference_mode = True
    adapter.mkdir()
    config.save_pretrained(str(adapter))
    # Key names as PeftModel.save_pretrained writes them: the adapted model sits at base_model.model.
    state = {f"base_model.model.{k[len(prefix):]}": v.detach().cpu().contiguous()
             for k, v in get_peft_model_state_dict(module).items() if k.startswith(prefix)}
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
    legacy = np.random.get_state(legacy=True)
    assert isinstance(legacy, tuple)  # (kind, keys, pos, has_gauss, gauss)
    kind, keys, pos, has_gauss, gauss = legacy
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


def resolve_checkpoint(path: str) -> Path:
    """The checkpoint an evaluation's ``--checkpoint`` names: a checkpoint dir, a dir of them, or a
    run's log dir (the newest); ConfigError otherwise."""
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"--checkpoint {path}: no such directory; pass a run's log dir or one of its checkpoints")
    if (p / META).is_file():
        return p
    found = complete_checkpoints(p) or complete_checkpoints(checkpoint_root(str(p)))
    if not found:
        raise ConfigError(f"--checkpoint {path}: no checkpoint there (no {META} in it, in an {PREFIX}* dir "
                          "or under checkpoints/); pass a run's log dir written with checkpoints")
    return found[-1]


def latest_checkpoint(log_dir: str) -> Optional[Path]:
    found = complete_checkpoints(checkpoint_root(log_dir))
    return found[-1] if found else None
