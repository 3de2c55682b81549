"""Generation of a causal LM policy's responses by vLLM (``generation_engine: vllm``), with the contracts of
``CausalLMActorCritic._generate``: a response is ``max_new_tokens`` ids, ``PAD_ACTION`` after its end (its stop
token included), each token with the log-prob it was sampled with.

The engine (``vllm_client``: its own process) loads the policy's base model from its folder once. What the
trainers change reaches it as a LoRA adapter: before a batch, if any LoRA tensor of the policy changed since the
engine last saw it (their in-place version counters, which every weight copy bumps), the adapters are written
in peft's format (``checkpoint.save_adapter``) to a new folder and the batch is generated with a new
``LoRARequest`` id; the previous folder goes. The inference actor swaps weights only between batches, so every
token of a batch comes from the weights of the version it is stamped with. The engine cannot follow the base
weights: they are checked against the folder when the engine starts (an ``init_from`` export, a merged weight
sync would differ), and any later change of a base tensor raises ``EngineCannotFollow``.

Log-probs: vLLM's processed log-probs (after temperature, top-k, top-p, min-p), the distribution each token was
drawn from, as the ``hf`` engine records. Greedy rows (evaluation) take vLLM's greedy decoding, whose log-probs
are the model's own distribution (no temperature). Rows of one batch with the same prompt and the same kind
(GRPO's G completions of one prompt) are one request with ``n`` completions: the prompt is prefilled once.
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

from async_rl.policies.lm_sampling import PAD_ACTION
from async_rl.policies.lora import is_lora_name
from async_rl.policies.vllm_client import VLLMEngineClient, VLLMEngineError, vllm_unavailable_reason

# Architectures whose vLLM CPU path this project has run (tests/policies/test_lm_vllm.py); `auto` takes hf for others.
ENGINE_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"})
# vLLM 0.32's max_lora_rank choices; the engine takes the smallest that holds the policy's rank.
ENGINE_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Layers vLLM puts LoRA on in these architectures (its packed qkv_proj / gate_up_proj take their parts' adapters).
ENGINE_LORA_LAYERS = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
START_TIMEOUT_S = 900.0  # first start on a busy 2-core machine: imports, weights, torch.compile (~40-140 s measured)
CALL_TIMEOUT_S = 900.0  # one batch of generation


class EngineCannotFollow(VLLMEngineError):
    """The policy's weights changed in a way the engine cannot serve (base weights, not LoRA adapters)."""


def engine_unsupported_reason(lm: torch.nn.Module) -> Optional[str]:
    """Why vLLM cannot generate for ``lm`` (the policy's Hugging Face model, LoRA layers and all), or None."""
    reason = vllm_unavailable_reason()
    if reason:
        return reason
    device = next(lm.parameters()).device
    if device.type != "cpu":  # scripts/setup_vllm.sh installs vLLM's CPU build (its GPU build is another wheel)
        return f"the installed vLLM is its CPU build and the model is on {device}"
    architectures = set(getattr(lm.config, "architectures", None) or [type(lm).__name__])
    if not architectures & ENGINE_ARCHITECTURES:
        return (f"the vLLM engine is not set up here for {sorted(architectures)} (it runs "
                f"{sorted(ENGINE_ARCHITECTURES)})")
    adapted = {name.rpartition(".lora_A")[0].rpartition(".")[2] for name, _ in lm.named_parameters() if ".lora_A." in name}
    if adapted - ENGINE_LORA_LAYERS:
        return (f"vLLM puts LoRA on {sorted(ENGINE_LORA_LAYERS)} only, the policy also on {sorted(adapted - ENGINE_LORA_LAYERS)}; "
                "set --lora-target-modules to those layers")
    return None


