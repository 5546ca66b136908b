"""`ModelConfig`: the hyper-parameters of the lab's tiny Llama, validated at construction and assignment.

Field names follow Hugging Face's `LlamaConfig` where the two overlap (`hidden_size`,
`intermediate_size`, `num_attention_heads`, `num_key_value_heads`, `rope_theta`, ...), so that
`rlhf_lab.model.hf` can translate one into the other without a lookup table full of surprises.

The same decoder also holds the two other dense families people train with RL from scratch. What
differs is small (transformers' `models/{llama,qwen2,qwen3}/modeling_*.py`):

    model_type  q/k/v bias        o_proj bias       MLP bias   q_norm / k_norm (per head, before RoPE)
    llama       attention_bias    attention_bias    mlp_bias   no
    qwen2       always            never             no         no
    qwen3       attention_bias    attention_bias    no         yes (RMSNorm over head_dim)

All three: RMSNorm, SwiGLU MLP, rotate-half RoPE, grouped-query attention.

Two mixture-of-experts families replace every layer's MLP with a router and E SwiGLU experts
(`moe.SparseMoeBlock`; transformers' `models/{mixtral,qwen3_moe}/`):

    model_type  attention                       experts' width           top-k weights renormalised
    mixtral     llama's (no bias, no q/k norm)  intermediate_size        always
    qwen3_moe   qwen3's (q_norm / k_norm)       moe_intermediate_size    if norm_topk_prob

`num_local_experts` > 0 makes a model MoE (0 = dense) and is only allowed for these two families.
`router_aux_loss_coef` defaults to 0.001, transformers 5.x's default for both (MixtralConfig and
Qwen3MoeConfig; Switch Transformer used 0.01). `router_z_loss_coef` (ST-MoE's z-loss, off by default)
is the lab's own: neither transformers family has one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..util.validation import Validated, check_number, setting
from .rope import check_head_dim, read_rope_scaling

MODEL_TYPES = ("llama", "qwen2", "qwen3", "mixtral", "qwen3_moe")
MOE_MODEL_TYPES = ("mixtral", "qwen3_moe")  # transformers' model_type of each supported family
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")  # transformers' names: written-out softmax, or the fused kernel


def _check_head_dim(name: str, value) -> None:
    check_head_dim(value)


@dataclass
class ModelConfig(Validated):
    """Shape of a Llama-style decoder (defaults: a small generic model, ~0.7 M parameters).

    The lab's shipped model is smaller (`rlhf_lab.sft.lab_model_config`: hidden 64, 2 layers, 4 query
    heads sharing 2 key/value heads, ~96 k parameters): small enough that RL shows learning on a
    2-core CPU within minutes. Each field declares what it accepts (rlhf_lab.util.validation).
    """

    model_type: str = setting("llama", choices=MODEL_TYPES, help="which family's layer details (table above)")
    vocab_size: int = setting(64, ge=1)
    hidden_size: int = setting(128, ge=1)
    intermediate_size: int = setting(352, ge=1, help="SwiGLU width (mixtral: each expert's)")
    num_hidden_layers: int = setting(4, ge=1)
    num_attention_heads: int = setting(4, ge=1)
    num_key_value_heads: int = setting(2, ge=1, help="<= num_attention_heads, and divides it")
    head_dim: int | None = setting(None, check=_check_head_dim, help="None: hidden_size // attention heads")
    max_position_embeddings: int = setting(128, ge=1)
    rope_theta: float = setting(10000.0, gt=1, help="RoPE base (rope_inv_freq's bound)")
    rope_scaling: dict | None = setting(None, help='HF names: {"rope_type": "linear", "factor": 2.0, ...}')
    rope_interleaved: bool = setting(False, help="False: HF/NeoX half-split pairs; True: Meta's (2j, 2j+1)")
    rms_norm_eps: float = setting(1e-6, gt=0)
    tie_word_embeddings: bool = setting(True)
    attention_bias: bool = setting(False, help="llama / qwen3: a bias on q, k, v and o")
    mlp_bias: bool = setting(False, help="llama only: a bias on gate, up and down")
    attn_implementation: str = setting("eager", choices=ATTN_IMPLEMENTATIONS,
                                       help="sdpa: torch's scaled_dot_product_attention, same function")
    value_head: bool = setting(False, help="a scalar head on the last hidden state, for PPO's critic")
    initializer_range: float = setting(0.02, ge=0)
    pad_token_id: int = setting(0, help="0 <= id < vocab_size")
    bos_token_id: int = setting(1, help="0 <= id < vocab_size")
    eos_token_id: int = setting(2, help="0 <= id < vocab_size")
    # Mixture of experts (mixtral / qwen3_moe only; module docstring). transformers' names.
    num_local_experts: int = setting(0, ge=0, help="E experts per layer; 0 = dense MLP")
    num_experts_per_tok: int = setting(2, ge=1, help="k: experts each token is routed to")
    moe_intermediate_size: int | None = setting(None, ge=1, help="qwen3_moe: each expert's width")
    norm_topk_prob: bool = setting(True, help="renormalise the k gate weights to sum to 1 (Mixtral always)")
    router_aux_loss_coef: float = setting(0.001, ge=0, help="weight of the Switch load-balancing loss")
    router_z_loss_coef: float = setting(0.0, ge=0, help="weight of ST-MoE's router z-loss (0 = off)")
    extra: dict = setting(default_factory=dict, help="free-form notes saved with the checkpoint")

    def check(self) -> None:
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                    f"({self.num_attention_heads}), or set head_dim explicitly"
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
            check_head_dim(self.head_dim)
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
        if self.model_type != "llama":
            for name in ("mlp_bias", "rope_interleaved"):  # transformers' Qwen classes have no such option
                if getattr(self, name):
                    raise ValueError(f"{name}=True is a llama option; model_type {self.model_type!r} has none")
        if self.model_type == "qwen2" and self.attention_bias:
            raise ValueError("attention_bias is not a qwen2 option: qwen2 always has q/k/v biases and no o_proj bias")
        if self.rope_scaling is not None:
            # The same checks RotaryEmbedding runs, so a bad dict fails here rather than at LlamaModel(config).
            scaling = read_rope_scaling(self.rope_scaling, self.rope_theta)
            self.rope_scaling = None if scaling == {"rope_type": "default"} else scaling
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            check_number(name, getattr(self, name), low=0, high=self.vocab_size, high_open=True, integer=True)
        self._check_moe()

    def _check_moe(self) -> None:
        if self.model_type in MOE_MODEL_TYPES:
            if self.num_local_experts < 1:
                raise ValueError(f"num_local_experts must be >= 1 for model_type {self.model_type!r} "
                                 f"(an MoE family), got {self.num_local_experts}")
            if self.num_experts_per_tok > self.num_local_experts:
                raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) must be <= num_local_experts "
                                 f"({self.num_local_experts}): a token cannot use more experts than there are")
        elif self.num_local_experts:
            raise ValueError(f"num_local_experts > 0 needs model_type in {MOE_MODEL_TYPES}, "
                             f"got model_type {self.model_type!r}")
        if self.model_type == "mixtral":
            if not self.norm_topk_prob:
                raise ValueError("norm_topk_prob=False is not a mixtral option: Mixtral always renormalises "
                                 "the top-k weights (use model_type 'qwen3_moe')")
            if self.moe_intermediate_size is not None:
                raise ValueError("moe_intermediate_size is a qwen3_moe option: mixtral's experts use intermediate_size")
            if self.attention_bias:
                raise ValueError("attention_bias is not a mixtral option (Mixtral's attention has no biases)")

    @property
    def is_moe(self) -> bool:
        """Whether every layer's MLP is a sparse mixture of experts (`moe.SparseMoeBlock`)."""
        return self.num_local_experts > 0

    @property
    def expert_intermediate_size(self) -> int:
        """Each expert's SwiGLU width: moe_intermediate_size (Qwen3-MoE) or intermediate_size (Mixtral)."""
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def qkv_bias(self) -> bool:
        """Whether q_proj, k_proj and v_proj carry a bias (Qwen2 always; Llama and Qwen3 with attention_bias)."""
        return self.attention_bias or self.model_type == "qwen2"

    @property
    def o_proj_bias(self) -> bool:
        return self.attention_bias  # False for qwen2 (checked above)

    @property
    def qk_norm(self) -> bool:
        """Qwen3's (and Qwen3-MoE's) RMSNorm on each query and key head (over head_dim), after the projection, before RoPE."""
        return self.model_type in ("qwen3", "qwen3_moe")

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
