"""Vision-language-action actor-critic on a Hugging Face VLM (seed 004 sections 2 and 3).

The backbone is a vision-language model loaded with transformers from a local directory
(``model_path``): an OpenVLA checkpoint (its own remote code, ``trust_remote_code: true``) or a
model class transformers knows (``AutoModelForImageTextToText``, e.g. Llava). Both heads and
the value head read the language model's last hidden state at the last prompt token (prompts
are left-padded, so that is the last position).

- ``head: continuous`` (policy ``vla``): a Gaussian mean and log-std per action dimension,
  ``action = tanh(u)`` in [-1, 1] is what is trained on; ``env_action`` is un-normalised with
  the checkpoint's per-dimension q01/q99 statistics as OpenVLA does, and the gripper is
  binarised and inverted as OpenVLA's LIBERO evaluation does.
- ``head: discrete`` (policy ``vla_discrete``): OpenVLA's action tokens. Each action dimension
  is one of 256 bins, emitted autoregressively as one of the last 256 ids of the tokenizer's
  vocabulary; sampling is Categorical over those 256 logits. Experience keeps
  ``action_token`` (token ids) and ``behaviour_logits``; training re-reads the logits of the
  stored tokens in one teacher-forced pass.

Rollout workers hold only the processor (``VLAPreprocessor``): images stay uint8 on the wire
and are normalised on the model side; the prompt is tokenised once per instruction and
left-padded to ``max_prompt_tokens`` with an attention mask, so observations stack and
concatenate as fixed-shape tensors.

Without ``model_path`` a tiny VLA of the same structure (CLIP vision tower + Llama language
model in a Llava wrapper, a byte-level BPE tokenizer trained offline) is built from
configuration, saved with ``save_pretrained`` under ``~/.cache/async_rl/tiny_vla/<hash>``
(``$XDG_CACHE_HOME`` respected) and loaded through the same ``model_path`` code as a real
checkpoint. ``build_tiny_vla`` builds one into any directory (benchmarks use it).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal, Mapping, Optional, Sequence

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from async_rl.algo import categorical_entropy, tanh_gaussian_entropy, tanh_gaussian_log_prob
from async_rl.errors import ConfigError
from async_rl.policies import register_policy
from async_rl.policies.base import ActorCritic, ObsSpec

NUM_BINS = 256  # OpenVLA: 256 bins per action dimension, the last 256 ids of the vocabulary
OPENVLA_PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
NORM_STATS_FILE = "dataset_statistics.json"  # the name OpenVLA saves next to its checkpoints
TINY_VLA_FORMAT = 2  # bump when build_tiny_vla changes what it writes (part of the cache key)
Head = Literal["continuous", "discrete"]


# ---- actions -------------------------------------------------------------------------------
class ActionNormalizer:
    """OpenVLA's action (un)normalisation: per-dimension q01/q99 bounds and a mask.

    Dimensions with ``mask`` true map [-1, 1] linearly onto [q01, q99]; the others (the
    gripper) pass through. ``gripper: openvla_libero`` then does what OpenVLA's LIBERO
    evaluation does with the last dimension: [0, 1] -> [-1, 1], binarise with sign, and
    invert (LIBERO's -1 is open, the training data's 0 is closed).
    """

    def __init__(self, q01: Sequence[float], q99: Sequence[float], mask: Optional[Sequence[bool]] = None,
                 gripper: Literal["openvla_libero", "none"] = "openvla_libero") -> None:
        self.q01 = torch.as_tensor(q01, dtype=torch.float32)
        self.q99 = torch.as_tensor(q99, dtype=torch.float32)
        self.mask = torch.ones_like(self.q01, dtype=torch.bool) if mask is None else torch.as_tensor(mask, dtype=torch.bool)
        if not (self.q01.shape == self.q99.shape == self.mask.shape) or self.q01.ndim != 1:
            raise ValueError(f"norm stats q01 {tuple(self.q01.shape)}, q99 {tuple(self.q99.shape)} and mask "
                             f"{tuple(self.mask.shape)} must be vectors of one length")
        self.gripper = gripper

    def unnormalize(self, action: torch.Tensor) -> torch.Tensor:
        """[-1, 1] -> the dataset's scale (before gripper handling)."""
        q01, q99, mask = (t.to(action.device) for t in (self.q01, self.q99, self.mask))
        scaled = 0.5 * (action.float() + 1.0) * (q99 - q01) + q01
        return torch.where(mask, scaled, action.float())

    def normalize(self, raw: torch.Tensor) -> torch.Tensor:
        """Inverse of ``unnormalize`` on [q01, q99] (for tests and data preparation)."""
        q01, q99, mask = (t.to(raw.device) for t in (self.q01, self.q99, self.mask))
        scaled = 2.0 * (raw.float() - q01) / (q99 - q01).clamp_min(1e-8) - 1.0
        return torch.where(mask, scaled, raw.float())

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        """The action the environment receives."""
        out = self.unnormalize(action)
        if self.gripper == "openvla_libero":
            g = torch.sign(2.0 * out[..., -1] - 1.0)  # normalize_gripper_action(binarize=True)
            g = torch.where(g == 0, torch.ones_like(g), g)
            out = torch.cat([out[..., :-1], -g.unsqueeze(-1)], dim=-1)  # invert_gripper_action
        return out


