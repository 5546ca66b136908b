"""A sparse mixture-of-experts MLP (Mixtral / Qwen3-MoE style) and its two auxiliary losses.

    x (B, T, C) -> router logits z = x W_gate^T                       (B, T, E)   E experts
                -> p = softmax(z) in float32; keep the top k of p     (B, T, k)   expert_indices
                -> w = p at those k, renormalised to sum to 1   (Mixtral always; Qwen3-MoE if norm_topk_prob)
                -> y = sum_j w_j * expert_{i_j}(x)
                   expert_e(x) = down_e( silu(gate_e(x)) * up_e(x) )   (SwiGLU)

Only k of the E experts contribute to a token: the model holds E experts' parameters but each token
pays for k ("active parameters"). Parameter names and layouts are transformers 5.x's
(`models/{mixtral,qwen3_moe}/modeling_*.py`), so a state dict moves between the two unchanged:

    mlp.gate.weight               (E, C)        the router (no bias)
    mlp.experts.gate_up_proj      (E, 2I, C)    each expert's gate and up projections, stacked
    mlp.experts.down_proj         (E, C, I)

Routing replay (Zheng et al., GSPO paper §5, arXiv 2507.18071): pass `expert_indices` from an earlier
forward (pi_old's) and the block uses exactly those experts instead of its own top-k. The weights w are
still the *current* router's probabilities at those experts, so the router keeps its gradient.

Auxiliary losses, added to the training loss by the trainer (`moe_aux_loss`):
- load balancing (Switch Transformer, Fedus et al. 2021, eqs. 4-6; transformers' `load_balancing_loss_func`):
      L_aux = E * sum_e f_e * P_e,  f_e = share of the (token, slot) assignments that go to expert e,
                                    P_e = mean router probability of expert e,
  both pooled over all MoE layers and non-padding tokens. Balanced routing gives f_e = k/E, P_e = 1/E,
  L_aux = k; only P_e carries a gradient (f_e counts a top-k).
- router z-loss (ST-MoE, Zoph et al. 2022, arXiv 2202.08906, eq. 5): L_z = mean over tokens of
  logsumexp(z)^2; keeps router logits small so the float32 softmax stays well conditioned.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Experts(nn.Module):
    """E SwiGLU experts stored as two 3-D parameters (transformers 5.x's layout)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size
        # (E, 2I, C)
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))  # (E, C, I)

    def reset_parameters(self, std: float) -> None:
        nn.init.normal_(self.gate_up_proj, mean=0.0, std=std)
        nn.init.normal_(self.down_proj, mean=0.0, std=std)

    def forward(self, x: torch.Tensor, expert_indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """y_n = sum_j weights[n, j] * expert_{expert_indices[n, j]}(x_n).

        x (N, C); expert_indices (N, k) long; weights (N, k) -> (N, C).

        Every expert is evaluated on every token, then each token keeps its k. At this size (C = 64, E <= 8)
        a forward is dominated by per-op overhead, not arithmetic, and one batched matmul over the E
        experts is several times cheaper on a CPU than dispatching tokens expert by expert (what
        transformers' loop, or a grouped GEMM on a GPU, does to save the FLOPs). The sum is the same:
        an expert that is not among a token's k gets weight exactly 0.
        """
        gate, up = torch.einsum("nc,eic->eni", x, self.gate_up_proj).chunk(2, dim=-1)  # (E, N, I) each
        out = torch.einsum("eni,eci->enc", F.silu(gate) * up, self.down_proj)  # (E, N, C): expert_e(x_n)
        # Dense (N, E) routing weights: weights[n, j] at column expert_indices[n, j], 0 elsewhere.
        dense = torch.zeros(x.shape[0], self.num_experts, dtype=out.dtype, device=x.device)
        dense = dense.scatter_add(1, expert_indices, weights.to(out.dtype))
        return torch.einsum("ne,enc->nc", dense, out)


class SparseMoeBlock(nn.Module):
    """Router + E SwiGLU experts; replaces the dense MLP in every layer of an MoE model.

    forward(x (B, T, C), expert_indices (B, T, k) long | None)
        -> (y (B, T, C), router_logits (B, T, E) float32, expert_indices (B, T, k) long)
    """

    def __init__(self, config) -> None:
        super().__init__()
        self.num_experts = config.num_local_experts
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, self.num_experts, bias=False)  # the router: z = x W^T
        self.experts = Experts(self.num_experts, config.hidden_size, config.expert_intermediate_size)

    def route(self, x: torch.Tensor, expert_indices: torch.Tensor | None = None):
        """The router alone: (router_logits (..., E) float32, expert_indices (..., k), weights (..., k)).

        With `expert_indices` given (routing replay) those experts are kept instead of the top-k."""
        # (..., E) as in transformers: the linear in x's dtype, then float32
        router_logits = self.gate(x).float()
        probs = torch.softmax(router_logits, dim=-1)  # p_e = exp(z_e) / sum_e' exp(z_e')
        if expert_indices is None:
            expert_indices = torch.topk(probs, self.top_k, dim=-1).indices  # (..., k), largest p first
        weights = probs.gather(-1, expert_indices)  # (..., k): the current router's p at the chosen experts
        if self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)  # w_j = p_j / sum_j' p_j'
        return router_logits, expert_indices, weights

    def forward(self, x: torch.Tensor, expert_indices: torch.Tensor | None = None):
        B, T, C = x.shape
        if expert_indices is not None:
            check_expert_indices(expert_indices, (B, T, self.top_k), self.num_experts)
        router_logits, expert_indices, weights = self.route(x, expert_indices)
        y = self.experts(x.reshape(B * T, C), expert_indices.reshape(B * T, -1), weights.reshape(B * T, -1))
        return y.view(B, T, C).to(x.dtype), router_logits, expert_indices


