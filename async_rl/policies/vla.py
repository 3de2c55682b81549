"""Vision-language-action actor-critics on a Hugging Face VLM (OpenVLA-style, as the original
ds_libero_ppo.py framework fine-tunes it).

This module holds the two registered policies and their worker-side preprocessor; the parts
they are made of live by job in ``vla_loading`` (backbone, processor and action statistics
from ``model_path``), ``vla_layouts`` (how each checkpoint family takes images and prompt:
Llava-style image tokens, Idefics3/SmolVLM, OpenVLA's Prismatic remote code), ``vla_heads``
(value, continuous and discrete heads) and ``vla_tiny`` (tiny checkpoints of each family; the
Llava one is used when no ``model_path`` is given).

Both heads and the value head read the language model's last hidden state at the last prompt
token (prompts are left-padded, so that is the last position).

- ``vla`` (``head: continuous``): a Gaussian mean and log-std per action dimension,
  ``action = tanh(u)`` in [-1, 1] is what is trained on; ``env_action`` is un-normalised with
  the checkpoint's per-dimension q01/q99 statistics as OpenVLA does, and the gripper is
  binarised and inverted as OpenVLA's LIBERO evaluation does.
- ``vla_discrete`` (``head: discrete``): OpenVLA's action tokens. Each action dimension is
  one of 256 bins, emitted autoregressively as one of the last 256 ids of the tokenizer's
  vocabulary; sampling is Categorical over those 256 logits. Experience keeps
  ``action_token`` (token ids) and ``behaviour_logits``; training re-reads the logits of the
  stored tokens in one teacher-forced pass.

Rollout workers hold only the processor (``VLAPreprocessor``): images stay uint8 on the wire
and are normalised on the model side; the prompt is tokenised once per instruction and
left-padded to ``max_prompt_tokens`` with an attention mask, so observations stack and
concatenate as fixed-shape tensors. In bf16 the pixels are normalised in float32 and cast to
the backbone's dtype; every statistic is returned in float32.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Literal, Mapping, Optional, Sequence

import numpy as np
import pydantic
import torch
from tensordict import TensorDict
from torch import nn

from async_rl.algo import categorical_entropy, tanh_gaussian_entropy, tanh_gaussian_log_prob
from async_rl.algo.behaviour_cloning import behaviour_cloning_loss, gaussian_bc_loss
from async_rl.errors import ConfigError
from async_rl.plugin_options import model_path_option
from async_rl.policies import register_policy
from async_rl.policies.base import ActorCritic, ObsSpec, check_env_prompts_fit
from async_rl.policies.nets import cast_inputs, check_log_std_range
from async_rl.policies.vla_heads import (
    NUM_BINS,
    ActionNormalizer,
    action_token_log_prob,
    action_token_logits,
    gaussian_head,
    gaussian_params,
    normalized_to_tokens,
    tokens_to_normalized,
    value_head,
)
from async_rl.policies.vla_layouts import checkpoint_layout, flat_pixels, run_backbone
from async_rl.policies.vla_loading import (
    OPENVLA_PROMPT,
    backbone_hidden_size,
    check_model_dir,
    image_size,
    load_backbone,
    load_norm_stats,
    load_processor,
    pixel_stats,
)
from async_rl.policies.vla_tiny import FAMILIES, tiny_vla_path
from async_rl.validation import ConfigSection

Head = Literal["continuous", "discrete"]


class TinyVLAShape(ConfigSection):
    """The tiny VLA built when no model is given (``vla_tiny.tiny_vla_spec``); its image size and action
    dimension come from the env."""

    hidden_size: pydantic.PositiveInt = 64
    """the language model's width"""
    num_layers: pydantic.PositiveInt = 2
    """the language model's layers"""
    vision_hidden_size: pydantic.PositiveInt = 32
    """the vision tower's width"""
    patch_size: pydantic.PositiveInt = 16
    """the env's image size must be a multiple of it"""
    vocab_size: pydantic.PositiveInt = 768
    """the tokenizer's vocabulary (trained here)"""
    family: Literal[FAMILIES] = "llava"  # type: ignore[valid-type]  # a Literal of a constant's values: pydantic reads them, mypy does not
    """the checkpoint layout it imitates"""