class VLLMGeneration:
    """One policy's engine: started on the first batch, fed the policy's LoRA adapters as they change."""

    def __init__(self, policy: Any, threads: int = 1) -> None:
        self.policy, self.lm = policy, policy.lm
        self.model_path = str(self.lm.name_or_path)
        self.lora = [tensor for name, tensor in self.lm.named_parameters() if is_lora_name(name)]
        self.base = [tensor for name, tensor in self.lm.named_parameters() if not is_lora_name(name)]
        self._check_base_is_the_folders()
        self._base_seen = self._versions(self.base)
        dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[self.base[0].dtype]
        rank = max((int(t.shape[0]) for name, t in self.lm.named_parameters() if ".lora_A." in name), default=0)
        # The adapters' folders: the engine's process removes them when it ends, as it may outlive this object.
        self._folders = Path(tempfile.mkdtemp(prefix="vllm-adapters-"))
        self.client = VLLMEngineClient(
            dict(model=self.model_path, scratch=str(self._folders), dtype=dtype, seed=int(torch.initial_seed()) % 2**31,
                 max_model_len=policy.max_prompt_tokens + policy.max_new_tokens, max_num_seqs=256,
                 max_lora_rank=next(r for r in ENGINE_LORA_RANKS if r >= rank) if rank else 0,
                 enforce_eager=False),
            start_timeout_s=START_TIMEOUT_S, timeout_s=CALL_TIMEOUT_S, threads=threads)
        self._adapter: Optional[dict[str, Any]] = None
        self._lora_seen: Optional[tuple[int, ...]] = None

    @staticmethod
    def _versions(tensors: list[torch.Tensor]) -> tuple[int, ...]:
        return tuple(t._version for t in tensors)

    def _check_base_is_the_folders(self) -> None:
        """The engine loads the folder's weights: the policy's base must be exactly those (in its own dtype)."""
        from safetensors import safe_open

        saved: dict[str, torch.Tensor] = {}
        for file in sorted(Path(self.model_path).glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                saved.update({key: f.get_tensor(key) for key in f.keys()})
        for name, tensor in self.lm.named_parameters():
            if is_lora_name(name):
                continue
            name = name.replace(".base_layer.", ".")
            if name in saved and not torch.equal(saved[name].to(tensor.dtype), tensor.detach().cpu()):
                raise EngineCannotFollow(f"the policy's weight {name} differs from {self.model_path}'s, which the "
                                         "vLLM engine would load (an init_from export or merged weights?)")

    def _current_adapter(self) -> Optional[dict[str, Any]]:
        """The adapter of the policy's weights now, written anew when they changed; None without LoRA."""
        if self._versions(self.base) != self._base_seen:
            raise EngineCannotFollow("the policy's base weights changed (a full-weight or merged weight sync): the "
                                     "vLLM engine follows LoRA adapters only; use --lora-rank N --lora-sync adapters, "
                                     "or --policy.generation-engine hf")
        if not self.lora:
            return None
        versions = self._versions(self.lora)
        if versions != self._lora_seen:
            from async_rl.checkpoint import save_adapter  # peft; only where there are adapters

            number = 1 + (self._adapter["id"] if self._adapter else 0)
            folder = self._folders / f"adapter-{number}"
            save_adapter(self.policy, folder)
            previous, self._adapter = self._adapter, {"name": f"policy-{number}", "id": number, "path": str(folder)}
            self._lora_seen = versions
            if previous:  # vLLM keeps one adapter (max_loras 1): the old one is evicted by the new one's load
                shutil.rmtree(previous["path"], ignore_errors=True)
        return self._adapter

    def generate(self, ids: torch.Tensor, mask: torch.Tensor, greedy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Responses and their log-probs ``[rows, max_new_tokens]`` (``PAD_ACTION`` / 0 after the end) for the
        left-padded prompts ``ids`` / ``mask``; ``greedy[row]``: decoded greedily."""

        adapter = self._current_adapter()
        rows, width = ids.shape[0], self.policy.max_new_tokens
        # Identical prompts of the same kind: one request with n completions (one prefill), answered in row order;
        # greedy ones (vLLM takes n = 1 there) one completion that every such row receives.
        groups: dict[tuple[tuple[int, ...], bool], list[int]] = {}
        for row in range(rows):
            prompt = tuple(int(t) for t in ids[row][mask[row].bool()].tolist())
            groups.setdefault((prompt, bool(greedy[row])), []).append(row)
        requests = [{"prompt": list(prompt), "n": 1 if kind else len(members), "greedy": kind}
                    for (prompt, kind), members in groups.items()]
        sampling = dict(max_new_tokens=width, min_new_tokens=self.policy.min_new_tokens, stop_ids=self.policy.stop_ids,
                        **dataclasses.asdict(self.policy.sampling))
        answer = self.client.call("generate", requests=requests, sampling=sampling, adapter=adapter)
        response = torch.full((rows, width), PAD_ACTION, dtype=torch.int64)
        logp = torch.zeros((rows, width), dtype=torch.float32)
        for members, completions in zip(groups.values(), answer["completions"], strict=True):
            for row, completion in zip(members, completions * len(members) if len(completions) == 1 else completions,
                                       strict=True):
                tokens = completion["ids"][:width]
                response[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
                logp[row, :len(tokens)] = torch.tensor(completion["logp"][:len(tokens)], dtype=torch.float32)
        return response.to(ids.device), logp.to(ids.device)

    def close(self) -> None:
        self.client.close()
        shutil.rmtree(self._folders, ignore_errors=True)