def check_expert_indices(expert_indices, shape: tuple, num_experts: int) -> None:
    """Routing replay's indices must be a long tensor of `shape` (B, T, k) with values in [0, num_experts)."""
    if not isinstance(expert_indices, torch.Tensor) or expert_indices.dtype != torch.long:
        raise ValueError(
            f"expert_indices must hold long tensors of shape (B, T, k), got {type(expert_indices).__name__}"
            f"{' of dtype ' + str(expert_indices.dtype) if isinstance(expert_indices, torch.Tensor) else ''}"
        )
    if tuple(expert_indices.shape) != tuple(shape):
        raise ValueError(
            f"expert_indices: each tensor must have shape (B, T, num_experts_per_tok) = {tuple(shape)}, "
            f"got {tuple(expert_indices.shape)}"
        )
    if expert_indices.numel() and (int(expert_indices.min()) < 0 or int(expert_indices.max()) >= num_experts):
        raise ValueError(f"expert_indices must lie in [0, num_local_experts) = [0, {num_experts}), "
                         f"got values in [{int(expert_indices.min())}, {int(expert_indices.max())}]")


def _rows(router_logits, attention_mask):
    """Stack per-layer logits into (L, N, E) float32 rows, and the (N,) float mask of real tokens."""
    logits = torch.stack([layer.reshape(-1, layer.shape[-1]).float() for layer in router_logits])  # (L, N, E)
    if attention_mask is None:
        mask = torch.ones(logits.shape[1], dtype=torch.float32, device=logits.device)
    else:
        mask = attention_mask.reshape(-1).to(device=logits.device, dtype=torch.float32)
        if mask.numel() != logits.shape[1]:
            raise ValueError(f"attention_mask has {mask.numel()} positions but the router logits hold "
                             f"{logits.shape[1]} tokens per layer")
    return logits, mask


def load_balancing_loss(router_logits, num_experts: int, top_k: int,
                        attention_mask: torch.Tensor | None = None):
    """Switch Transformer's load-balancing loss, as transformers' `load_balancing_loss_func` computes it.

    router_logits: a tuple with one (B, T, E) or (B*T, E) tensor per MoE layer; attention_mask (B, T)
    (1 = real token) or None. Returns a scalar: E * sum_e f_e * P_e (= top_k when routing is balanced).
    """
    logits, mask = _rows(router_logits, attention_mask)  # (L, N, E), (N,)
    probs = torch.softmax(logits, dim=-1)
    # (L, N, E) in {0, 1}: which experts each token's top-k chose
    chosen = F.one_hot(torch.topk(probs, top_k, dim=-1).indices, num_experts).sum(-2).float()
    rows = mask.sum() * logits.shape[0]  # real tokens x layers
    f = (chosen * mask[:, None]).sum((0, 1)) / rows  # (E,) assignments per token routed to e (sums to k)
    P = (probs * mask[:, None]).sum((0, 1)) / rows  # (E,) mean probability of e (sums to 1)
    return num_experts * (f * P).sum()  # L_aux = E * sum_e f_e P_e


def router_z_loss(router_logits, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """ST-MoE's router z-loss: mean over (layer, real token) of logsumexp_e(z_e)^2 (a scalar).

    router_logits: a tuple with one (B, T, E) or (B*T, E) tensor per MoE layer; attention_mask (B, T) or None.
    Averaged over layers (not summed), like the load-balancing loss, so its scale does not grow with depth.
    """
    logits, mask = _rows(router_logits, attention_mask)
    z = torch.logsumexp(logits, dim=-1) ** 2  # (L, N): (log sum_e exp z_e)^2
    return (z * mask).sum() / (mask.sum() * logits.shape[0])


def moe_aux_loss(config, router_logits, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """What an MoE trainer adds to its loss: router_aux_loss_coef * L_aux + router_z_loss_coef * L_z,
    over the real tokens (attention_mask (B, T), 1 = real; None = all)."""
    loss = config.router_aux_loss_coef * load_balancing_loss(
        router_logits, config.num_local_experts, config.num_experts_per_tok, attention_mask)
    if config.router_z_loss_coef:
        loss = loss + config.router_z_loss_coef * router_z_loss(router_logits, attention_mask)
    return loss