class VLAOptions(ConfigSection):
    """The VLA policies' options (vla: a Gaussian action head; vla_discrete: OpenVLA's action tokens)."""

    model_path: Optional[str] = model_path_option("a local checkpoint folder",
                                                  "the cached tiny VLA (tiny_vla) for the env's image size")
    cameras: list[Literal["agentview", "wrist"]] = ["agentview"]
    """the env's cameras the model sees, in this order"""
    prompt: str = OPENVLA_PROMPT
    """the prompt template; {instruction} is the task's instruction"""
    max_prompt_tokens: pydantic.PositiveInt = 64
    """prompts are left-padded to this many tokens; a longer instruction of the env is refused before the run"""
    unnorm_key: Optional[str] = None
    """the dataset whose action statistics un-normalise actions (null = the checkpoint's only one)"""
    gripper: Literal["openvla_libero", "none"] = "openvla_libero"
    """openvla_libero: the gripper dimension is mapped as OpenVLA's LIBERO eval does"""
    value_hidden: pydantic.PositiveInt = 256
    """width of the value head's hidden layer"""
    init_log_std: float = -1.0
    """the continuous head's initial log standard deviation"""
    min_log_std: float = -5.0
    """the continuous head's log-std is clamped to [min_log_std, max_log_std]"""
    max_log_std: float = 0.5
    """the upper bound of the clamped log-std"""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """the backbone's weights as loaded (auto and float32: float32)"""
    trust_remote_code: bool = False
    """run the checkpoint's own modeling code (OpenVLA needs it)"""
    tiny_vla: Optional[TinyVLAShape] = None
    """the tiny VLA's shape when no model is given, e.g. {patch_size: 8}"""

    @pydantic.field_validator("cameras")
    @classmethod
    def _cameras_once(cls, cameras: list[str]) -> list[str]:
        if len(set(cameras)) != len(cameras):  # each camera is one image slot of the model's input
            raise ValueError(f"cameras {cameras} name a camera twice; list each once")
        return cameras

    @pydantic.model_validator(mode="after")
    def _log_std_range(self) -> "VLAOptions":
        check_log_std_range(self.min_log_std, self.max_log_std)
        return self


