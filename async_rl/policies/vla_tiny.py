"""The tiny VLA test fixture: a ~0.2 M parameter model of a real VLA's structure.

A CLIP vision tower and a Llama language model in a Llava wrapper, with a byte-level BPE
tokenizer trained offline whose last 256 ids are OpenVLA-style action tokens, built from
configuration (no download). ``build_tiny_vla`` saves one with ``save_pretrained`` (model,
processor, ``dataset_statistics.json``) into any directory; ``tiny_vla_path`` keeps one per
spec under ``~/.cache/async_rl/tiny_vla/<hash>`` (``$XDG_CACHE_HOME`` respected). The policy
then loads it through the same ``model_path`` code as a real checkpoint (``vla_loading``).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from async_rl.errors import ConfigError
from async_rl.policies.vla_heads import NUM_BINS
from async_rl.policies.vla_loading import NORM_STATS_FILE, OPENVLA_PROMPT

TINY_VLA_FORMAT = 2  # bump when build_tiny_vla changes what it writes (part of the cache key)


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "async_rl" / "tiny_vla"


_TINY_CORPUS = [
    OPENVLA_PROMPT,
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "pick up the alphabet soup and place it in the basket; put the cream cheese in the bowl",
    "open the top drawer of the cabinet and put the bowl inside; close the middle drawer",
    "turn on the stove and put the moka pot on it; push the plate to the front of the stove",
    "put the wine bottle on top of the cabinet; put the wine bottle on the rack",
    "pick up the ketchup, tomato sauce, butter, milk, orange juice, chocolate pudding, salad dressing, bbq sauce",
    "put the yellow and white mug in the microwave and close it; put the white mug on the left plate",
    "pick up the book and place it in the back compartment of the caddy; frying pan; cookie box; wooden tray",
    "next to the cookie box on the wooden cabinet at the table center of the flat stove; red; left; right",
]


def _tiny_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE tokenizer trained offline; its last NUM_BINS ids are action tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>", "<image>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - NUM_BINS, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_TINY_CORPUS, trainer)
    # Append the action tokens to the BPE vocabulary itself (no merge produces them, like the
    # rarely used ids OpenVLA overwrites), so they are the last NUM_BINS ids of ``vocab_size``.
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for i in range(NUM_BINS):
        vocab[f"<act_{i}>"] = len(vocab)
    tok = Tokenizer.from_str(json.dumps(data))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", extra_special_tokens={"image_token": "<image>"},
                                   padding_side="left")


def tiny_vla_spec(image_size: int = 64, action_dim: int = 7, hidden_size: int = 64, num_layers: int = 2,
                  vision_hidden_size: int = 32, patch_size: int = 16, vocab_size: int = 768) -> dict[str, int]:
    """The parameters that define a tiny VLA (and its cache key)."""
    if image_size % patch_size:
        raise ConfigError(f"tiny VLA: image size {image_size} is not a multiple of its patch size {patch_size}; "
                          "render the env at a multiple of 16 (e.g. 64)")
    return {"format": TINY_VLA_FORMAT, "image_size": image_size, "action_dim": action_dim, "hidden_size": hidden_size,
            "num_layers": num_layers, "vision_hidden_size": vision_hidden_size, "patch_size": patch_size,
            "vocab_size": vocab_size}


def tiny_vla_components(seed: int = 0, **spec: int) -> tuple[nn.Module, Any, dict]:
    """(model, processor, dataset statistics) of a tiny Llava-structured VLA built from
    configuration: CLIP vision tower, Llama language model, byte-level BPE tokenizer."""
    from transformers import (CLIPImageProcessorPil, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)

    s = tiny_vla_spec(**spec)
    tokenizer = _tiny_tokenizer(s["vocab_size"])
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    vision = CLIPVisionConfig(hidden_size=s["vision_hidden_size"], intermediate_size=2 * s["vision_hidden_size"],
                              num_hidden_layers=s["num_layers"], num_attention_heads=2, image_size=s["image_size"],
                              patch_size=s["patch_size"], projection_dim=s["vision_hidden_size"])
    text = LlamaConfig(hidden_size=s["hidden_size"], intermediate_size=2 * s["hidden_size"],
                       num_hidden_layers=s["num_layers"], num_attention_heads=4, num_key_value_heads=2,
                       vocab_size=len(tokenizer), max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=image_token_id,
                         vision_feature_select_strategy="default", vision_feature_layer=-1)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
    size = {"height": s["image_size"], "width": s["image_size"]}
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": s["image_size"]}, crop_size=size)
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=s["patch_size"],
                               vision_feature_select_strategy="default", image_token="<image>",
                               num_additional_image_tokens=1)  # CLIP's CLS token, dropped by "default"
    # LIBERO's OSC controller takes [-1, 1] per dimension; the gripper stays in [0, 1] (mask false)
    # as in OpenVLA's LIBERO statistics. A real checkpoint brings its dataset's own numbers.
    d = s["action_dim"]
    stats = {"libero": {"action": {"q01": [-1.0] * (d - 1) + [0.0], "q99": [1.0] * d, "mask": [True] * (d - 1) + [False]}}}
    return model, processor, stats


def build_tiny_vla(directory: str | Path, seed: int = 0, **spec: int) -> Path:
    """Build a tiny VLA (``tiny_vla_components``) and ``save_pretrained`` it (model, processor
    and ``dataset_statistics.json``) into ``directory``; no download. Returns the path."""
    model, processor, stats = tiny_vla_components(seed, **spec)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    (directory / NORM_STATS_FILE).write_text(json.dumps(stats, indent=1))
    (directory / "tiny_vla_spec.json").write_text(json.dumps(tiny_vla_spec(**spec)))
    return directory


def tiny_vla_path(**spec: int) -> Path:
    """The cached tiny VLA for ``spec`` (built on first use; concurrent builders are safe)."""
    s = tiny_vla_spec(**spec)
    import transformers

    key = hashlib.sha256(json.dumps({**s, "transformers": transformers.__version__}, sort_keys=True).encode()).hexdigest()[:16]
    target = _cache_root() / key
    if (target / "tiny_vla_spec.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=target.parent))
    try:
        build_tiny_vla(tmp, **{k: v for k, v in s.items() if k != "format"})
        try:
            tmp.rename(target)  # atomic; another builder may have won the race
        except OSError:
            if not (target / "tiny_vla_spec.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
