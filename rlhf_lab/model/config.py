"""`ModelConfig`: the hyper-parameters of the lab's tiny Llama, validated at construction.

Field names follow Hugging Face's `LlamaConfig` where the two overlap (`hidden_size`,
`intermediate_size`, `num_attention_heads`, `num_key_value_heads`, `rope_theta`, ...), so that
`rlhf_lab.model.hf` can translate one into the other without a lookup table full of surprises.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass
class ModelConfig:
    """Shape of a Llama-style decoder (defaults: a small generic model, ~0.7 M parameters).

    The lab's shipped model is smaller (`rlhf_lab.sft.lab_model_config`: hidden 64, 2 layers, 4 query
    heads sharing 2 key/value heads, ~96 k parameters): small enough that RL shows learning on a
    2-core CPU within minutes.
    """

    vocab_size: int = 64
    hidden_size: int = 128
    intermediate_size: int = 352
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None  # None -> hidden_size // num_attention_heads
    max_position_embeddings: int = 128
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # HF names: {"rope_type": "linear", "factor": 2.0, ...}
    rope_interleaved: bool = False  # False: HF/NeoX half-split pairs; True: Meta's (2j, 2j+1) pairs
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    value_head: bool = False  # a scalar head on the last hidden state, for PPO's critic
    initializer_range: float = 0.02
    pad_token_id: int = 0
    bos_token_id: int = 1
    eos_token_id: int = 2
    extra: dict = field(default_factory=dict)  # free-form notes saved with the checkpoint

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            _positive_int(name, getattr(self, name))
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                    f"({self.num_attention_heads}), or set head_dim explicitly"
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
        _positive_int("head_dim", self.head_dim)
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (RoPE rotates pairs of dimensions), got {self.head_dim}")
        if self.num_key_value_heads > self.num_attention_heads:
            raise ValueError(
                f"num_key_value_heads ({self.num_key_value_heads}) must be <= num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention"
            )
        if not (isinstance(self.rope_theta, (int, float)) and self.rope_theta > 0):
            raise ValueError(f"rope_theta must be a positive number, got {self.rope_theta!r}")
        if not (isinstance(self.rms_norm_eps, (int, float)) and self.rms_norm_eps > 0):
            raise ValueError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        if self.rope_scaling is not None:
            if not isinstance(self.rope_scaling, dict):
                raise ValueError(f"rope_scaling must be a dict or None, got {type(self.rope_scaling).__name__}")
            scaling = dict(self.rope_scaling)
            scaling.pop("rope_theta", None)
            rope_type = scaling.get("rope_type", scaling.get("type", "default"))
            if rope_type not in ROPE_TYPES:
                raise ValueError(f"rope_type must be one of {ROPE_TYPES}, got {rope_type!r}")
            scaling["rope_type"] = rope_type
            scaling.pop("type", None)
            self.rope_scaling = None if rope_type == "default" and len(scaling) == 1 else scaling
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value < self.vocab_size:
                raise ValueError(f"{name} must be an integer in [0, vocab_size={self.vocab_size}), got {value!r}")

    @property
    def rope_type(self) -> str:
        return (self.rope_scaling or {}).get("rope_type", "default")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**data)
