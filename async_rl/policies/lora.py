"""LoRA (peft) on any policy, and the merged weights the inference copy receives.

peft (which imports transformers, seconds) is imported inside the functions, and only where a
model can hold LoRA layers: a plain policy's weight sync never loads it.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator, Optional, Sequence, TypeVar, cast

import torch

ADAPTER = "default"


M = TypeVar("M", bound=torch.nn.Module)


def apply_lora(model: M, rank: int, alpha: float, dropout: float = 0.0,
               target_modules: Optional[str | Sequence[str]] = None, trainable: Sequence[str] = ()) -> M:
    """Inject LoRA adapters in place (the model keeps its class and methods).

    ``target_modules``: module names (peft suffix matching), or one string that peft matches as a
    regex against full module names (e.g. only the language model's projections); None = every ``nn.Linear``.
    Only adapter weights and parameters whose name starts with one of ``trainable`` stay
    trainable (e.g. a value head that has no pretrained weights).
    """
    from peft import LoraConfig, inject_adapter_in_model  # noqa: PLC0415 (peft: see the module's docstring)

    if target_modules is None:
        target_modules = [name for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)]
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,  # type: ignore[arg-type]  # peft says int; alpha / r is a float
                        target_modules=target_modules if isinstance(target_modules, str) else list(target_modules))
    model = cast(M, inject_adapter_in_model(config, model))  # in place: the same object
    for name, param in model.named_parameters():
        param.requires_grad = is_lora_name(name) or any(name.startswith(prefix) for prefix in trainable)
    return model


def is_lora_name(name: str) -> bool:
    """Whether a parameter's name is one of a LoRA adapter's (``lora_A``/``lora_B`` ...)."""
    return ".lora_" in name or name.startswith("lora_")


def merged_named_tensors(model: torch.nn.Module, names: Optional[set[str]] = None) -> list[tuple[str, torch.Tensor]]:
    """Parameters and buffers under the plain model's names, LoRA deltas merged into the base; ``names``: only those.

    Without LoRA layers this is ``named_parameters`` + ``named_buffers``. The result never
    aliases a trainable tensor, so the trainer can keep training while it is sent.
    """
    lora_layers = named_lora_layers(model)
    out: list[tuple[str, torch.Tensor]] = []
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if is_lora_name(name):
            continue  # folded into the base weight below
        plain = plain_name(name, lora_layers)
        if names is not None and plain not in names:
            continue
        if plain != name and plain.endswith(".weight"):
            with torch.no_grad():
                tensor = tensor + lora_layers[plain[: -len(".weight")]].get_delta_weight(ADAPTER).to(tensor.dtype)
        out.append((plain, tensor))
    return out


def plain_name(name: str, lora_layers: dict[str, Any]) -> str:
    """A LoRA-wrapped layer's base tensor under the plain model's name (``q_proj.base_layer.weight`` ->
    ``q_proj.weight``); any other name as it is."""
    owner, _, leaf = name.rpartition(".")
    if owner.endswith(".base_layer") and owner[: -len(".base_layer")] in lora_layers:
        return f"{owner[: -len('.base_layer')]}.{leaf}"
    return name


def merge_sources(model: torch.nn.Module) -> dict[str, list[torch.Tensor]]:
    """Each parameter of the plain model (``merged_named_tensors``' names) and the parameters its merged value is
    computed from: itself, and a LoRA layer's adapters for its weight. Their in-place version counters tell
    which merged weights changed."""
    lora_layers = named_lora_layers(model)
    sources: dict[str, list[torch.Tensor]] = {}
    for name, tensor in model.named_parameters():
        plain = f"{name.split('.lora_')[0]}.weight" if is_lora_name(name) else plain_name(name, lora_layers)
        sources.setdefault(plain, []).append(tensor)
    return sources


def named_lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    """The model's LoRA layers by name (none without peft loaded: a LoRA layer exists only once it is)."""
    peft_lora = sys.modules.get("peft.tuners.lora")
    if peft_lora is None:
        return {}
    return {name: mod for name, mod in model.named_modules() if isinstance(mod, peft_lora.LoraLayer)}


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Inside the block the model computes with its base weights only (LoRA adapters off), in eval mode:
    the reference policy of a LoRA model, without a second copy. Trainability and every module's own
    train/eval mode are restored as they were found (``model.train(flag)`` would set every submodule alike,
    and so switch on dropout that was off, or the reverse)."""
    layers = [layer for layer in named_lora_layers(model).values() if not layer.disable_adapters]
    # peft's enable_adapters(True) marks every active adapter trainable: put back what was there.
    trainable = {param: param.requires_grad for param in model.parameters()}
    modes = {module: module.training for module in model.modules()}
    model.eval()
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for param, flag in trainable.items():
            param.requires_grad_(flag)
        for module, training in modes.items():
            module.training = training  # the attribute alone: Module.train would recurse into the children
