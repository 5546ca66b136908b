"""LoRA through `peft` (Hu et al. 2021, arXiv 2106.09685): train a low-rank update, keep the weights.

    W x  ->  W x + (alpha / r) * B A x,    A (r, in) random, B (out, r) zero: the update starts at 0

Only A and B train: for Qwen3-0.6B with r = 16 on every projection that is ~10 M parameters instead of
~600 M, so AdamW's two fp32 moments shrink by the same factor. And the reference model of the KL term
is free: it is the frozen base, i.e. the policy with its adapters switched off (`adapters_disabled`),
as TRL does when it trains a peft model.

The layers are peft's (`peft.LoraModel` wraps the lab's model; its forward is the lab's). Nothing of
LoRA is written here by hand: the lesson is what it buys, not its ten lines.
"""

from __future__ import annotations

import contextlib
import copy

from ..util.validation import check_number

LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def add_lora(model, r: int = 16, alpha: float = 32.0, target_modules=LORA_TARGET_MODULES,
             dropout: float = 0.0):
    """Wrap `model` with LoRA adapters of rank r on `target_modules` (peft's `LoraModel`); the base
    weights are frozen. The result is called like the model and has its `.config` and `.device`."""
    from peft import LoraConfig, LoraModel

    check_number("lora_r", r, low=1, integer=True)
    check_number("lora_alpha", alpha, low=0, low_open=True)
    check_number("lora_dropout", dropout, low=0, high=1, high_open=True)
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules))
    return LoraModel(model, config, "default")


def is_lora(model) -> bool:
    from peft import LoraModel

    return isinstance(model, LoraModel)


@contextlib.contextmanager
def adapters_disabled(model):
    """Inside the block a LoRA model computes its frozen base (the reference policy)."""
    if not is_lora(model):
        yield model
        return
    model.disable_adapter_layers()
    try:
        yield model
    finally:
        model.enable_adapter_layers()


def merged_model(model):
    """A plain lab model with the LoRA update folded into the weights (W + alpha/r * B A); the model
    itself is left as it was. A plain model comes back unchanged."""
    return copy.deepcopy(model).merge_and_unload() if is_lora(model) else model
