"""The tiny VLA test fixtures: ~0.2 M parameter models of real VLA checkpoint families.

Each is built from configuration (no download) with a BPE tokenizer trained offline whose last
256 ids are OpenVLA-style action tokens, and a Llama language model. ``family`` picks the layout:

- ``llava``: a CLIP vision tower in transformers' Llava (image tokens in the prompt);
- ``idefics3``: transformers' Idefics3 (SmolVLM's class: SigLIP-like tower, pixel-shuffle
  connector, ``<fake_token_around_image><global-img><image>...`` in the prompt);
- ``prismatic``: OpenVLA's layout, remote code (``_vla_prismatic_remote.py`` copied next to the
  weights, ``auto_map`` in the config, ``norm_stats`` in it): patch embeddings inserted after
  the BOS token, a SentencePiece-style tokenizer whose "▁" plays Llama-2's token 29871.

``build_tiny_vla`` saves one with ``save_pretrained`` (model, processor,
``dataset_statistics.json``) into any directory; ``tiny_vla_path`` keeps one per spec under
``~/.cache/async_rl/tiny_vla/<hash>`` (``$XDG_CACHE_HOME`` respected). The policy then loads it
through the same ``model_path`` code as a real checkpoint (``vla_loading``).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from async_rl.errors import ConfigError
from async_rl.policies.vla_heads import NUM_BINS
from async_rl.policies.vla_loading import NORM_STATS_FILE, OPENVLA_PROMPT
from async_rl.user_cache import user_cache_dir

TINY_VLA_FORMAT = 3  # bump when build_tiny_vla changes what it writes (part of the cache key)


def _cache_root() -> Path:
    return user_cache_dir("tiny_vla")


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


IDEFICS3_TOKENS = ["<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]


def _tiny_tokenizer(vocab_size: int, extra_specials: tuple[str, ...] = (), sentencepiece: bool = False) -> Any:
    """A BPE tokenizer trained offline; its last NUM_BINS ids are action tokens. Byte-level, or
    with ``sentencepiece`` Llama-style ("▁" marks a word start and is a token of its own)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>", "<image>", *extra_specials]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if sentencepiece:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
        alphabet = ["\u2581"]
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - NUM_BINS, special_tokens=specials, show_progress=False,
                                  initial_alphabet=alphabet)
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


FAMILIES = ("llava", "idefics3", "prismatic")
REMOTE_MODULE = "modeling_tiny_prismatic"  # the name the prismatic fixture's code gets next to its weights


def tiny_vla_spec(image_size: int = 64, action_dim: int = 7, hidden_size: int = 64, num_layers: int = 2,
                  vision_hidden_size: int = 32, patch_size: int = 16, vocab_size: int = 768,
                  family: str = "llava") -> dict[str, Any]:
    """The parameters that define a tiny VLA (and its cache key)."""
    if image_size % patch_size:
        raise ConfigError(f"tiny VLA: image size {image_size} is not a multiple of its patch size {patch_size}; "
                          "render the env at a multiple of 16 (e.g. 64)")
    if family not in FAMILIES:  # the vla policy's options refuse a bad one first: here it is a caller's bug
        raise ValueError(f"tiny VLA: unknown family '{family}'; choose one of {', '.join(FAMILIES)}")
    return {"format": TINY_VLA_FORMAT, "image_size": image_size, "action_dim": action_dim, "hidden_size": hidden_size,
            "num_layers": num_layers, "vision_hidden_size": vision_hidden_size, "patch_size": patch_size,
            "vocab_size": vocab_size, "family": family}


