"""Moving weights between the lab's model and Hugging Face transformers.

The lab's parameters carry HF's names, so conversion is a state-dict copy plus a config
translation. Five families load: Llama (incl. SmolLM-style configs), Qwen2 / Qwen2.5, Qwen3 and the
mixtures of experts Mixtral and Qwen3-MoE (`FAMILIES`; experts in transformers 5.x's fused layout,
`mlp.experts.gate_up_proj` (E, 2I, C) and `mlp.experts.down_proj` (E, C, I)); a config option the lab's model does not implement (sliding-window attention, a
rope type it does not know, dropout, another activation) is refused with an error naming it, never
silently ignored. A saved folder is an ordinary HF checkpoint:

    folder/config.json          LlamaConfig (plus an "rlhf_lab" entry with lab-only fields)
    folder/model.safetensors    weights
    folder/tokenizer.json       (optional) the character tokenizer, with tokenizer_config.json
                                and generation_config.json (its pad / bos / eos ids, for `generate`)
    folder/value_head.safetensors  (optional) PPO's critic head, which HF does not know about

so `transformers.AutoModelForCausalLM.from_pretrained(folder)` loads it too. Writes are atomic: the
folder is assembled under a temporary name and renamed into place, so an interrupted save never
leaves a half-written checkpoint where a good one was, and the next save or load repairs what a
killed one left (`rlhf_lab.util.atomic`). Loads are checked: config.json must be a Llama config, each
weights file must match the checksum saved in config.json["rlhf_lab"]["sha256"] (when there is one),
and no tensor may hold NaN or inf.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError as SafetensorsError
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from ..util.atomic import recover_folder, replace_folder, write_bytes
from ..util.validation import check_number
from .config import MODEL_TYPES, ModelConfig
from .transformer import LlamaModel

# model_type -> (transformers config class, model class), for `config_to_hf`, `to_hf` and config.json.
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
}


class CheckpointError(ValueError):
    """A checkpoint folder is missing, truncated, or does not match its config."""


_LAB_ONLY_FIELDS = ("rope_interleaved", "value_head", "extra", "attn_implementation", "router_z_loss_coef")


def config_to_hf(config: ModelConfig):
    """ModelConfig -> the transformers config of its family (eager attention, so parity tests compare
    like with like)."""
    import transformers

    config_class = getattr(transformers, FAMILIES[config.model_type][0])
    family_options = {  # what each family's transformers config has beyond the shared fields
        "llama": {"attention_bias": config.attention_bias, "mlp_bias": config.mlp_bias, "head_dim": config.head_dim},
        "qwen2": {"use_sliding_window": False},
        "qwen3": {"attention_bias": config.attention_bias, "head_dim": config.head_dim, "use_sliding_window": False},
        "mixtral": {"head_dim": config.head_dim, "sliding_window": None, "num_local_experts": config.num_local_experts,
                    "num_experts_per_tok": config.num_experts_per_tok, "router_jitter_noise": 0.0,
                    "router_aux_loss_coef": config.router_aux_loss_coef},
        # Every layer sparse (decoder_sparse_step 1, no mlp_only_layers): intermediate_size is then unused.
        "qwen3_moe": {"attention_bias": config.attention_bias, "head_dim": config.head_dim, "use_sliding_window": False,
                      "num_experts": config.num_local_experts, "num_experts_per_tok": config.num_experts_per_tok,
                      "moe_intermediate_size": config.expert_intermediate_size, "norm_topk_prob": config.norm_topk_prob,
                      "decoder_sparse_step": 1, "mlp_only_layers": [],
                      "router_aux_loss_coef": config.router_aux_loss_coef},
    }[config.model_type]
    if config.model_type == "qwen2" and config.head_dim * config.num_attention_heads != config.hidden_size:
        raise CheckpointError("qwen2 has no head_dim option: head_dim must be hidden_size // num_attention_heads")
    rope_parameters = {"rope_type": "default", **(config.rope_scaling or {}), "rope_theta": float(config.rope_theta)}
    hf_config = config_class(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters=rope_parameters,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_word_embeddings,
        initializer_range=config.initializer_range,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        **family_options,
    )
    hf_config._attn_implementation = "eager"
    return hf_config


def _rope_from_hf_dict(hf: dict) -> tuple[float, dict | None]:
    """Read rope_theta and the scaling dict from either transformers 5 (`rope_parameters`) or 4.x
    (`rope_theta` + `rope_scaling`) config dicts."""
    for key in ("rope_parameters", "rope_scaling"):
        if hf.get(key) is not None and not isinstance(hf[key], dict):
            raise CheckpointError(f"{key} must be a dict or null, got {hf[key]!r}")
    params = dict(hf.get("rope_parameters") or {})
    theta = params.pop("rope_theta", hf.get("rope_theta", 10000.0))
    check_number("rope_theta", theta, low=1, low_open=True)
    if not params and hf.get("rope_scaling"):
        params = dict(hf["rope_scaling"])
    params.pop("rope_theta", None)
    if params.get("rope_type", params.get("type", "default")) == "default" and len(params) <= 1:
        params = {}
    return float(theta), (params or None)


def refuse_unsupported(hf: dict) -> None:
    """Raise CheckpointError naming the first option of a transformers config dict that the lab's
    model does not implement (it would otherwise compute a different function without a word)."""
    model_type = hf.get("model_type", "llama")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"hidden_act must be 'silu' (SwiGLU), got {hf.get('hidden_act')!r}")
    if hf.get("use_sliding_window"):
        raise CheckpointError("use_sliding_window=True is not supported: the lab's attention is full causal attention")
    sliding = [i for i, kind in enumerate(hf.get("layer_types") or []) if kind != "full_attention"]
    if sliding:
        raise CheckpointError(f"layer_types: layers {sliding[:5]} are not 'full_attention' (sliding-window "
                              "attention is not supported)")
    if (hf.get("attention_dropout") or 0) > 0:
        raise CheckpointError(f"attention_dropout={hf['attention_dropout']} is not supported (the lab's model has no dropout)")
    if (hf.get("pretraining_tp") or 1) != 1:
        raise CheckpointError(f"pretraining_tp={hf['pretraining_tp']} is not supported (use 1)")
    if model_type != "llama" and (hf.get("mlp_bias") or False):
        raise CheckpointError(f"mlp_bias is a llama option, not {model_type}'s")
    if model_type == "mixtral":
        if hf.get("sliding_window") is not None:
            raise CheckpointError(f"sliding_window={hf['sliding_window']} is not supported: the lab's attention is full "
                                  "causal attention (use None)")
        if (hf.get("router_jitter_noise") or 0) > 0:
            raise CheckpointError(f"router_jitter_noise={hf['router_jitter_noise']} is not supported (use 0.0)")
    if model_type == "qwen3_moe":
        if hf.get("mlp_only_layers"):
            raise CheckpointError(f"mlp_only_layers={hf['mlp_only_layers']} is not supported: every layer of the "
                                  "lab's MoE model is sparse (use [])")
        if hf.get("decoder_sparse_step", 1) != 1:
            raise CheckpointError(f"decoder_sparse_step={hf['decoder_sparse_step']} is not supported: every layer of "
                                  "the lab's MoE model is sparse (use 1)")


def config_from_hf(hf_config) -> ModelConfig:
    """A transformers Llama / Qwen2 / Qwen3 / Mixtral / Qwen3-MoE config (or its dict) -> ModelConfig.

    Raises CheckpointError for an option the lab's model does not implement (`refuse_unsupported`)."""
    hf = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
    refuse_unsupported(hf)
    model_type = hf.get("model_type", "llama")
    theta, scaling = _rope_from_hf_dict(hf)
    lab = dict(hf.get("rlhf_lab") or {})
    eos = hf.get("eos_token_id", 2)
    head_dim = hf.get("head_dim") if model_type != "qwen2" else None  # transformers' Qwen2 derives it
    moe = {}
    if model_type == "mixtral":
        moe = dict(num_local_experts=hf.get("num_local_experts", hf.get("num_experts")), norm_topk_prob=True)
    elif model_type == "qwen3_moe":
        moe = dict(num_local_experts=hf.get("num_experts", hf.get("num_local_experts")),
                   moe_intermediate_size=hf["moe_intermediate_size"], norm_topk_prob=bool(hf.get("norm_topk_prob", False)))
    if moe:
        moe.update(num_experts_per_tok=hf.get("num_experts_per_tok", 2),
                   router_aux_loss_coef=hf.get("router_aux_loss_coef", 0.001))
    return ModelConfig(
        model_type=model_type,
        attention_bias=bool(hf.get("attention_bias", False)) if model_type not in ("qwen2", "mixtral") else False,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"],
        num_key_value_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=head_dim,
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        initializer_range=hf.get("initializer_range", 0.02),
        pad_token_id=hf.get("pad_token_id") if hf.get("pad_token_id") is not None else 0,
        bos_token_id=hf.get("bos_token_id") if hf.get("bos_token_id") is not None else 1,
        eos_token_id=eos[0] if isinstance(eos, list) else (eos if eos is not None else 2),
        **moe,
        **{k: lab[k] for k in _LAB_ONLY_FIELDS if k in lab},
    )


