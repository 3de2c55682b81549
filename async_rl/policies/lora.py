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


def merged_named_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Parameters and buffers under the plain model's names, LoRA deltas merged into the base.

    Without LoRA layers this is ``named_parameters`` + ``named_buffers``. The result never
    aliases a trainable tensor, so the trainer can keep training while it is sent.
    """
    lora_layers = named_lora_layers(model)
    if not lora_layers:
        return [*model.named_parameters(), *model.named_buffers()]
    out: list[tuple[str, torch.Tensor]] = []
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        owner, _, leaf = name.rpartition(".")
        if is_lora_name(name):
            continue  # folded into the base weight below
        if owner.endswith(".base_layer") and owner[: -len(".base_layer")] in lora_layers:
            layer_name = owner[: -len(".base_layer")]
            if leaf == "weight":
                with torch.no_grad():
                    tensor = tensor + lora_layers[layer_name].get_delta_weight(ADAPTER).to(tensor.dtype)
            name = f"{layer_name}.{leaf}"
        out.append((name, tensor))
    return out


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
