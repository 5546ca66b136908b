"""Moving weights between the lab's model and Hugging Face transformers.

The lab's parameters carry HF's names, so conversion is a state-dict copy plus a config
translation. Three families load: Llama (incl. SmolLM-style configs), Qwen2 / Qwen2.5 and Qwen3
(`FAMILIES`); a config option the lab's model does not implement (sliding-window attention, a
rope type it does not know, dropout, another activation) is refused with an error naming it, never
silently ignored. A saved folder is an ordinary HF checkpoint:

    folder/config.json          LlamaConfig (plus an "rlhf_lab" entry with lab-only fields)
    folder/model.safetensors    weights
    folder/tokenizer.json       (optional) the character tokenizer, with tokenizer_config.json
                                and generation_config.json (its pad / bos / eos ids, for `generate`)
    folder/value_head.safetensors  (optional) PPO's critic head, which HF does not know about

so `transformers.AutoModelForCausalLM.from_pretrained(folder)` loads it too. Writes are atomic: the
folder is assembled under a temporary name and renamed into place, so an interrupted save never
leaves a half-written checkpoint where a good one was.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError as SafetensorsError
from safetensors.torch import load_file, save_file

from .config import MODEL_TYPES, ModelConfig
from .transformer import LlamaModel

# model_type -> (transformers config class, model class), for `config_to_hf`, `to_hf` and config.json.
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


class CheckpointError(ValueError):
    """A checkpoint folder is missing, truncated, or does not match its config."""


_LAB_ONLY_FIELDS = ("rope_interleaved", "value_head", "extra", "attn_implementation")


def config_to_hf(config: ModelConfig):
    """ModelConfig -> the transformers config of its family (eager attention, so parity tests compare
    like with like)."""
    import transformers

    config_class = getattr(transformers, FAMILIES[config.model_type][0])
    family_options = {  # what each family's transformers config has beyond the shared fields
        "llama": {"attention_bias": config.attention_bias, "mlp_bias": config.mlp_bias, "head_dim": config.head_dim},
        "qwen2": {"use_sliding_window": False},
        "qwen3": {"attention_bias": config.attention_bias, "head_dim": config.head_dim, "use_sliding_window": False},
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
    params = dict(hf.get("rope_parameters") or {})
    theta = params.pop("rope_theta", hf.get("rope_theta", 10000.0))
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


def config_from_hf(hf_config) -> ModelConfig:
    """A transformers Llama / Qwen2 / Qwen3 config (or its dict) -> ModelConfig.

    Raises CheckpointError for an option the lab's model does not implement (`refuse_unsupported`)."""
    hf = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
    refuse_unsupported(hf)
    model_type = hf.get("model_type", "llama")
    theta, scaling = _rope_from_hf_dict(hf)
    lab = dict(hf.get("rlhf_lab") or {})
    eos = hf.get("eos_token_id", 2)
    head_dim = hf.get("head_dim") if model_type != "qwen2" else None  # transformers' Qwen2 derives it
    return ModelConfig(
        model_type=model_type,
        attention_bias=bool(hf.get("attention_bias", False)) if model_type != "qwen2" else False,
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
    """A transformers `LlamaForCausalLM` / `Qwen2ForCausalLM` / `Qwen3ForCausalLM` -> the lab's model
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


def _atomic_write_folder(folder: Path, write) -> None:
    """Build the folder next to its destination, then swap it in with renames."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        write(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a checkpoint is meant to be shared
        for f in tmp.iterdir():  # flush file contents before the rename makes them visible
            os.chmod(f, 0o644)
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if folder.exists():
            old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
            os.replace(folder, old)
            os.replace(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
        (tmp / "config.json").write_text(json.dumps(hf_dict, indent=2, sort_keys=True) + "\n")
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if value_state is not None:
            save_file(value_state, str(tmp / "value_head.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
            save_generation_config(tmp, tokenizer)

    _atomic_write_folder(Path(folder), write)
    return Path(folder)


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


def read_config(folder: str | os.PathLike) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder} is not a checkpoint folder: config.json not found")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc})") from exc


def _load_weights(folder: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, or the shards listed in model.safetensors.index.json (larger checkpoints)."""
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif index.is_file():
        files = [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    else:
        raise CheckpointError(f"{folder}: model.safetensors not found")
    state: dict[str, torch.Tensor] = {}
    for weights in files:
        try:
            state.update(load_file(str(weights)))
        except (SafetensorsError, OSError, ValueError) as exc:
            raise CheckpointError(f"{weights} is corrupt or truncated ({exc})") from exc
    return state


def from_pretrained(folder: str | os.PathLike, device: str | torch.device = "cpu",
                    attn_implementation: str | None = None) -> LlamaModel:
    """Load a Hugging Face Llama / Qwen2 / Qwen3 folder (ours or any compatible one) into the lab's
    model, in float32. `attn_implementation` ("eager" / "sdpa") overrides the saved choice."""
    folder = Path(folder)
    config = config_from_hf(read_config(folder))
    if attn_implementation is not None:
        config = ModelConfig.from_dict({**config.to_dict(), "attn_implementation": attn_implementation})
    state = _load_weights(folder)
    config.value_head = False
    model = LlamaModel(config)
    _load_lm_state_dict(model, state, str(folder))
    value_file = folder / "value_head.safetensors"
    if value_file.is_file():
        model.add_value_head()
        try:
            model.value_head.load_state_dict(load_file(str(value_file)))
        except (SafetensorsError, OSError, RuntimeError) as exc:
            raise CheckpointError(f"{value_file} is corrupt or does not match ({exc})") from exc
    return model.to(device).eval()