def _lm_state_dict(model: LlamaModel) -> dict[str, torch.Tensor]:
    """The language-model weights under HF names (no value head, no RoPE buffers)."""
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(("value_head.", "rotary_emb."))}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # HF re-ties it from embed_tokens
    return state


def _load_lm_state_dict(model: LlamaModel, state: dict[str, torch.Tensor], source: str) -> None:
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}  # old HF buffers
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = _lm_state_dict(model)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{source}: weights do not match the config: missing {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                f"{source}: tensor {name} has shape {tuple(tensor.shape)}, config expects {tuple(expected[name].shape)}"
            )
    model.load_state_dict(state, strict=False)


def from_hf(hf_model) -> LlamaModel:
    """A transformers `LlamaForCausalLM` / `Qwen2ForCausalLM` / `Qwen3ForCausalLM` / `MixtralForCausalLM` /
    `Qwen3MoeForCausalLM` -> the lab's model
    with the same weights (float32)."""
    config = config_from_hf(hf_model.config)
    model = LlamaModel(config)
    state = {k: v.detach().float().cpu() for k, v in hf_model.state_dict().items()}
    _load_lm_state_dict(model, state, "hf_model")
    return model.to(next(hf_model.parameters()).device).eval()


def to_hf(model: LlamaModel):
    """The lab's model -> its family's transformers model (`LlamaForCausalLM`, ...) with the same
    weights (float32, eager attention).

    Interleaved-RoPE models are converted to HF's half-split layout by permuting q/k rows.
    """
    import transformers

    from .rope import interleaved_to_half_split

    config = model.config
    hf_model = getattr(transformers, FAMILIES[config.model_type][1])(config_to_hf(config))
    state = {k: v.detach().float().cpu().clone() for k, v in _lm_state_dict(model).items()}
    if config.rope_interleaved:
        for name in list(state):
            if name.endswith("q_proj.weight"):
                state[name] = interleaved_to_half_split(state[name], config.num_attention_heads)
            elif name.endswith("k_proj.weight"):
                state[name] = interleaved_to_half_split(state[name], config.num_key_value_heads)
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise CheckpointError(f"to_hf: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        hf_model.tie_weights()
    return hf_model.to(model.device).eval()


def save_pretrained(model: LlamaModel, folder: str | os.PathLike, tokenizer=None, metadata: dict | None = None) -> Path:
    """Save as a Hugging Face Llama folder (atomically). `metadata` lands in config.json["rlhf_lab"]."""
    config = model.config
    hf_dict = config_to_hf(config).to_dict()
    hf_dict["architectures"] = [FAMILIES[config.model_type][1]]
    hf_dict["dtype"] = "float32"
    hf_dict["rlhf_lab"] = {**{k: getattr(config, k) for k in _LAB_ONLY_FIELDS}, **(metadata or {})}
    state = {k: v.detach().float().cpu().contiguous() for k, v in _lm_state_dict(model).items()}
    value_state = (
        {k: v.detach().float().cpu().contiguous() for k, v in model.value_head.state_dict().items()}
        if model.value_head is not None
        else None
    )

    def write(tmp: Path) -> None:
        # Serialised in memory, then written with Python's file API: a full disk is an OSError naming it.
        metadata = {"format": "pt"}
        write_bytes(tmp / "model.safetensors", safetensors_bytes(state, metadata=metadata))
        if value_state is not None:
            write_bytes(tmp / "value_head.safetensors", safetensors_bytes(value_state, metadata=metadata))
        # A checksum per weights file: a same-size overwrite of the bytes is caught at load time.
        hf_dict["rlhf_lab"]["sha256"] = {p.name: file_sha256(p) for p in sorted(tmp.glob("*.safetensors"))}
        (tmp / "config.json").write_text(json.dumps(hf_dict, indent=2, sort_keys=True) + "\n")
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
            save_generation_config(tmp, tokenizer)

    return replace_folder(Path(folder), write)


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_tensors(path: str | os.PathLike, sha256: str | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a .safetensors file, refusing what would load silently broken: a file whose
    checksum differs from the one saved with it, and any NaN or infinite value (a corrupt file, or
    weights saved from a diverged run)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} not found")
    if sha256 is not None and file_sha256(path) != sha256:
        raise CheckpointError(f"{path} is corrupt or truncated, or was modified after saving: its checksum "
                              "differs from the one saved with it")
    try:
        state = load_file(str(path))
    except (SafetensorsError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is corrupt or truncated ({exc})") from exc
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(f"{path}: tensor {name} holds {bad} non-finite value(s) (NaN or inf); the file is "
                                  "corrupt or was saved from a diverged run")
    return state


def save_generation_config(folder: str | os.PathLike, tokenizer) -> Path:
    """folder/generation_config.json: the tokenizer's pad / bos / eos ids, for `model.generate`.

    transformers still derives them from config.json when this file is missing, but calls that a
    legacy path; with the file, HF's `generate` stops at the lab's EOS and pads with its PAD for sure.
    """
    from transformers import GenerationConfig

    config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    config.save_pretrained(folder)
    return Path(folder) / "generation_config.json"


REQUIRED_CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def read_config(folder: str | os.PathLike) -> dict:
    """folder/config.json as a dict, after repairing a killed save of the folder (`recover_folder`)."""
    recover_folder(folder)
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder} is not a checkpoint folder: config.json not found")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} must hold a JSON object (a LlamaConfig), got a {type(config).__name__}")
    missing = [key for key in REQUIRED_CONFIG_KEYS if key not in config]
    if missing:
        raise CheckpointError(f"{path} lacks {missing}, which a Llama config must give")
    lab = config.get("rlhf_lab")
    if lab is not None and not (isinstance(lab, dict) and isinstance(lab.get("sha256", {}), dict)):
        raise CheckpointError(f"{path}: \"rlhf_lab\" must be an object whose \"sha256\" maps file names to "
                              f"checksums, got {lab!r:.80}")
    return config