# ---- worker side -----------------------------------------------------------------------------
class VLAPreprocessor:
    """Raw LIBERO observation -> fixed-shape model inputs: ``pixel_values`` uint8
    ``[cameras, 3, H, W]``, ``input_ids``/``attention_mask`` int64 ``[max_prompt_tokens]``
    (left-padded). Holds the processor only, never model weights.

    The prompt as the checkpoint family was trained on it (``vla_layouts``): image placeholder
    tokens per camera where the model expects them; for OpenVLA (``prismatic``) none, the BOS
    token first (the model puts the patches after it) and, as OpenVLA's ``predict_action``
    does, the empty token "▁" (Llama-2's id 29871, what "Out: " ends with in training) appended
    when the prompt does not end with it.
    """

    def __init__(self, obs_spec: ObsSpec, model_path: str, cameras: Sequence[str] = ("agentview",),
                 prompt: str = OPENVLA_PROMPT, max_prompt_tokens: int = 64, trust_remote_code: bool = False,
                 **_policy_kwargs: Any) -> None:
        self.processor = load_processor(model_path, trust_remote_code)
        self.processor.tokenizer.padding_side = "left"
        self.layout = checkpoint_layout(model_path)
        image_processor = self.processor.image_processor
        self.size = image_size(image_processor)
        self.cameras, self.prompt, self.max_tokens = list(cameras), prompt, int(max_prompt_tokens)
        self._image_processor = image_processor
        self._tokens: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def _prompt_tokens(self, instruction: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenised prompt of one instruction, cached (it changes only with the task)."""
        if instruction not in self._tokens:
            text = self.prompt.format(instruction=instruction.lower())
            if self.layout == "prismatic":
                ids = self._openvla_ids(text)
                mask = np.ones_like(ids)
            else:
                text = (getattr(self.processor, "image_token", None) or "") * len(self.cameras) + text
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

    def _openvla_ids(self, text: str) -> np.ndarray:
        """OpenVLA's prompt ids: BOS first, the empty token "▁" last (see the class docstring)."""
        tokenizer = self.processor.tokenizer
        ids = list(tokenizer(text)["input_ids"])
        if tokenizer.bos_token_id is not None and ids[:1] != [tokenizer.bos_token_id]:
            ids.insert(0, tokenizer.bos_token_id)
        empty = tokenizer.convert_tokens_to_ids("\u2581")
        if empty is not None and empty != tokenizer.unk_token_id and ids[-1] != empty:
            ids.append(empty)
        return np.asarray(ids, dtype=np.int64)

    def _image(self, image: np.ndarray) -> torch.Tensor:
        image = np.asarray(image)
        if image.shape[:2] != self.size:  # resize/crop with the processor, but keep uint8 on the wire
            out = self._image_processor(images=[image], do_rescale=False, do_normalize=False, return_tensors="np")
            pixels = np.asarray(out["pixel_values"]).reshape(-1, 3, *self.size)[0]  # [B, (images,) 3, H, W]
            return torch.as_tensor(np.clip(np.rint(pixels), 0, 255).astype(np.uint8))
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
    hf_model_attr = "backbone"
    backbone: Any  # a Hugging Face model: its parts are attributes torch's Module type cannot name
    pixel_mean: torch.Tensor  # buffers
    pixel_std: torch.Tensor

    def __init__(self, obs_spec: ObsSpec, action_dim: int, model_path: str, head: Head = "continuous",
                 cameras: Sequence[str] = ("agentview",), prompt: str = OPENVLA_PROMPT, max_prompt_tokens: int = 64,
                 unnorm_key: Optional[str] = None, gripper: Literal["openvla_libero", "none"] = "openvla_libero",
                 value_hidden: int = 256, init_log_std: float = -1.0, min_log_std: float = -5.0, max_log_std: float = 0.5,
                 dtype: Literal["auto", "float32", "bfloat16"] = "auto", trust_remote_code: bool = False,
                 tiny_vla: Optional[Mapping[str, Any]] = None) -> None:
        """``tiny_vla``: the tiny VLA's shape when no model is given (``vla_tiny.tiny_vla_spec`` keys,
        e.g. ``{patch_size: 8}``); ``prepare_vla`` turns it into ``model_path``."""
        super().__init__()
        if head not in ("continuous", "discrete"):
            raise ValueError(f"head must be 'continuous' or 'discrete', got {head!r}")
        self.head, self.action_dim = head, int(action_dim)
        self.action_key = "action" if head == "continuous" else "action_token"
        self.backbone = load_backbone(model_path, dtype, trust_remote_code)
        self.layout = checkpoint_layout(model_path)
        processor = load_processor(model_path, trust_remote_code)
        mean, std = pixel_stats(processor.image_processor)
        self.register_buffer("pixel_mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)
        hidden = backbone_hidden_size(self.backbone)
        self.normalizer = ActionNormalizer(**load_norm_stats(model_path, unnorm_key), gripper=gripper)
        if self.normalizer.q01.numel() != self.action_dim:
            raise ValueError(f"{model_path}: action statistics have {self.normalizer.q01.numel()} dimensions, "
                             f"the environment {self.action_dim}")
        if head == "continuous":
            self.action_head = gaussian_head(hidden, self.action_dim, init_log_std)
        # OpenVLA: the action tokens are the last NUM_BINS ids of the tokenizer's base vocabulary.
        self.vocab_end = int(processor.tokenizer.vocab_size)
        self.min_log_std, self.max_log_std = min_log_std, max_log_std
        self.value_head = value_head(hidden, value_hidden)
        called = self.backbone.language_model if self.layout == "prismatic" else self.backbone
        self._keep_logits = "logits_to_keep" in inspect.signature(called.forward).parameters

    # ---- backbone ------------------------------------------------------------------------
    def _pixels(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """uint8 [B, cams, 3, H, W] -> normalised, in the layout's shape (``vla_layouts.flat_pixels``;
        C = 3k for fused backbones)."""
        x = pixel_values.flatten(0, 1).float() / 255.0
        repeats = self.pixel_mean.shape[1] // x.shape[1]
        x = (x.repeat(1, repeats, 1, 1) - self.pixel_mean.float()) / self.pixel_std.float()
        return cast_inputs(flat_pixels(self.layout, x.unflatten(0, pixel_values.shape[:2])), self.backbone)

    def _run(self, input_ids, attention_mask, pixel_values=None, past=None, keep: int = 1, hidden: bool = True):
        return run_backbone(self.layout, self.backbone, input_ids, attention_mask, pixel_values, past, keep, hidden,
                            self._keep_logits)

    # The heads may be in another dtype than the backbone (``dtype: bfloat16`` with fp32 training).
    def _value(self, last_hidden: torch.Tensor) -> torch.Tensor:
        return self.value_head(cast_inputs(last_hidden, self.value_head)).squeeze(-1).float()

    def _gaussian(self, last_hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        head_out = self.action_head(cast_inputs(last_hidden, self.action_head))
        return gaussian_params(head_out, self.min_log_std, self.max_log_std)

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
            logits = action_token_logits(out.logits[:, -1], self.vocab_end)
            sample = torch.distributions.Categorical(logits=logits).sample()
            token = torch.where(det, logits.argmax(-1), sample) + (self.vocab_end - NUM_BINS)
            tokens.append(token)
            logits_all.append(logits)
            if d + 1 < self.action_dim:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                out = self._run(token.unsqueeze(1), mask, past=out.cache, hidden=False)
        tokens_t, logits_t = torch.stack(tokens, 1), torch.stack(logits_all, 1)
        logp = action_token_log_prob(logits_t, tokens_t, self.vocab_end)
        action = tokens_to_normalized(tokens_t, self.vocab_end)
        return action, {"action_token": tokens_t, "behaviour_logits": logits_t, "logp": logp}, last

    def _teacher_forced(self, obs: TensorDict, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(action logits [B, D, 256], last prompt hidden state) for stored ``tokens`` in one pass."""
        d = tokens.shape[1]
        ids = torch.cat([obs["input_ids"], tokens], dim=1)
        mask = torch.cat([obs["attention_mask"], torch.ones_like(tokens)], dim=1)
        out = self._run(ids, mask, self._pixels(obs["pixel_values"]), keep=d + 1)
        return action_token_logits(out.logits[:, -(d + 1):-1], self.vocab_end), out.hidden_states[-1][:, -(d + 1)]

    def evaluate(self, obs: TensorDict, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.head == "continuous":
            out = self._run(obs["input_ids"], obs["attention_mask"], self._pixels(obs["pixel_values"]))
            last = out.hidden_states[-1][:, -1]
            mu, log_std = self._gaussian(last)
            return tanh_gaussian_log_prob(mu, log_std, action), tanh_gaussian_entropy(mu, log_std), self._value(last)
        logits, last = self._teacher_forced(obs, action)
        return action_token_log_prob(logits, action, self.vocab_end), categorical_entropy(logits), self._value(last)

    def imitation_loss(self, obs: TensorDict, env_action: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Behaviour cloning (``algo.behaviour_cloning``): the demonstrated env action normalised with
        the checkpoint's statistics; the Gaussian head regresses its mean action onto it and fits its
        spread to the rest, the action-token head maximises the likelihood of its bins."""
        normalized = self.normalizer.normalize(self.normalizer.from_env(env_action)).clamp(-1.0, 1.0)
        if self.head == "continuous":
            out = self._run(obs["input_ids"], obs["attention_mask"], self._pixels(obs["pixel_values"]))
            last = out.hidden_states[-1][:, -1]
            mu, _ = self._gaussian(last)
            _, log_std = self._gaussian(last.detach())  # the spread's fit leaves the shared layers to the mean
            return gaussian_bc_loss(mu, log_std, normalized)
        return behaviour_cloning_loss(self.evaluate, obs, normalized_to_tokens(normalized, self.vocab_end))

    def value(self, obs: TensorDict) -> torch.Tensor:
        out = self._run(obs["input_ids"], obs["attention_mask"], self._pixels(obs["pixel_values"]))
        return self._value(out.hidden_states[-1][:, -1])

    def value_parameters(self) -> list[nn.Parameter]:
        return list(self.value_head.parameters())


# ---- registration ----------------------------------------------------------------------------
def prepare_vla(obs_spec: ObsSpec, action_dim: int, model_path: Optional[str], policy_kwargs: Mapping[str, Any],
                head: Head = "continuous") -> dict[str, Any]:
    """Driver-side check before Ray starts, on kwargs checked against ``VLAOptions``: a bad ``model_path``
    or a camera the env does not render is a ConfigError; without a model path the cached tiny VLA for
    the env's image size is used."""
    kwargs = dict(policy_kwargs)
    model_path = model_path or kwargs.pop("model_path", None)
    if model_path is None:
        size = obs_spec.get("image_size", 64)
        size = int(size[0] if isinstance(size, (list, tuple)) else size)
        model_path = str(tiny_vla_path(image_size=size, action_dim=action_dim, **(kwargs.get("tiny_vla") or {})))
    trust = bool(kwargs.get("trust_remote_code", False))
    path = check_model_dir(model_path, trust)
    load_norm_stats(path, kwargs.get("unnorm_key"))  # both heads un-normalise env actions with them
    cameras = kwargs.get("cameras", ["agentview"])
    available = obs_spec.get("cameras")
    if available is not None and any(c not in available for c in cameras):
        raise ConfigError(f"policy_kwargs cameras {list(cameras)}: the environment renders {list(available)}")
    kwargs["model_path"] = str(path)
    check_env_prompts_fit(VLAPreprocessor(obs_spec, **kwargs)._prompt_tokens, obs_spec.get("instructions", []))
    return kwargs


register_policy("vla", preprocessor=VLAPreprocessor, options=VLAOptions,
                prepare=functools.partial(prepare_vla, head="continuous"))(
    functools.partial(VLAActorCritic, head="continuous"))
register_policy("vla_discrete", preprocessor=VLAPreprocessor, options=VLAOptions,
                prepare=functools.partial(prepare_vla, head="discrete"))(
    functools.partial(VLAActorCritic, head="discrete"))
