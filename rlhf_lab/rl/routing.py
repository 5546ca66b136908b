"""Mixture of experts in RL: how routing moves under updates, and routing replay.

GSPO's MoE argument (Zheng et al. 2025, arXiv 2507.18071, section 5): in an MoE policy each token's
log-probability depends on which top-k experts its router picks. After a gradient update the router
picks differently for some tokens (about 10% of the activated experts for Qwen3-30B-A3B-Base), so

    r_t = pi_theta(y_t) / pi_old(y_t)

compares two different sub-networks for those tokens and can swing far from 1. GRPO then needed
*routing replay*: compute pi_theta with the experts pi_old chose (`expert_indices` of the model's
forward), so that the ratio measures only the weight change. GSPO's ratio s_i is a length-normalised
product over the whole sequence, where single-token swings average out, so it needs no replay.

What this module gives the trainer (nothing here names an algorithm):

    is_moe(model)                             does the model route tokens to experts?
    check_routing_replay(config, model)       RLConfig.routing_replay needs an MoE policy
    routed_experts(router_logits, top_k)      the experts the router would pick now, per layer (B, L, k)
    completion_experts(per_position, rollout) a forward's per-layer experts at the completion positions
    expert_set_changed(before, after)         (N, T) bool: the token's expert set differs in some layer
    routing_change(before, after, mask)       fraction of tokens whose expert set differs
    expert_load(expert_indices, E, mask)      fraction of token slots each expert receives, (layers, E)
    RoutingMonitor                            a callback the trainer switches on for an MoE policy: routing
                                              change and expert load at each step (columns of the history)

Positions: the model reads prompt + completion minus its last token, L = P + T - 1 positions; the
state at position P - 1 + t predicts completion token t. Routing metrics count those T positions
(masked by the completion mask): the tokens whose log-probs enter the loss.
"""

from __future__ import annotations

import math

import torch

from ..util.validation import check_bool
from .losses import masked_mean

__all__ = [
    "RoutingMonitor",
    "check_routing_replay",
    "completion_routing",
    "completion_experts",
    "completion_positions",
    "expert_load",
    "expert_set_changed",
    "is_moe",
    "routed_experts",
    "routing_change",
]


def is_moe(model) -> bool:
    """True when the model's layers are mixtures of experts (ModelConfig.num_local_experts > 0)."""
    return bool(getattr(getattr(model, "config", None), "is_moe", False))


def check_routing_replay(config, model) -> None:
    """RLConfig.routing_replay replays pi_old's expert choices: it needs a model that has experts."""
    check_bool("routing_replay", config.routing_replay)
    if config.routing_replay and not is_moe(model):
        raise ValueError(
            "routing_replay=True needs a mixture-of-experts policy (num_local_experts > 0), "
            f"got a dense {type(model).__name__}; allowed: routing_replay=False for a dense model"
        )


def completion_positions(per_position: torch.Tensor, prompt_width: int,
                         completion_width: int) -> torch.Tensor:
    """(N, P + T - 1, ...) per model position -> (N, T, ...) at the positions predicting completion tokens."""
    return per_position[:, prompt_width - 1 : prompt_width - 1 + completion_width]


def completion_experts(per_position: tuple[torch.Tensor, ...], rollout) -> tuple[torch.Tensor, ...]:
    """One (N, P + T - 1, k) tensor per layer (a forward over the rollout) -> (N, T, k) at its
    completion positions."""
    T = rollout.completion_ids.shape[1]
    return tuple(completion_positions(x, rollout.prompt_width, T) for x in per_position)


def routed_experts(router_logits: tuple[torch.Tensor, ...], top_k: int) -> tuple[torch.Tensor, ...]:
    """The experts the router picks now: top-k of each layer's logits (B, L, E) -> (B, L, k) long.

    Softmax is monotonic, so the top-k of the logits are the top-k of the routing probabilities."""
    return tuple(logits.topk(top_k, dim=-1).indices for logits in router_logits)