def _load_weights(folder: Path, checksums: dict, require_checksums: bool = False) -> dict[str, torch.Tensor]:
    """model.safetensors, or the shards listed in model.safetensors.index.json (larger checkpoints),
    each checked by `load_tensors` (against its sha256 in `checksums` when the lab saved one, which
    `require_checksums` demands)."""
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif index.is_file():
        files = [folder / name for name in sorted(set(read_weight_map(index).values()))]
    else:
        raise CheckpointError(f"{folder}: model.safetensors not found")
    state: dict[str, torch.Tensor] = {}
    for weights in files:
        if require_checksums:
            require_checksum(folder, weights.name, checksums)
        state.update(load_tensors(weights, checksums.get(weights.name)))
    return state


def read_weight_map(index: Path) -> dict[str, str]:
    """The "weight_map" of a sharded checkpoint's model.safetensors.index.json: tensor name -> shard
    file, a file name in the same folder."""
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise CheckpointError(f"{index} is not a JSON object with a \"weight_map\" ({exc})") from exc
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index} must map tensor names to shard files (\"weight_map\"), got "
                              f"{weight_map!r:.80}")
    for shard in weight_map.values():
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise CheckpointError(f"{index} names the shard {shard!r}; a shard must be a file name in the "
                                  "same folder")
    return weight_map


