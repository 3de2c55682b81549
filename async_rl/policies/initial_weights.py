"""A policy's starting weights from an export: what supervised fine-tuning (``launch/sft.py``) writes
and what an RL run's ``init_from`` reads.

An export is a folder with ``policy.safetensors`` (every tensor of the plain policy, LoRA deltas
merged into their base weights, so a run may put its own adapters on top) and ``policy.json``
(the policy's registered name and kwargs, the env it was trained for, and how it was made). The
policy is rebuilt from its own config as usual and the export's tensors are copied in; a tensor
the policy has and the export lacks, or one of another shape, is an error naming it.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, TypeVar

import pydantic
import torch
from safetensors.torch import load_file, save_file

from async_rl.errors import ConfigError
from async_rl.policies.lora import merged_named_tensors
from async_rl.user_cache import user_cache_dir
from async_rl.validation import checked_folder

PROJECT_ROOT = Path(__file__).resolve().parents[2]
WEIGHTS = "policy.safetensors"
META = "policy.json"
FORMAT = "async_rl.policy/1"


def export_policy(module: torch.nn.Module, directory: Path, meta: Mapping[str, Any]) -> Path:
    """Write ``module``'s weights (LoRA merged, plain names) and ``meta`` to ``directory``; files are
    renamed into place, the meta last, so a half-written export has no ``policy.json``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / META).unlink(missing_ok=True)
    merged = dict(merged_named_tensors(module))
    tensors = {}
    for name, value in module.state_dict().items():
        if ".lora_" in name:
            continue  # folded into its base weight
        plain = name.replace(".base_layer.", ".")
        # Tied weights (an LM head sharing the embedding) are one parameter but two state-dict names.
        tensor = merged.get(plain, value).detach().cpu()
        tensors[plain] = (tensor.float() if tensor.is_floating_point() else tensor).contiguous().clone()
    tmp = directory / (WEIGHTS + ".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(directory / WEIGHTS)
    tmp = directory / (META + ".tmp")
    tmp.write_text(json.dumps({"format": FORMAT, **meta}, indent=2) + "\n")
    tmp.replace(directory / META)
    return directory


class ExportMeta(pydantic.BaseModel, extra="allow"):
    """An export's ``policy.json``: this format, and what it was made for (policy, env, model, ...)."""

    format: Literal[FORMAT]  # type: ignore[valid-type]  # a Literal of a constant's values: pydantic reads them, mypy does not


def read_export_meta(path: str | Path) -> dict[str, Any]:
    """The export's ``policy.json``; ConfigError naming the problem for anything that is not an export."""
    # An unfinished export lacks policy.json (written last).
    directory = checked_folder(path, f"init_from {path}", "pass a folder written by launch/sft.py (a policy export)",
                               holds=(META, WEIGHTS))
    try:
        return ExportMeta.model_validate_json((directory / META).read_bytes()).model_dump()
    except (OSError, pydantic.ValidationError) as exc:
        problem = exc.errors()[0]["msg"] if isinstance(exc, pydantic.ValidationError) else exc
        raise ConfigError(f"init_from {path}: {META} is not a policy export's ({problem}); export the policy "
                          "again") from None


def resolve_export(path: str) -> Path:
    """``path`` as given, or, when it is relative and not found there, under the project's root (where
    the exports that ship with the project live, e.g. ``assets/...`` in a launch config)."""
    given = Path(path)
    shipped = PROJECT_ROOT / given
    return shipped if not given.exists() and not given.is_absolute() and shipped.exists() else given


# A GGUF file's conversion folder (policies/lm_loading.py): "<file stem>-<12 hex digits>", the digits hashed from the
# file's size and modification time, which a reinstall or another machine changes.
CONVERTED_GGUF = re.compile(r"(?P<stem>.+)-[0-9a-f]{12}")


def model_identity(model_path: str | None) -> Any:
    """What names a policy's base model across machines and installs: a tiny VLA's spec (its cache folder
    is machine-local), a converted GGUF file's name (not its conversion folder's key), else the model
    folder's name; None for a policy that loads no model."""
    if not model_path:
        return None
    path = Path(model_path)
    spec = path / "tiny_vla_spec.json"
    if spec.is_file():
        return json.loads(spec.read_text())
    converted = CONVERTED_GGUF.fullmatch(path.name)
    if converted and path.parent == user_cache_dir("lm"):
        return converted["stem"]
    return path.name


def same_model(saved: Any, current: Any) -> bool:
    """Whether an export's recorded base model is this run's. Exports written before identities left out
    the conversion key recorded the folder's whole name: its stem counts."""
    if saved == current:
        return True
    converted = CONVERTED_GGUF.fullmatch(saved) if isinstance(saved, str) else None
    return converted is not None and converted["stem"] == current


def check_init_from(path: str, policy: str, env: str, model_path: str | None = None) -> str:
    """Driver-side check of an RL run's ``init_from``: an export of the same policy for the same env,
    trained from the same base model; returns its absolute path (what the actors load)."""
    path = str(resolve_export(path))
    meta = read_export_meta(path)
    if "model" in meta and not same_model(meta["model"], model_identity(model_path)):
        raise ConfigError(f"init_from {path} was trained from another base model than this run's {model_path}; pass "
                          f"--init-from null (or an export made from that model)")
    check_export_made_for(meta, f"init_from {path}", policy=policy, env=env)
    return str(Path(path).resolve())


def check_export_made_for(meta: Mapping[str, Any], what: str, **wanted: str) -> None:
    """An export's ``policy.json`` (``meta``) records each of ``wanted`` (policy, env) as this run's; else a
    ConfigError naming ``what`` (the flag and path), the recorded value and the fix."""
    for key, value in wanted.items():
        if meta.get(key) != value:
            raise ConfigError(f"{what} was made for {key} '{meta.get(key)}', not this run's '{value}'; pass an export "
                              f"made for {key} '{value}' (or --{key} {meta.get(key)})")


P = TypeVar("P", bound=torch.nn.Module)


def load_initial_weights(policy: P, path: str | Path) -> P:
    """Copy an export's tensors into a freshly built plain policy (no LoRA yet); returns it."""
    saved = load_file(str(Path(path) / WEIGHTS))
    own = policy.state_dict()
    missing = sorted(set(own) - set(saved))
    wrong = sorted(n for n in own if n in saved and saved[n].shape != own[n].shape)
    if missing or wrong:
        detail = f"missing {missing[:3]}" if missing else \
            f"{wrong[0]} is {tuple(saved[wrong[0]].shape)} there, {tuple(own[wrong[0]].shape)} here"
        raise ValueError(f"the policy export {path} does not fit this policy ({detail}); was it made with "
                         f"other policy_kwargs or another model?")
    policy.load_state_dict({n: saved[n].to(own[n].dtype) for n in own}, strict=True)
    return policy


def initialized(factory: Callable[[], torch.nn.Module], path: str) -> torch.nn.Module:
    """``factory()`` with the export's weights: the policy factory of a run with ``init_from``."""
    return load_initial_weights(factory(), path)


def with_initial_weights(factory: Callable[[], torch.nn.Module], path: str | None) -> Callable[[], torch.nn.Module]:
    return factory if path is None else functools.partial(initialized, factory, str(path))
