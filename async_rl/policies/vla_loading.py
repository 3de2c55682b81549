"""Loading a VLA backbone and what comes with its checkpoint, from a local ``model_path``.

An OpenVLA checkpoint brings its own modeling code (``trust_remote_code: true``; its config's
``auto_map`` names the class); any model class transformers knows as
``AutoModelForImageTextToText`` (e.g. Llava, Idefics3 / SmolVLM) loads through that auto class. Next to the
weights: the processor (tokenizer + image processor) and the per-dataset action statistics
(``dataset_statistics.json``, or ``norm_stats`` in the config, as OpenVLA saves them).
transformers is imported inside the functions: importing this module stays cheap.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from async_rl.errors import ConfigError
from async_rl.policies.model_folder import check_model_folder

OPENVLA_PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
NORM_STATS_FILE = "dataset_statistics.json"  # the name OpenVLA saves next to its checkpoints
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "tokenizer.json", "tokenizer_config.json")


def check_model_dir(model_path: str | Path, trust_remote_code: bool = False) -> Path:
    """A local model directory transformers can load, or ConfigError naming what is wrong."""
    return check_model_folder(
        model_path, family="vision-language model (AutoModelForImageTextToText, or OpenVLA's code with "
        "trust_remote_code: true)", auto_class_mapping="MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
        tokenizer_files=PROCESSOR_FILES, remote_auto_class="AutoModelForVision2Seq",
        trust_remote_code=trust_remote_code,
        fix="pass a local directory holding a Hugging Face VLM checkpoint (config.json, weights, processor files)",
        unreadable_hint="" if trust_remote_code else " (OpenVLA needs policy_kwargs trust_remote_code: true)")


def load_norm_stats(model_path: str | Path, unnorm_key: Optional[str] = None) -> dict[str, list]:
    """The ``action`` statistics (q01, q99, mask) of ``unnorm_key`` from ``dataset_statistics.json``
    or the config's ``norm_stats`` (OpenVLA keeps them in both places)."""
    path = Path(model_path)
    stats = None
    if (path / NORM_STATS_FILE).is_file():
        stats = json.loads((path / NORM_STATS_FILE).read_text())
    elif (path / "config.json").is_file():
        stats = json.loads((path / "config.json").read_text()).get("norm_stats")
    if not stats:
        raise ConfigError(f"--model-path {model_path}: no action statistics ({NORM_STATS_FILE} or config norm_stats); "
                          "the continuous head needs q01/q99 per action dimension")
    if unnorm_key is None and len(stats) == 1:
        unnorm_key = next(iter(stats))
    if unnorm_key not in stats and f"{unnorm_key}_no_noops" in stats:  # as OpenVLA's LIBERO eval falls back
        unnorm_key = f"{unnorm_key}_no_noops"
    if unnorm_key not in stats:  # none given among several, or one the checkpoint has no statistics for
        given = "" if unnorm_key is None else f", not '{unnorm_key}'"
        raise ConfigError(f"--model-path {model_path} has action statistics for {sorted(stats)}{given}; "
                          "choose one with policy_kwargs unnorm_key")
    action = stats[unnorm_key]["action"]
    return {"q01": action["q01"], "q99": action["q99"], "mask": action.get("mask")}


def load_backbone(model_path: str | Path, dtype: str = "auto", trust_remote_code: bool = False) -> nn.Module:
    """The VLM, loaded the way its checkpoint expects.

    OpenVLA ships its own code (``auto_map`` -> ``AutoModelForVision2Seq``; transformers 5 no
    longer has that auto class, so the mapped class is loaded directly, with
    ``trust_remote_code``); any other VLM goes through ``AutoModelForImageTextToText``.
    """
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a "Loading weights" bar per actor clutters the run's output
    torch_dtype = {"auto": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    auto_map = getattr(config, "auto_map", None) or {}
    if trust_remote_code and "AutoModelForVision2Seq" in auto_map:
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        cls: Any = get_class_from_dynamic_module(auto_map["AutoModelForVision2Seq"], str(model_path))
        return cls.from_pretrained(model_path, dtype=torch_dtype, trust_remote_code=True)
    return AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch_dtype, trust_remote_code=trust_remote_code)


def load_processor(model_path: str | Path, trust_remote_code: bool = False) -> Any:
    """The checkpoint's processor (tokenizer and image processor)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_path, trust_remote_code=trust_remote_code)


def pixel_stats(image_processor: Any) -> tuple[list[float], list[float]]:
    """Mean/std per channel (``k*3`` for OpenVLA's fused backbones: the image is repeated k times)."""
    if hasattr(image_processor, "means"):  # OpenVLA's PrismaticImageProcessor
        return [x for m in image_processor.means for x in m], [x for s in image_processor.stds for x in s]
    return list(image_processor.image_mean), list(image_processor.image_std)


def image_size(image_processor: Any) -> tuple[int, int]:
    """(height, width) the model sees: CLIP-style ``crop_size``/``size``, Idefics3's square
    ``longest_edge`` (no image splitting), or OpenVLA's ``input_sizes``."""
    if hasattr(image_processor, "input_sizes"):  # OpenVLA's PrismaticImageProcessor: [[3, H, W], ...]
        return int(image_processor.input_sizes[0][1]), int(image_processor.input_sizes[0][2])
    for attr in ("crop_size", "max_image_size", "size"):
        size = getattr(image_processor, attr, None) or {}
        if "height" in size:
            return int(size["height"]), int(size["width"])
        if "longest_edge" in size:
            return int(size["longest_edge"]), int(size["longest_edge"])
    return 224, 224


def backbone_hidden_size(backbone: Any) -> int:
    """Hidden size of the backbone's language model (what the heads read)."""
    config = backbone.config
    text = getattr(config, "text_config", None) or getattr(config, "text_config_dict", None) or config
    return int(getattr(text, "hidden_size", None) or backbone.get_input_embeddings().embedding_dim)