def require_checksum(folder: Path, name: str, checksums: dict) -> None:
    """Raise CheckpointError unless config.json gives the sha256 of the weights file `name`."""
    if name not in checksums:
        raise CheckpointError(f"{folder / 'config.json'} carries no sha256 of {name}, so a damaged file "
                              "would load unnoticed; regenerate the checkpoint")


def from_pretrained(folder: str | os.PathLike, device: str | torch.device = "cpu",
                    attn_implementation: str | None = None, require_checksums: bool = False) -> LlamaModel:
    """Load a Hugging Face Llama / Qwen2 / Qwen3 / Mixtral / Qwen3-MoE folder (ours or any compatible
    one) into the lab's model, in float32. `attn_implementation` ("eager" / "sdpa") overrides the
    saved choice. `require_checksums`: refuse a weights file whose sha256 config.json does not give
    (the shipped checkpoints carry one for each)."""
    folder = Path(folder)
    hf_dict = read_config(folder)
    try:
        config = config_from_hf(hf_dict)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{folder / 'config.json'}: {exc}") from exc
    if attn_implementation is not None:
        config = ModelConfig.from_dict({**config.to_dict(), "attn_implementation": attn_implementation})
    checksums = (hf_dict.get("rlhf_lab") or {}).get("sha256") or {}
    state = _load_weights(folder, checksums, require_checksums)
    config.value_head = False
    model = LlamaModel(config)
    _load_lm_state_dict(model, state, str(folder))
    value_file = folder / "value_head.safetensors"
    if value_file.is_file():
        if require_checksums:
            require_checksum(folder, value_file.name, checksums)
        model.add_value_head()
        try:
            model.value_head.load_state_dict(load_tensors(value_file, checksums.get("value_head.safetensors")))
        except RuntimeError as exc:
            raise CheckpointError(f"{value_file} is corrupt or does not match ({exc})") from exc
    return model.to(device).eval()