def _kept_slots(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """(..., k) bool: expert before[..., j] is still among the k experts of `after` (order ignored)."""
    return (before[..., :, None] == after[..., None, :]).any(-1)


def expert_set_changed(before: tuple[torch.Tensor, ...], after: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """(N, T) bool: the token's set of k experts differs in at least one layer (order within k ignored)."""
    changed = [(~_kept_slots(old, new)).any(-1) for old, new in zip(before, after)]
    return torch.stack(changed).any(0)


def routing_change(before: tuple[torch.Tensor, ...], after: tuple[torch.Tensor, ...],
                   mask: torch.Tensor) -> dict:
    """How much routing moved between two forwards of the same tokens.

    before, after: one (N, T, k) long tensor per MoE layer (expert ids; the order within k is ignored);
    mask: (N, T), 1 = a token to count.
    Returns
        token:   fraction of (token, layer) pairs whose SET of k experts differs (the issue's number)
        expert:  fraction of activated (token, layer, slot) experts that are no longer activated
                 (GSPO's phrasing: "about 10% of the experts activated ... change")
        layers:  list, `token` per layer
    """
    m = mask.bool()
    per_layer, dropped, slots = [], 0.0, 0.0
    for old, new in zip(before, after):
        kept = _kept_slots(old, new)  # (N, T, k)
        per_layer.append(masked_mean((~kept).any(-1).float(), m).item())
        dropped += (~kept)[m].sum().item()
        slots += m.sum().item() * old.shape[-1]
    return {"token": sum(per_layer) / max(len(per_layer), 1), "expert": dropped / max(slots, 1.0),
            "layers": per_layer}


def expert_load(expert_indices: tuple[torch.Tensor, ...], num_experts: int,
                mask: torch.Tensor) -> torch.Tensor:
    """(layers, E) fraction of the token slots routed to each expert (each row sums to 1).

    expert_indices: one (N, T, k) long tensor per layer; mask (N, T). Balanced routing is 1/E each:
    this is f_e of the Switch load-balancing loss, aux = E * sum_e f_e P_e."""
    m = mask.bool()
    rows = []
    for indices in expert_indices:
        chosen = indices[m].flatten()  # (tokens * k,)
        counts = torch.bincount(chosen, minlength=num_experts).float()
        rows.append(counts / counts.sum().clamp(min=1.0))
    return torch.stack(rows)


class RoutingMonitor:
    """A callback that measures, at every step of an MoE policy, how routing moved (GSPO's section 5).

    The trainer switches it on for a mixture-of-experts policy only. Its columns in the history:
        routing_change                 after all of the step's updates: fraction of (completion token,
                                       layer) whose expert set differs from pi_old's (a fresh forward)
        expert_change                  the same as a fraction of activated experts
        routing_change_one_update      after exactly one optimiser step (the second minibatch's
                                       forward; NaN with one minibatch)
        routing_change_l{i}            routing_change of layer i
        expert_load_max                max over layers and experts of E * load (1 = balanced)
        expert_load_l{i}_e{j}          fraction of layer i's token slots given to expert j under pi_old
        aux_loss                       the router's auxiliary loss the update added (mean over minibatches)
    """

    def on_update_begin(self, trainer, rollout) -> None:
        self.minibatches, self.aux, self.one_update = 0, [], math.nan

    def on_minibatch_end(self, trainer, minibatch, policy, info) -> None:
        """One minibatch's forward (PolicyOutput): its aux loss, and after exactly one optimiser step
        the routing change of the second minibatch."""
        if policy.aux_loss is not None:
            self.aux.append(policy.aux_loss.item())
        replayed = minibatch.old_expert_indices is not None and policy.router_logits is not None
        if self.minibatches == 1 and replayed:
            now = completion_routing(policy.router_logits, minibatch)
            old = completion_experts(minibatch.old_expert_indices, minibatch)
            self.one_update = routing_change(old, now, minibatch.completion_mask.bool())["token"]
        self.minibatches += 1

    def on_update_end(self, trainer, rollout, stats) -> None:
        """The whole rollout re-read by the updated weights (no replay): routing change and load."""
        from .rollout import policy_forward  # rollout.py imports is_moe from here

        metrics = {}
        if rollout.old_expert_indices is not None:
            with torch.no_grad(), trainer.autocast():
                after = policy_forward(trainer.policy, rollout, trainer.config.temperature)
            num_experts = trainer.policy.config.num_local_experts
            m = rollout.completion_mask
            old = completion_experts(rollout.old_expert_indices, rollout)
            change = routing_change(old, completion_routing(after.router_logits, rollout), m)
            load = expert_load(old, num_experts, m)
            metrics = {"routing_change_one_update": self.one_update, "routing_change": change["token"],
                       "expert_change": change["expert"],
                       **{f"routing_change_l{i}": v for i, v in enumerate(change["layers"])},
                       "expert_load_max": (load.max() * num_experts).item(),
                       **{f"expert_load_l{i}_e{j}": load[i, j].item()
                          for i in range(load.shape[0]) for j in range(num_experts)}}
        if self.aux:
            metrics["aux_loss"] = sum(self.aux) / len(self.aux)
        stats.extra.update(metrics)


def completion_routing(router_logits, rollout) -> tuple[torch.Tensor, ...]:
    """The experts the current router picks at the rollout's completion positions."""
    top_k = rollout.old_expert_indices[0].shape[-1]
    return completion_experts(routed_experts(tuple(r.detach() for r in router_logits), top_k), rollout)
