"""Generation of a causal LM policy's responses by vLLM (``generation_engine: vllm``), with the contracts of
``CausalLMActorCritic._generate``: a response is ``max_new_tokens`` ids, ``PAD_ACTION`` after its end (its stop
token included), each token with the log-prob it was sampled with.

The engine (``vllm_client``: its own process) builds the model from the policy's folder once. The policy's weights
reach it merged, as TRL and verl hand LoRA weights to vLLM: before a batch, the plain model's weights whose sources
changed since the engine last saw them (their in-place version counters, which every weight copy bumps; a LoRA
layer's weight is its base plus its adapters' delta) are written to one safetensors file in shared memory, which
the engine loads into its model in place (vLLM's ``reload_weights``); its prefix cache is dropped with them. The
first batch sends every weight, so the engine serves whatever the policy holds (an ``init_from`` export, a
full-weight or merged sync) and the folder gives only the architecture and the tokenizer. Measured on these CPUs
(benchmarks/results/lm_engines.md): vLLM's own LoRA kernels made it 3x slower; merged weights run at the model's
own speed, for 0.3-0.7 s a load. The inference actor swaps weights only between batches, so every token of a batch
comes from the weights of the version it is stamped with.

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
from async_rl.policies.lora import merge_sources, merged_named_tensors
from async_rl.policies.vllm_client import VLLMEngineClient, vllm_unavailable_reason

# Architectures whose vLLM CPU path this project has run (tests/policies/test_lm_vllm.py); `auto` takes hf for others.
ENGINE_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"})
START_TIMEOUT_S = 900.0  # a start on a busy 2-core machine: imports, weights (~25 s idle, minutes under load)
CALL_TIMEOUT_S = 900.0  # one batch of generation
SHARED_MEMORY = Path("/dev/shm")  # the weights' files: memory, not disk, where the system has it
WEIGHTS_FOLDER_PREFIX = "vllm-weights-"  # one folder per engine, under SHARED_MEMORY


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
    return None


def weight_group(name: str) -> str:
    """The module two levels up (``model.layers.3.self_attn`` for its ``q_proj.weight``): the weights vLLM may
    pack into one layer (q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``) are sent together, since it
    rebuilds a layer from what it is given."""
    return name.rsplit(".", 2)[0] if name.count(".") >= 2 else ""


class VLLMGeneration:
    """One policy's engine: started when built (the policy's ``prepare_sampling``, or its first batch), fed the
    policy's merged weights as they change."""

    def __init__(self, policy: Any, threads: int = 1) -> None:
        self.policy, self.lm = policy, policy.lm
        self.model_path = str(self.lm.name_or_path)
        self.sources = merge_sources(self.lm)
        self._seen: dict[str, tuple[int, ...]] = {}  # versions the engine's weights were built from; none: all differ
        self.loads = 0
        self.logp_gap: Optional[float] = None  # its first sampled batch against the policy's recomputation
        dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[
            next(self.lm.parameters()).dtype]
        # The weights' files: the engine's process removes the folder when it ends, as it may outlive this object.
        self._folder = Path(tempfile.mkdtemp(prefix=WEIGHTS_FOLDER_PREFIX, dir=SHARED_MEMORY if SHARED_MEMORY.is_dir() else None))
        self.client = VLLMEngineClient(
            dict(model=self.model_path, scratch=str(self._folder), dtype=dtype, seed=int(torch.initial_seed()) % 2**31,
                 max_model_len=policy.max_prompt_tokens + policy.max_new_tokens, max_num_seqs=256,
                 # No torch.compile: on these CPUs it added ~100 s to every start (cached or not) for ~6 % faster
                 # decoding (benchmarks/results/lm_engines.md, Start-up).
                 enforce_eager=True),
            start_timeout_s=START_TIMEOUT_S, timeout_s=CALL_TIMEOUT_S, threads=threads)

    def _send_changed_weights(self) -> None:
        """The merged weights whose sources changed since the engine last saw them (all of them the first time),
        with the rest of their ``weight_group``, loaded into the engine's model before it generates."""
        versions = {name: tuple(t._version for t in tensors) for name, tensors in self.sources.items()}
        groups = {weight_group(name) for name, seen in versions.items() if self._seen.get(name) != seen}
        if not groups:
            return
        from safetensors.torch import save_file

        names = {name for name in versions if weight_group(name) in groups}
        file = self._folder / f"weights-{self.loads + 1}.safetensors"
        save_file({name: tensor.detach().contiguous() for name, tensor in merged_named_tensors(self.lm, names)}, str(file))
        try:
            self.client.call("load_weights", path=str(file))
        finally:  # loaded or not, the file has served
            file.unlink(missing_ok=True)
        self._seen, self.loads = versions, self.loads + 1

    def generate(self, ids: torch.Tensor, mask: torch.Tensor, greedy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Responses and their log-probs ``[rows, max_new_tokens]`` (``PAD_ACTION`` / 0 after the end) for the
        left-padded prompts ``ids`` / ``mask``; ``greedy[row]``: decoded greedily."""

        self._send_changed_weights()
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
        answer = self.client.call("generate", requests=requests, sampling=sampling)
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
        shutil.rmtree(self._folder, ignore_errors=True)
