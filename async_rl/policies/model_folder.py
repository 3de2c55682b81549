"""The check of a Hugging Face model folder a user names (``--model-path``), shared by the causal-LM and the VLA
policies: before Ray starts, one ConfigError line when it is not a folder with ``config.json``, transformers
cannot read that config, the model is not of a family the policy loads, or its tokenizer / processor files are
missing. transformers is imported inside the function: importing this module stays cheap."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from async_rl.errors import ConfigError
from async_rl.validation import checked_folder


def check_model_folder(model_path: str | Path, *, family: str, auto_class_mapping: str, tokenizer_files: Sequence[str],
                       fix: str, trust_remote_code: bool = False, remote_auto_class: Optional[str] = None,
                       unreadable_hint: str = "") -> Path:
    """``model_path`` as a Path when it holds a model of ``family``: one whose ``model_type`` is in transformers'
    ``auto_class_mapping`` (e.g. ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), or, with ``trust_remote_code``, whose
    config maps ``remote_auto_class`` to its own code (OpenVLA); and one of ``tokenizer_files``. Otherwise a
    ConfigError naming the flag, the folder, what is wrong and ``fix`` (``unreadable_hint`` added when
    transformers cannot read the config)."""
    from transformers import AutoConfig
    from transformers.models.auto import modeling_auto

    what = f"--model-path {model_path}"
    path = checked_folder(model_path, what, fix, holds=("config.json",))
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001  (any failure means: not a loadable model)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{what}: transformers cannot read its config ({first}); {fix}{unreadable_hint}") from None
    remote = trust_remote_code and remote_auto_class in (getattr(config, "auto_map", None) or {})
    if config.model_type not in getattr(modeling_auto, auto_class_mapping) and not remote:
        raise ConfigError(f"{what} holds a '{config.model_type}' model, not a {family}; {fix}")
    return checked_folder(path, what, fix, holds_one_of=tokenizer_files)
