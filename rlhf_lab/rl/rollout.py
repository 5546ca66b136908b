"""A rollout: prompts -> G sampled completions each -> rewards, plus what the loss needs later.

Shapes: N = prompts * G rows (the G completions of prompt b are rows b*G .. b*G+G-1),
P = prompt width (left-padded), T = completion width (right-padded after EOS).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from .losses import entropy_from_logits, selective_log_softmax


@dataclass
class Rollout:
    input_ids: torch.Tensor  # (N, P + T) prompt then completion
    attention_mask: torch.Tensor  # (N, P + T) 1 = real token
    prompt_width: int  # P
    completion_ids: torch.Tensor  # (N, T)
    completion_mask: torch.Tensor  # (N, T) float, 1 for generated tokens up to and including EOS
    rewards: torch.Tensor  # (N,) the score given to each completion
    correct: torch.Tensor  # (N,) exact-match 0/1, for the accuracy metric
    finished: torch.Tensor  # (N,) bool, emitted EOS
    num_generations: int  # G
    old_logprobs: torch.Tensor | None = None  # (N, T) log pi_old(token) at rollout time
    ref_logprobs: torch.Tensor | None = None  # (N, T) log pi_ref(token)
    old_values: torch.Tensor | None = None  # (N, T) critic's V(s_t) at rollout time (PPO)
    advantages: torch.Tensor | None = None  # (N, T) filled by the algorithm
    returns: torch.Tensor | None = None  # (N, T) value targets (PPO)
    token_rewards: torch.Tensor | None = None  # (N, T) PPO's per-token reward (-kl_coef * kl + score)
    greedy_rewards: torch.Tensor | None = None  # (prompts,) ReMax's baseline: reward of the greedy answer

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def num_prompts(self) -> int:
        return len(self) // self.num_generations

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(1)

    @property
    def truncated(self) -> torch.Tensor:
        return ~self.finished

    def select(self, rows: torch.Tensor) -> Rollout:
        """The same rollout restricted to `rows` (a minibatch); per-row tensors are indexed."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == len(self):
                value = value[rows]
            out[f.name] = value
        return Rollout(**out)

    @staticmethod
    def concat(parts: list[Rollout]) -> Rollout:
        """Stack rollouts row-wise (dynamic sampling refills a batch from several draws)."""
        first = parts[0]
        width_p = max(p.prompt_width for p in parts)
        width_t = max(p.completion_ids.shape[1] for p in parts)
        padded = [p.pad_to(width_p, width_t) for p in parts]
        out = {}
        for f in fields(Rollout):
            values = [getattr(p, f.name) for p in padded]
            if isinstance(values[0], torch.Tensor):
                out[f.name] = torch.cat(values, dim=0)
            elif values[0] is None:
                out[f.name] = None
            else:
                out[f.name] = values[0]
        out["prompt_width"] = width_p
        out["num_generations"] = first.num_generations
        return Rollout(**out)

    def pad_to(self, prompt_width: int, completion_width: int) -> Rollout:
        """Left-pad prompts / right-pad completions (token id 0 = pad, mask 0)."""
        dp, dt = prompt_width - self.prompt_width, completion_width - self.completion_ids.shape[1]
        if dp == 0 and dt == 0:
            return self
        n = len(self)
        ids = self.input_ids
        zeros = lambda w, like: torch.zeros((n, w), dtype=like.dtype, device=like.device)  # noqa: E731
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["input_ids"] = torch.cat([zeros(dp, ids), ids, zeros(dt, ids)], 1)
        out["attention_mask"] = torch.cat([zeros(dp, self.attention_mask), self.attention_mask,
                                           zeros(dt, self.attention_mask)], 1)
        for name in ("completion_ids", "completion_mask", "old_logprobs", "ref_logprobs", "old_values",
                     "advantages", "returns", "token_rewards"):
            value = out[name]
            if value is not None:
                out[name] = torch.cat([value, zeros(dt, value)], 1)
        out["prompt_width"] = prompt_width
        return Rollout(**out)


@dataclass
class PolicyOutput:
    logprobs: torch.Tensor  # (N, T) float32 log pi(token) at temperature
    entropy: torch.Tensor | None  # (N, T) float32 entropy of pi(. | prefix), detached
    values: torch.Tensor | None  # (N, T) V(s_t): the value of the state before token t


def policy_forward(model, rollout: Rollout, temperature: float, with_entropy: bool = False,
                   with_values: bool = False) -> PolicyOutput:
    """Log-probs (and optionally entropy, values) of the rollout's completion tokens under `model`.

    The logit at position P-1+t predicts completion token t, so we keep positions P-1 .. P+T-2,
    divide by the sampling temperature (the distribution the tokens were drawn from), and take a
    float32 log-softmax at the chosen ids.
    """
    P, T = rollout.prompt_width, rollout.completion_ids.shape[1]
    out = model(rollout.input_ids[:, :-1], attention_mask=rollout.attention_mask[:, :-1])
    logits = out.logits[:, P - 1 : P - 1 + T].float() / temperature  # (N, T, V)
    logprobs = selective_log_softmax(logits, rollout.completion_ids)
    entropy = entropy_from_logits(logits.detach()) if with_entropy else None
    values = out.values[:, P - 1 : P - 1 + T] if (with_values and out.values is not None) else None
    return PolicyOutput(logprobs=logprobs, entropy=entropy, values=values)