def bin_centers() -> torch.Tensor:
    """OpenVLA's 255 bin centres in [-1, 1]."""
    bins = torch.linspace(-1.0, 1.0, NUM_BINS, dtype=torch.float64)
    return ((bins[:-1] + bins[1:]) / 2.0).float()


def tokens_to_normalized(tokens: torch.Tensor, vocab_end: int) -> torch.Tensor:
    """Action token ids -> normalised actions, exactly as OpenVLA's ``predict_action`` decodes."""
    centers = bin_centers().to(tokens.device)
    index = (vocab_end - tokens - 1).clamp(0, centers.numel() - 1)
    return centers[index]


def normalized_to_tokens(action: torch.Tensor, vocab_end: int) -> torch.Tensor:
    """Normalised actions -> token ids, as OpenVLA's ``ActionTokenizer`` encodes."""
    bins = torch.linspace(-1.0, 1.0, NUM_BINS, dtype=torch.float64).to(action.device)
    return vocab_end - torch.bucketize(action.double().clamp(-1.0, 1.0), bins, right=True).clamp(1, NUM_BINS)


# ---- model directories -----------------------------------------------------------------------
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


def check_model_dir(model_path: str | Path, trust_remote_code: bool = False) -> Path:
    """A local model directory transformers can load, or ConfigError naming what is wrong."""
    path = Path(model_path).expanduser()
    hint = "pass a local directory holding a Hugging Face VLM checkpoint (config.json, weights, processor files)"
    if not path.is_dir():
        raise ConfigError(f"--model-path {model_path}: no such directory; {hint}")
    if not (path / "config.json").is_file():
        raise ConfigError(f"--model-path {model_path}: no config.json there, so it is not a model; {hint}")
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001  (any failure means: not a loadable model)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"--model-path {model_path}: transformers cannot read its config ({first}); {hint}"
                          f"{'' if trust_remote_code else ' (OpenVLA needs policy_kwargs trust_remote_code: true)'}") from None
    remote = trust_remote_code and "AutoModelForVision2Seq" in (getattr(config, "auto_map", None) or {})
    if config.model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES and not remote:
        raise ConfigError(f"--model-path {model_path} holds a '{config.model_type}' model, not a vision-language "
                          f"model (AutoModelForImageTextToText, or OpenVLA's code with trust_remote_code: true); {hint}")
    if not any((path / f).is_file() for f in ("preprocessor_config.json", "processor_config.json", "tokenizer.json",
                                                "tokenizer_config.json")):
        raise ConfigError(f"--model-path {model_path}: no processor/tokenizer files; {hint}")
    return path


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
    if unnorm_key is None:
        if len(stats) != 1:
            raise ConfigError(f"--model-path {model_path} has statistics for {sorted(stats)}; "
                              "choose one with policy_kwargs unnorm_key")
        unnorm_key = next(iter(stats))
    if unnorm_key not in stats and f"{unnorm_key}_no_noops" in stats:  # as OpenVLA's LIBERO eval falls back
        unnorm_key = f"{unnorm_key}_no_noops"
    if unnorm_key not in stats:
        raise ConfigError(f"unnorm_key '{unnorm_key}' not in {sorted(stats)} ({model_path})")
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

        cls = get_class_from_dynamic_module(auto_map["AutoModelForVision2Seq"], str(model_path))
        return cls.from_pretrained(model_path, dtype=torch_dtype, trust_remote_code=True)
    return AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch_dtype, trust_remote_code=trust_remote_code)


