"""One switch from the lab's tiny model to a real one: `RLHF_LAB_MODEL=/path/to/Qwen3-0.6B`.

    model, tokenizer, source = load_model()          # the folder in RLHF_LAB_MODEL, or a tiny random Qwen3
    estimate_training_memory(model.config, ...)      # what a GRPO step holds, by the formula
    describe_parameters(model.config)                # "... in total, ... active per token" for an MoE model

Without a folder, `tiny_qwen3` builds a random Qwen3-architecture model (q/k norm, GQA, tied
embeddings, rope_theta 1e6) with a small byte-level BPE tokenizer trained on the task's own text, both
in-process: every code path a real checkpoint takes (HF tokenizer with a chat template, the Qwen3
layer, the step engine) runs in CI on a CPU. Nothing is downloaded, ever: a real model is a folder the
user already has (e.g. `huggingface-cli download Qwen/Qwen3-0.6B --local-dir ...`, done by the user).

Memory (`estimate_training_memory`), per the usual accounting for mixed-precision Adam training
(ZeRO, Rajbhandari et al. 2020, arXiv 1910.02054, section 3.1: 16 bytes per trained parameter) and
activation sizes (Korthikanti et al. 2022, arXiv 2205.05198, section 4.1), adapted to what this
trainer holds: fp32 weights of policy and reference, fp32 gradients and two fp32 AdamW moments per
trained parameter, bf16 activations of one minibatch, its fp32 logits, and the KV cache of the rollout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..model import LlamaModel, ModelConfig, kv_cache_bytes
from ..text.hf_tokenizer import HFTokenizer, train_bpe_tokenizer
from ..util.validation import check_number

MODEL_ENV = "RLHF_LAB_MODEL"

# Shapes of real checkpoints, from each one's config.json (Hugging Face Hub), for the memory table.
KNOWN_CONFIGS = {
    "SmolLM2-135M": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3),
    "Qwen2.5-0.5B": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2),
    "Qwen3-0.6B": dict(model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    "Qwen2.5-1.5B": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2),
    "Qwen3-1.7B": dict(model_type="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    "Qwen2.5-3B": dict(model_type="qwen2", vocab_size=151936, hidden_size=2048, intermediate_size=11008,
                       num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2),
}


# Mixture-of-experts checkpoints (config.json on the Hub), with the sizes their authors publish: Mixtral
# 8x7B "46.7B total, 12.9B active per token" (Jiang et al. 2024, arXiv 2401.04088, section 2); Qwen3-30B-A3B
# "30.5B in total, 3.3B activated" (its model card; Qwen3 report, arXiv 2505.09388, table 2). Untied
# embeddings.
KNOWN_MOE_CONFIGS = {
    "Mixtral-8x7B": dict(model_type="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False),
    "Qwen3-30B-A3B": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                          moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, num_local_experts=128, num_experts_per_tok=8,
                          norm_topk_prob=True, tie_word_embeddings=False),
}


def known_config(name: str) -> ModelConfig:
    """The ModelConfig of a KNOWN_CONFIGS entry (tied embeddings, as all of these sizes have) or of a
    KNOWN_MOE_CONFIGS entry (its own tie_word_embeddings)."""
    if name not in KNOWN_CONFIGS and name not in KNOWN_MOE_CONFIGS:
        raise ValueError(f"name must be one of {sorted([*KNOWN_CONFIGS, *KNOWN_MOE_CONFIGS])}, got {name!r}")
    shape = {"tie_word_embeddings": True, **KNOWN_CONFIGS.get(name, KNOWN_MOE_CONFIGS.get(name, {}))}
    return ModelConfig(**shape, max_position_embeddings=32768, rope_theta=1e6, pad_token_id=0, bos_token_id=0,
                       eos_token_id=0)


def _expert_parameters(config: ModelConfig) -> int:
    """One SwiGLU expert's parameters: gate and up (I, C) each, down (C, I); no bias (as transformers'
    experts)."""
    return 3 * config.hidden_size * config.expert_intermediate_size


def parameter_count(config: ModelConfig) -> int:
    """Parameters of a model with this config, counted from the shapes (no model is built). For an MoE
    model (`num_local_experts` > 0) this is the total, every expert of every layer: what the weights,
    gradients and optimiser hold. `active_parameter_count` gives what one token uses."""
    C, I, L, D = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.head_dim
    H, K, V = config.num_attention_heads, config.num_key_value_heads, config.vocab_size
    attention = C * H * D + 2 * C * K * D + H * D * C  # q, k, v, o
    attention += (H * D + 2 * K * D) * config.qkv_bias + C * config.o_proj_bias + 2 * D * config.qk_norm
    if config.is_moe:  # router W_gate (E, C), then E experts (moe.SparseMoeBlock); no dense MLP
        mlp = config.num_local_experts * (C + _expert_parameters(config))
    else:
        mlp = 3 * C * I + (2 * I + C) * config.mlp_bias
    per_layer = attention + mlp + 2 * C  # two RMSNorm gains
    embeddings = V * C * (1 if config.tie_word_embeddings else 2)
    return L * per_layer + embeddings + C  # final norm


def active_parameter_count(config: ModelConfig) -> int:
    """Parameters one token's forward pass uses: the total less, in every MoE layer, the experts the
    token is not routed to, (E - k) x one expert. The router, attention, norms and embeddings count in
    full (as Mixtral's "12.9B active" and Qwen3-30B-A3B's "3.3B activated" count them). Dense: the total."""
    unused = config.num_local_experts - config.num_experts_per_tok if config.is_moe else 0
    return parameter_count(config) - config.num_hidden_layers * unused * _expert_parameters(config)


def describe_parameters(config: ModelConfig) -> str:
    """The parameter count in words, saying for an MoE model which number is the total and which the
    active one, e.g. "46.70 B parameters in total, 12.88 B active per token (2 of 8 experts)"."""
    def size(n: int) -> str:
        return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n:,}"

    total = parameter_count(config)
    if not config.is_moe:
        return f"{size(total)} parameters"
    return (f"{size(total)} parameters in total, {size(active_parameter_count(config))} active per token "
            f"({config.num_experts_per_tok} of {config.num_local_experts} experts)")


@dataclass
class MemoryEstimate:
    """Bytes a GRPO step holds (see `estimate_training_memory`)."""

    policy: int
    reference: int
    gradients: int
    optimizer: int
    activations: int
    logits: int
    kv_cache: int

    @property
    def total(self) -> int:
        return (self.policy + self.reference + self.gradients + self.optimizer + self.activations
                + self.logits + self.kv_cache)

    def as_dict(self) -> dict:
        return {**self.__dict__, "total": self.total}


def estimate_training_memory(config: ModelConfig, rollout_rows: int, prompt_len: int, completion_len: int,
                             minibatch_rows: int | None = None, lora_r: int = 0,
                             gradient_checkpointing: bool = False, offload_reference: bool = False,
                             fused_attention: bool = True) -> MemoryEstimate:
    """Bytes held at the peak of one step, by formula (a lower bound: allocator slack, CUDA context
    and temporary buffers come on top).

    rollout_rows: prompts x G completions sampled per step; minibatch_rows: rows per backward pass
    (default all). Weights are fp32 (the trainer's default: bf16 autocast, fp32 master weights).

        weights      4 bytes x parameters, for the policy; the reference the same again unless
                     off-loaded to the CPU or shared with LoRA (then it is the policy's base)
        gradients    4 bytes x trained parameters;  AdamW   8 bytes x trained parameters (two moments)
                     (MoE: every expert is trained and stored, so these use the total parameter
                     count, not the active one; LoRA counts the adapters peft adds: every expert of
                     a Qwen3-MoE, attention only for a Mixtral)
        activations  per layer ~ s b h (34 + 5 a s / h) bytes in 16-bit (Korthikanti et al. 2022);
                     fused attention (SDPA/flash) never stores the a s^2 score matrix, dropping the
                     second term; gradient checkpointing keeps only each layer's 2 s b h input and
                     one layer's full set
                     MoE: plus each layer's fp32 router logits, 4 s b E; the s b h terms are the
                     dense layer's (the experts a token visits are not modelled separately)
        logits       b s V x 4 bytes (fp32) x 2 (the logits and their gradient) for the minibatch
        kv_cache     2 x layers x kv heads x head_dim x (prompt + completion) x rows x 2 bytes (bf16)
    """
    for name, value in (
        ("rollout_rows", rollout_rows), ("prompt_len", prompt_len), ("completion_len", completion_len)):
        check_number(name, value, low=1, integer=True)
    check_number("lora_r", lora_r, low=0, integer=True)
    b = minibatch_rows or rollout_rows
    s, h, L = prompt_len + completion_len, config.hidden_size, config.num_hidden_layers
    a = config.num_attention_heads
    params = parameter_count(config)
    if lora_r:  # A (r, in) and B (out, r) on q, k, v, o, gate, up, down (model.lora.LORA_TARGET_MODULES)
        C, I, D, K = h, config.intermediate_size, config.head_dim, config.num_key_value_heads
        shapes = [(C, a * D), (C, K * D), (C, K * D), (a * D, C)]
        if config.model_type == "qwen3_moe":
            # peft (0.21) maps gate/up/down onto Qwen3-MoE's expert 3-D parameters, one adapter per
            # parameter, rank r per expert: A (r E, in), B (out, r E); the fused gate_up_proj (E, 2I, C)
            # gets rank 2r (two targets fused; peft's utils/transformers_weight_conversion.py); the
            # router none. Mixtral's experts were named w1/w2/w3, which these targets do not name:
            # peft leaves them alone and LoRA on a Mixtral adapts attention only (both tested).
            E, I_e = config.num_local_experts, config.expert_intermediate_size
            experts = 2 * lora_r * E * (C + 2 * I_e) + lora_r * E * (I_e + C)
        else:
            shapes += [] if config.is_moe else [(C, I), (C, I), (I, C)]
            experts = 0
        trained = L * (sum(lora_r * (n_in + n_out) for n_in, n_out in shapes) + experts)
    else:
        trained = params
    per_layer = s * b * h * (34 + (0 if fused_attention else 5 * a * s / h))
    if config.is_moe:  # each layer's router logits (b, s, E), kept in float32 for the auxiliary loss
        per_layer += 4 * s * b * config.num_local_experts
    activations = L * 2 * s * b * h + per_layer if gradient_checkpointing else L * per_layer
    return MemoryEstimate(
        policy=4 * (params + (trained if lora_r else 0)),
        reference=0 if (offload_reference or lora_r) else 4 * params,
        gradients=4 * trained,
        optimizer=8 * trained,
        activations=int(activations),
        logits=2 * 4 * b * s * config.vocab_size,
        kv_cache=kv_cache_bytes(config, rollout_rows, s, torch.bfloat16),
    )


# ------------------------------------------------------------------------------------ the models


def tiny_qwen3_config(tokenizer, **overrides) -> ModelConfig:
    """A Qwen3-architecture model small enough for a CPU: 2 layers, hidden 64, 4 query heads sharing 2
    key/value heads of head_dim 32, q/k norm, tied embeddings, rope_theta 1e6 (Qwen3's)."""
    settings = dict(model_type="qwen3", hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=1e6,
                    max_position_embeddings=1024, tie_word_embeddings=True, attn_implementation="sdpa")
    settings.update(overrides)
    return ModelConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.bos_token_id or tokenizer.pad_token_id,
                       eos_token_id=tokenizer.eos_token_id, **settings)


def task_tokenizer(task, n_texts: int = 2000, vocab_size: int = 1024) -> HFTokenizer:
    """A byte-level BPE tokenizer (ChatML template) trained on `n_texts` of the task's training
    prompts and completions: the tiny model's stand-in for a real checkpoint's tokenizer."""
    train, _ = task.make_split(seed=0, n_train=min(n_texts, task.space_size()), n_test=0)
    return train_bpe_tokenizer([text for e in train for text in (e.prompt, e.completion)],
                               vocab_size=vocab_size)


def tiny_qwen3(task, seed: int = 0, **overrides) -> tuple[LlamaModel, HFTokenizer]:
    """A random tiny Qwen3 and its BPE tokenizer for `task`, built in-process (seeded)."""
    tokenizer = task_tokenizer(task)
    torch.manual_seed(seed)
    return LlamaModel(tiny_qwen3_config(tokenizer, **overrides)), tokenizer


def load_model(task, folder: str | os.PathLike | None = None, device: str | torch.device = "cpu",
               attn_implementation: str = "sdpa") -> tuple[LlamaModel, HFTokenizer, str]:
    """(model, tokenizer, source): the checkpoint folder given (default: $RLHF_LAB_MODEL) loaded into
    the lab's model with its own tokenizer, or, when there is none, `tiny_qwen3(task)`."""
    from ..checkpoints import load_checkpoint

    folder = folder or os.environ.get(MODEL_ENV) or None
    if folder is None:
        model, tokenizer = tiny_qwen3(task)
        return model.to(device), tokenizer, "tiny random Qwen3 built in-process"
    model, tokenizer, _ = load_checkpoint(folder, device=device)
    model.set_attn_implementation(attn_implementation)
    return model, tokenizer, f"{folder}"