def _text_config(s: dict[str, Any], tokenizer: Any, tie: bool = True) -> Any:
    """The tiny Llama language model's config (vocabulary: the tokenizer's, added tokens included)."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=s["hidden_size"], intermediate_size=2 * s["hidden_size"],
                       num_hidden_layers=s["num_layers"], num_attention_heads=4, num_key_value_heads=2,
                       vocab_size=len(tokenizer), max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=tie)


def _llava(s: dict[str, Any]) -> tuple[Callable[[], Any], Any]:
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer = _tiny_tokenizer(s["vocab_size"])
    vision = CLIPVisionConfig(hidden_size=s["vision_hidden_size"], intermediate_size=2 * s["vision_hidden_size"],
                              num_hidden_layers=s["num_layers"], num_attention_heads=2, image_size=s["image_size"],
                              patch_size=s["patch_size"], projection_dim=s["vision_hidden_size"])
    config = LlavaConfig(vision_config=vision, text_config=_text_config(s, tokenizer),
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                         vision_feature_select_strategy="default", vision_feature_layer=-1)
    size = {"height": s["image_size"], "width": s["image_size"]}
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": s["image_size"]}, crop_size=size)
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=s["patch_size"],
                               vision_feature_select_strategy="default", image_token="<image>",
                               num_additional_image_tokens=1)  # CLIP's CLS token, dropped by "default"
    return lambda: LlavaForConditionalGeneration(config), processor


def _idefics3(s: dict[str, Any]) -> tuple[Callable[[], Any], Any]:
    """SmolVLM's class: one global image per camera (no image splitting), pixel shuffle by 2."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
    )
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig

    tokenizer = _tiny_tokenizer(s["vocab_size"], tuple(IDEFICS3_TOKENS))
    scale = 2
    vision = Idefics3VisionConfig(hidden_size=s["vision_hidden_size"], intermediate_size=2 * s["vision_hidden_size"],
                                  num_hidden_layers=s["num_layers"], num_attention_heads=2, image_size=s["image_size"],
                                  patch_size=s["patch_size"])
    edge = {"longest_edge": s["image_size"]}
    image_processor = Idefics3ImageProcessorPil(do_image_splitting=False, size=edge, max_image_size=edge)
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                                  image_seq_len=(s["image_size"] // s["patch_size"] // scale) ** 2)
    config = Idefics3Config(vision_config=vision.to_dict(), text_config=_text_config(s, tokenizer).to_dict(),
                            scale_factor=scale, image_token_id=processor.image_token_id, tie_word_embeddings=True)
    return lambda: Idefics3ForConditionalGeneration(config), processor


def _prismatic(s: dict[str, Any]) -> tuple[Callable[[], Any], Any]:
    """OpenVLA's layout as remote code (``_vla_prismatic_remote``), with a Llama-style tokenizer
    and a plain processor (the prompt holds no image tokens: the model inserts the patches)."""
    from transformers import CLIPImageProcessorPil, CLIPProcessor

    remote = _remote_module()
    tokenizer = _tiny_tokenizer(s["vocab_size"], sentencepiece=True)
    config = remote.TinyPrismaticConfig(text_config=_text_config(s, tokenizer, tie=False).to_dict(),
                                        image_size=s["image_size"], patch_size=s["patch_size"],
                                        vision_hidden_size=s["vision_hidden_size"], pad_token_id=tokenizer.pad_token_id)
    config.auto_map = {"AutoConfig": f"{REMOTE_MODULE}.TinyPrismaticConfig",
                       "AutoModelForVision2Seq": f"{REMOTE_MODULE}.TinyPrismaticForActionPrediction"}
    size = {"height": s["image_size"], "width": s["image_size"]}
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": s["image_size"]}, crop_size=size)
    return lambda: remote.TinyPrismaticForActionPrediction(config), CLIPProcessor(image_processor, tokenizer)


def _remote_module() -> Any:
    from async_rl.policies import _vla_prismatic_remote

    return _vla_prismatic_remote


def tiny_vla_components(seed: int = 0, **spec: Any) -> tuple[Any, Any, dict]:
    """(model, processor, dataset statistics) of a tiny VLA of ``spec``'s family, built from
    configuration: its vision tower, a Llama language model, a BPE tokenizer trained here."""
    s = tiny_vla_spec(**spec)
    make_model, processor = {"llava": _llava, "idefics3": _idefics3, "prismatic": _prismatic}[s["family"]](s)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = make_model()
    # LIBERO's OSC controller takes [-1, 1] per dimension; the gripper stays in [0, 1] (mask false)
    # as in OpenVLA's LIBERO statistics. A real checkpoint brings its dataset's own numbers.
    d = s["action_dim"]
    stats = {"libero": {"action": {"q01": [-1.0] * (d - 1) + [0.0], "q99": [1.0] * d, "mask": [True] * (d - 1) + [False]}}}
    if s["family"] == "prismatic":  # OpenVLA keeps them in its config too
        model.config.norm_stats = stats
    return model, processor, stats


def build_tiny_vla(directory: str | Path, seed: int = 0, **spec: Any) -> Path:
    """Build a tiny VLA (``tiny_vla_components``) and ``save_pretrained`` it (model, processor
    and ``dataset_statistics.json``) into ``directory``; no download. Returns the path."""
    from transformers.utils import logging as hf_logging

    # save_pretrained's "Writing model shards" bar goes to stderr: a launch that builds a tiny VLA on first use and
    # then refuses its input must still print one line
    hf_logging.disable_progress_bar()
    model, processor, stats = tiny_vla_components(seed, **spec)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    if tiny_vla_spec(**spec)["family"] == "prismatic":  # remote code lives next to the weights, as OpenVLA's
        shutil.copyfile(_remote_module().__file__, directory / f"{REMOTE_MODULE}.py")
    (directory / NORM_STATS_FILE).write_text(json.dumps(stats, indent=1))
    (directory / "tiny_vla_spec.json").write_text(json.dumps(tiny_vla_spec(**spec)))
    return directory


def tiny_vla_path(**spec: Any) -> Path:
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