def load_processor(model_path: str | Path, trust_remote_code: bool = False) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_path, trust_remote_code=trust_remote_code)


def _pixel_stats(image_processor: Any) -> tuple[list[float], list[float]]:
    """Mean/std per channel (``k*3`` for OpenVLA's fused backbones: the image is repeated k times)."""
    if hasattr(image_processor, "means"):  # OpenVLA's PrismaticImageProcessor
        return [x for m in image_processor.means for x in m], [x for s in image_processor.stds for x in s]
    return list(image_processor.image_mean), list(image_processor.image_std)


# ---- worker side -----------------------------------------------------------------------------
class VLAPreprocessor:
    """Raw LIBERO observation -> fixed-shape model inputs: ``pixel_values`` uint8
    ``[cameras, 3, H, W]``, ``input_ids``/``attention_mask`` int64 ``[max_prompt_tokens]``
    (left-padded). Holds the processor only, never model weights."""

    def __init__(self, obs_spec: ObsSpec, model_path: str, cameras: Sequence[str] = ("agentview",),
                 prompt: str = OPENVLA_PROMPT, max_prompt_tokens: int = 64, trust_remote_code: bool = False,
                 **_policy_kwargs: Any) -> None:
        self.processor = load_processor(model_path, trust_remote_code)
        self.processor.tokenizer.padding_side = "left"
        image_processor = self.processor.image_processor
        crop = getattr(image_processor, "crop_size", None) or getattr(image_processor, "size", None) or {}
        self.size = (int(crop.get("height", 224)), int(crop.get("width", 224)))
        self.cameras, self.prompt, self.max_tokens = list(cameras), prompt, int(max_prompt_tokens)
        self._image_processor = image_processor
        self._tokens: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def _prompt_tokens(self, instruction: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenised prompt of one instruction, cached (it changes only with the task)."""
        if instruction not in self._tokens:
            image_token = getattr(self.processor, "image_token", None)
            text = (image_token or "") * len(self.cameras) + self.prompt.format(instruction=instruction.lower())
            dummy = [np.zeros((*self.size, 3), dtype=np.uint8)] * len(self.cameras)
            enc = self.processor(text=text, images=dummy, return_tensors="np")
            ids, mask = enc["input_ids"][0], enc["attention_mask"][0]
            if len(ids) > self.max_tokens:
                raise ValueError(f"the prompt of '{instruction}' is {len(ids)} tokens (image tokens included), more than "
                                 f"max_prompt_tokens={self.max_tokens}; raise policy_kwargs max_prompt_tokens")
            pad = self.max_tokens - len(ids)
            pad_id = self.processor.tokenizer.pad_token_id or 0
            self._tokens[instruction] = (torch.as_tensor(np.concatenate([np.full(pad, pad_id), ids]), dtype=torch.int64),
                                         torch.as_tensor(np.concatenate([np.zeros(pad), mask]), dtype=torch.int64))
        return self._tokens[instruction]

    def _image(self, image: np.ndarray) -> torch.Tensor:
        image = np.asarray(image)
        if image.shape[:2] != self.size:  # resize/crop with the processor, but keep uint8 on the wire
            out = self._image_processor(images=[image], do_rescale=False, do_normalize=False, return_tensors="np")
            return torch.as_tensor(np.clip(np.rint(out["pixel_values"][0]), 0, 255).astype(np.uint8))
        return torch.as_tensor(np.ascontiguousarray(image.transpose(2, 0, 1)))

    def __call__(self, obs: Mapping[str, Any], task_name: str) -> TensorDict:
        ids, mask = self._prompt_tokens(str(obs["instruction"]))
        pixels = torch.stack([self._image(obs[c]) for c in self.cameras])
        return TensorDict({"pixel_values": pixels, "input_ids": ids, "attention_mask": mask}, batch_size=[])


# ---- model side ------------------------------------------------------------------------------
class VLAActorCritic(ActorCritic):
    """A VLM backbone plus an action head (``continuous`` or ``discrete``) and a value head.

    It takes the same kwargs as ``VLAPreprocessor`` (one ``policy_kwargs`` for both), so
    ``prompt`` and ``max_prompt_tokens`` are accepted here although only the worker uses them.
    """

    def __init__(self, obs_spec: ObsSpec, action_dim: int, model_path: str, head: Head = "continuous",
                 cameras: Sequence[str] = ("agentview",), prompt: str = OPENVLA_PROMPT, max_prompt_tokens: int = 64,
                 unnorm_key: Optional[str] = None, gripper: Literal["openvla_libero", "none"] = "openvla_libero",
                 value_hidden: int = 256, init_log_std: float = -1.0, min_log_std: float = -5.0, max_log_std: float = 0.5,
                 dtype: Literal["auto", "float32", "bfloat16"] = "auto", trust_remote_code: bool = False) -> None:
        super().__init__()
        if head not in ("continuous", "discrete"):
            raise ValueError(f"head must be 'continuous' or 'discrete', got {head!r}")
        self.head, self.action_dim = head, int(action_dim)
        self.action_key = "action" if head == "continuous" else "action_token"
        self.backbone = load_backbone(model_path, dtype, trust_remote_code)
        processor = load_processor(model_path, trust_remote_code)
        mean, std = _pixel_stats(processor.image_processor)
        self.register_buffer("pixel_mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)
        hidden = self._hidden_size()
        self.normalizer = ActionNormalizer(**load_norm_stats(model_path, unnorm_key), gripper=gripper)
        if self.normalizer.q01.numel() != self.action_dim:
            raise ValueError(f"{model_path}: action statistics have {self.normalizer.q01.numel()} dimensions, "
                             f"the environment {self.action_dim}")
        if head == "continuous":
            self.action_head = nn.Linear(hidden, 2 * self.action_dim)
            with torch.no_grad():
                nn.init.orthogonal_(self.action_head.weight, gain=0.01)
                self.action_head.bias.zero_()
                self.action_head.bias[self.action_dim:] = init_log_std
        # OpenVLA: the action tokens are the last NUM_BINS ids of the tokenizer's base vocabulary.
        self.vocab_end = int(processor.tokenizer.vocab_size)
        self.min_log_std, self.max_log_std = min_log_std, max_log_std
        self.value_head = nn.Sequential(nn.Linear(hidden, value_hidden), nn.Tanh(), nn.Linear(value_hidden, 1))
        with torch.no_grad():
            nn.init.orthogonal_(self.value_head[2].weight, gain=1.0)
            self.value_head[2].bias.zero_()
        self._keep_logits = "logits_to_keep" in inspect.signature(self.backbone.forward).parameters

    def _hidden_size(self) -> int:
        config = self.backbone.config
        text = getattr(config, "text_config", None) or getattr(config, "text_config_dict", None) or config
        return int(getattr(text, "hidden_size", None) or self.backbone.get_input_embeddings().embedding_dim)

    # ---- backbone ------------------------------------------------------------------------
    def _pixels(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """uint8 [B, cams, 3, H, W] -> normalised [B*cams, C, H, W] (C = 3k for fused backbones)."""
        b, cams = pixel_values.shape[:2]
        x = pixel_values.reshape(b * cams, *pixel_values.shape[2:]).to(self.pixel_mean.dtype) / 255.0
        repeats = self.pixel_mean.shape[1] // x.shape[1]
        return (x.repeat(1, repeats, 1, 1) - self.pixel_mean) / self.pixel_std

    def _run(self, input_ids, attention_mask, pixel_values=None, past=None, keep: int = 1, hidden: bool = True):
        position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
        if past is not None:
            position_ids = position_ids[:, -input_ids.shape[1]:]
        kwargs = {"logits_to_keep": keep} if self._keep_logits else {}
        return self.backbone(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values,
                             position_ids=position_ids, past_key_values=past, use_cache=past is not None or not hidden,
                             output_hidden_states=hidden, return_dict=True, **kwargs)

    def _action_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits[..., self.vocab_end - NUM_BINS : self.vocab_end].float()

    def _value(self, last_hidden: torch.Tensor) -> torch.Tensor:
        return self.value_head(last_hidden).squeeze(-1).float()

    def _gaussian(self, last_hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, log_std = self.action_head(last_hidden).float().chunk(2, dim=-1)
        return mu, log_std.clamp(self.min_log_std, self.max_log_std)

    # ---- ActorCritic ---------------------------------------------------------------------
    def act(self, obs: TensorDict, deterministic: bool | torch.Tensor = False) -> TensorDict:
        ids, mask = obs["input_ids"], obs["attention_mask"]
        det = torch.as_tensor(deterministic, device=ids.device).reshape(-1).expand(ids.shape[0])
        if self.head == "continuous":
            out = self._run(ids, mask, self._pixels(obs["pixel_values"]))
            last = out.hidden_states[-1][:, -1]
            mu, log_std = self._gaussian(last)
            pre_tanh = torch.where(det.unsqueeze(-1), mu, mu + log_std.exp() * torch.randn_like(mu))
            action = torch.tanh(pre_tanh)
            fields = {"action": action, "logp": tanh_gaussian_log_prob(mu, log_std, action), "mu": mu, "log_std": log_std}
        else:
            action, fields, last = self._decode_tokens(ids, mask, self._pixels(obs["pixel_values"]), det)
        fields.update(env_action=self.normalizer.to_env(action), value=self._value(last))
        return TensorDict(fields, batch_size=ids.shape[:1])

    def _decode_tokens(self, ids, mask, pixels, det):
        """Autoregressive decoding of one token per action dimension, as OpenVLA generates,
        restricted to the action tokens; the KV cache carries the prompt."""
        from transformers import DynamicCache

        past = DynamicCache()
        out = self._run(ids, mask, pixels, past=past, hidden=True)
        last = out.hidden_states[-1][:, -1]
        tokens, logits_all = [], []
        for d in range(self.action_dim):
            logits = self._action_logits(out.logits[:, -1])
            sample = torch.distributions.Categorical(logits=logits).sample()
            token = torch.where(det, logits.argmax(-1), sample) + (self.vocab_end - NUM_BINS)
            tokens.append(token)
            logits_all.append(logits)
            if d + 1 < self.action_dim:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                out = self._run(token.unsqueeze(1), mask, past=out.past_key_values, hidden=False)
        tokens_t, logits_t = torch.stack(tokens, 1), torch.stack(logits_all, 1)
        logp = torch.log_softmax(logits_t, -1).gather(-1, (tokens_t - (self.vocab_end - NUM_BINS)).unsqueeze(-1)).squeeze(-1)
        action = tokens_to_normalized(tokens_t, self.vocab_end)
        return action, {"action_token": tokens_t, "behaviour_logits": logits_t, "logp": logp}, last

    def _teacher_forced(self, obs: TensorDict, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(action logits [B, D, 256], last prompt hidden state) for stored ``tokens`` in one pass."""
        d = tokens.shape[1]
        ids = torch.cat([obs["input_ids"], tokens], dim=1)
        mask = torch.cat([obs["attention_mask"], torch.ones_like(tokens)], dim=1)
        out = self._run(ids, mask, self._pixels(obs["pixel_values"]), keep=d + 1)
        return self._action_logits(out.logits[:, -(d + 1):-1]), out.hidden_states[-1][:, -(d + 1)]

    def evaluate(self, obs: TensorDict, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.head == "continuous":
            out = self._run(obs["input_ids"], obs["attention_mask"], self._pixels(obs["pixel_values"]))
            last = out.hidden_states[-1][:, -1]
            mu, log_std = self._gaussian(last)
            return tanh_gaussian_log_prob(mu, log_std, action), tanh_gaussian_entropy(mu, log_std), self._value(last)
        logits, last = self._teacher_forced(obs, action)
        index = (action - (self.vocab_end - NUM_BINS)).unsqueeze(-1)
        logp = torch.log_softmax(logits, -1).gather(-1, index).squeeze(-1)
        return logp, categorical_entropy(logits), self._value(last)

    def value(self, obs: TensorDict) -> torch.Tensor:
        out = self._run(obs["input_ids"], obs["attention_mask"], self._pixels(obs["pixel_values"]))
        return self._value(out.hidden_states[-1][:, -1])

    def value_parameters(self) -> list[nn.Parameter]:
        return list(self.value_head.parameters())


# ---- registration ----------------------------------------------------------------------------
def prepare_vla(obs_spec: ObsSpec, action_dim: int, model_path: Optional[str], policy_kwargs: Mapping[str, Any],
                head: Head = "continuous") -> dict[str, Any]:
    """Driver-side check before Ray starts: unknown kwargs and a bad ``model_path`` are
    ConfigErrors; without a model path the cached tiny VLA for the env's image size is used."""
    kwargs = dict(policy_kwargs)
    known = set(inspect.signature(VLAActorCritic.__init__).parameters) - {"self", "obs_spec", "action_dim", "head"}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ConfigError(f"unknown policy_kwargs key '{unknown[0]}' for the VLA policy; valid: {', '.join(sorted(known))}")
    model_path = model_path or kwargs.pop("model_path", None)
    if model_path is None:
        size = obs_spec.get("image_size", 64)
        size = int(size[0] if isinstance(size, (list, tuple)) else size)
        model_path = str(tiny_vla_path(image_size=size, action_dim=action_dim))
    trust = bool(kwargs.get("trust_remote_code", False))
    path = check_model_dir(model_path, trust)
    load_norm_stats(path, kwargs.get("unnorm_key"))  # both heads un-normalise env actions with them
    cameras = kwargs.get("cameras", ["agentview"])
    available = obs_spec.get("cameras")
    if available is not None and any(c not in available for c in cameras):
        raise ConfigError(f"policy_kwargs cameras {list(cameras)}: the environment renders {list(available)}")
    kwargs["model_path"] = str(path)
    preprocess = VLAPreprocessor(obs_spec, **kwargs)
    for instruction in obs_spec.get("instructions", []):  # the env's prompts must fit max_prompt_tokens
        try:
            preprocess._prompt_tokens(instruction)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return kwargs


register_policy("vla", preprocessor=VLAPreprocessor, prepare=functools.partial(prepare_vla, head="continuous"))(
    functools.partial(VLAActorCritic, head="continuous"))
register_policy("vla_discrete", preprocessor=VLAPreprocessor, prepare=functools.partial(prepare_vla, head="discrete"))(
    functools.partial(VLAActorCritic, head="discrete"))
