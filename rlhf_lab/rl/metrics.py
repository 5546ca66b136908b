"""Per-step metrics: what to watch while an RL run trains, and the memory each model costs.

The names are the columns of `Trainer.history` (a pandas DataFrame) and of history.csv. `step_row`
builds one step's row; `UpdateStats` gathers what the update's minibatches report.
"""

from __future__ import annotations

import math
import resource
import sys
from dataclasses import dataclass, field

import torch

from ..tasks.rewards import WeightedReward
from .kl import kl_k1, kl_k3
from .losses import masked_mean

METRIC_COLUMNS = (
    "step", "wall_time", "step_time", "rollout_time", "update_time",
    "reward_mean", "reward_std", "reward_min", "reward_max", "frac_zero_std_groups", "accuracy",
    "eval_accuracy", "kl_k1", "kl_k3", "entropy", "clip_frac_low", "clip_frac_high", "clip_frac",
    "ratio_mean", "ratio_min", "ratio_max", "seq_ratio_mean", "seq_ratio_min", "seq_ratio_max",
    "adv_mean", "adv_std", "completion_len_mean", "completion_len_max", "truncation_rate",
    "policy_loss", "value_loss", "value_clip_frac", "explained_variance", "kl_penalty", "kl_coef",
    "grad_norm", "lr", "tokens_per_s", "num_rollout_rows",
    "mem_params_bytes", "mem_optimizer_bytes", "mem_peak_bytes",
)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers (tied weights counted once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of an optimiser's state (AdamW: two moments per parameter, plus step counters)."""
    return sum(tensor_bytes(v for v in state.values() if isinstance(v, torch.Tensor))
               for state in optimizer.state.values())


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process: CUDA allocator peak on a GPU, peak resident set size on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # macOS reports bytes, Linux KiB


def reward_stats(rewards: torch.Tensor, num_generations: int) -> dict:
    stats = {
        "reward_mean": rewards.mean().item(),
        "reward_std": rewards.std().item() if rewards.numel() > 1 else 0.0,
        "reward_min": rewards.min().item(),
        "reward_max": rewards.max().item(),
    }
    if num_generations >= 2:
        groups = rewards.view(-1, num_generations)
        stats["frac_zero_std_groups"] = (groups.std(dim=1) == 0).float().mean().item()
    else:
        stats["frac_zero_std_groups"] = float("nan")
    return stats


@dataclass
class StepDistributions:
    """What the live plots show for one step (CPU tensors)."""

    step: int
    advantages: torch.Tensor  # (N,) one value per completion (its first token's advantage)
    rewards: torch.Tensor  # (N,)
    num_generations: int
    # every token's ratio, all passes
    token_ratios: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    # (n,) per completion, all passes
    sequence_ratios: torch.Tensor = field(default_factory=lambda: torch.empty(0))


class UpdateStats:
    """Accumulates minibatch statistics over the passes of one step (token-weighted where it matters).

    Besides the loss terms: where the sampling policy stands (entropy, KL to the reference, measured
    on the first pass), and how far the updated policy moved from it (the spread of the ratios,
    sequences with a clipped token, and k3 of KL(pi_old || pi_theta) at each minibatch's forward).
    """

    def __init__(self) -> None:
        self.tokens = 0.0
        self.clipped_low = 0.0
        self.clipped_high = 0.0
        self.ratio_sum = 0.0
        self.ratio_min = float("inf")
        self.ratio_max = float("-inf")
        self.deviation_sum = 0.0  # of |ratio - 1| statistics, in float64
        self.deviation_sq = 0.0
        self.deviation_max = 0.0
        self.sequence_deviation_max = 0.0
        self.sequences = 0
        self.clipped_sequences = 0
        self.kl_old: list[float] = []
        self.policy_losses: list[float] = []
        self.value_losses: list[float] = []
        self.value_clip: list[float] = []
        self.kl_penalties: list[float] = []
        self.grad_norms: list[float] = []
        self.token_ratios: list[torch.Tensor] = []
        self.sequence_ratios: list[torch.Tensor] = []
        self.entropies: list[float] = []
        self.kls: list[dict] = []
        self.explained: list[float] = []
        self.extra: dict = {}  # more columns (an MoE policy's routing: rlhf_lab.rl.routing.RoutingMonitor)

    def add(self, info, minibatch, policy, grad_norm: float, first_pass: bool, keep: bool) -> None:
        """One minibatch: its loss report (LossInfo), the Rollout slice, the forward's PolicyOutput and
        the gradient norm. `first_pass`: the policy still samples these completions' distribution."""
        m = minibatch.completion_mask.bool()
        # ratio_* and the token histogram show pi/pi_old per token; for GSPO the loss applies s_i instead
        ratios = info.token_ratio[m]
        self.tokens += m.sum().item()
        self.clipped_low += info.clipped_low[m].sum().item()
        self.clipped_high += info.clipped_high[m].sum().item()
        if ratios.numel():
            self.ratio_sum += ratios.sum().item()
            self.ratio_min = min(self.ratio_min, ratios.min().item())
            self.ratio_max = max(self.ratio_max, ratios.max().item())
        deviation = (ratios - 1).double()
        self.deviation_sum += deviation.sum().item()
        self.deviation_sq += (deviation**2).sum().item()
        if deviation.numel():
            self.deviation_max = max(self.deviation_max, deviation.abs().max().item())
        self.sequence_deviation_max = max(self.sequence_deviation_max,
                                          (info.sequence_ratio - 1).abs().max().item())
        clipped = ((info.clipped_low | info.clipped_high) & m).any(-1)
        self.sequences += len(clipped)
        self.clipped_sequences += int(clipped.sum())
        self.kl_old.append(masked_mean(kl_k3(info.old_logprobs, policy.logprobs.detach()), m).item())
        self.policy_losses.append(info.policy_loss)
        self.value_losses.append(info.value_loss)
        self.value_clip.append(info.value_clip_fraction)
        self.kl_penalties.append(info.kl_penalty)
        self.grad_norms.append(grad_norm)
        if keep:
            self.token_ratios.append(ratios.float().cpu())
            self.sequence_ratios.append(info.sequence_ratio.float().cpu())
        if first_pass:
            mask = minibatch.completion_mask
            self.entropies.append((policy.entropy * mask).sum().item() / max(mask.sum().item(), 1))
            if minibatch.ref_logprobs is not None:  # None: the step skipped the reference's forward
                self.kls.append(kl_metrics(info.old_logprobs, minibatch.ref_logprobs, mask))
            if not math.isnan(info.explained_variance):
                self.explained.append(info.explained_variance)

    def metrics(self) -> dict:
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        tokens = max(self.tokens, 1.0)
        seq = torch.cat(self.sequence_ratios) if self.sequence_ratios else torch.empty(0)
        deviation_mean = self.deviation_sum / tokens
        return {
            "clip_frac_low": self.clipped_low / tokens,
            "clip_frac_high": self.clipped_high / tokens,
            "clip_frac": (self.clipped_low + self.clipped_high) / tokens,
            "ratio_mean": self.ratio_sum / tokens,
            "ratio_min": self.ratio_min,
            "ratio_max": self.ratio_max,
            "seq_ratio_mean": seq.mean().item() if seq.numel() else float("nan"),
            "seq_ratio_min": seq.min().item() if seq.numel() else float("nan"),
            "seq_ratio_max": seq.max().item() if seq.numel() else float("nan"),
            "policy_loss": mean(self.policy_losses),
            "value_loss": mean(self.value_losses),
            "value_clip_frac": mean(self.value_clip),
            "kl_penalty": mean(self.kl_penalties),
            "grad_norm": mean(self.grad_norms),
            "entropy": mean(self.entropies),
            "kl_k1": mean([k["kl_k1"] for k in self.kls]),
            "kl_k3": mean([k["kl_k3"] for k in self.kls]),
            "explained_variance": mean(self.explained),
            "ratio_dev_std": math.sqrt(max(self.deviation_sq / tokens - deviation_mean**2, 0.0)),
            "ratio_dev_max": self.deviation_max,
            "seq_ratio_dev_max": self.sequence_deviation_max,
            "seq_clip_frac": self.clipped_sequences / max(self.sequences, 1),
            "kl_old": mean(self.kl_old),
            **self.extra,
        }


def kl_metrics(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> dict:
    """Token-mean KL of the sampling policy to the reference, by two estimators (rl/kl.py)."""
    return {"kl_k1": masked_mean(kl_k1(logprobs, ref_logprobs), mask).item(),
            "kl_k3": masked_mean(kl_k3(logprobs, ref_logprobs), mask).item()}


def sampled_kl_metrics(rollout, samples: int | None, reference_logprobs) -> dict:
    """kl_k1 and kl_k3 on `samples` completions evenly spaced over the batch, when the step skips the
    reference's forward over the whole batch (its loss does not read log pi_ref).

    `reference_logprobs(rollout)` gives log pi_ref for those rows. log pi_old is what the sampler
    recorded as it drew each token (`rollout.sampling_logprobs`), so the policy needs no forward.
    Fewer rows make a noisier estimate of the same token mean."""
    k = min(samples or 0, len(rollout))
    if k == 0:
        return {"kl_k1": float("nan"), "kl_k3": float("nan")}
    # one per prompt at the defaults
    rows = torch.arange(k, device=rollout.rewards.device) * (len(rollout) // k)
    sample = rollout.select(rows)
    return kl_metrics(sample.sampling_logprobs, reference_logprobs(sample), sample.completion_mask)


def step_distributions(step: int, rollout, stats: UpdateStats) -> StepDistributions:
    """The step's advantages (one per completion), rewards and importance ratios, for the live plots."""
    advantages = rollout.advantages[:, 0] if rollout.advantages.shape[1] else torch.zeros(len(rollout))
    return StepDistributions(
        step=step, advantages=advantages.float().cpu(), rewards=rollout.rewards.float().cpu(),
        num_generations=rollout.num_generations,
        token_ratios=torch.cat(stats.token_ratios) if stats.token_ratios else torch.empty(0),
        sequence_ratios=torch.cat(stats.sequence_ratios) if stats.sequence_ratios else torch.empty(0),
    )


def step_row(step: int, rollout, stats: UpdateStats, times: dict, extra: dict) -> dict:
    """One row of the history: the rollout's rewards and lengths, what the update did, and `times`
    (wall_time, step_time, rollout_time, update_time) and `extra` columns (reward parts, sampled KL)."""
    m = rollout.completion_mask.bool()
    lengths = rollout.lengths
    return {
        "step": step, **times,
        **reward_stats(rollout.rewards, rollout.num_generations),
        **extra.pop("reward_parts", {}),
        "accuracy": rollout.correct.float().mean().item(),
        "eval_accuracy": float("nan"),
        **stats.metrics(),
        **extra,
        "adv_mean": rollout.advantages[m].mean().item() if m.any() else float("nan"),
        "adv_std": rollout.advantages[m].std().item() if m.sum() > 1 else float("nan"),
        "completion_len_mean": lengths.float().mean().item(),
        "completion_len_max": lengths.max().item(),
        "truncation_rate": rollout.truncated.float().mean().item(),
        "tokens_per_s": lengths.sum().item() / max(times["step_time"], 1e-9),
        "num_rollout_rows": len(rollout),
    }


def memory_row(memory: dict, device: torch.device, held_before_update: int) -> dict:
    """The memory columns from `Trainer.memory_bytes()`. mem_update_peak_bytes: what the update added
    on top of what was held (activations, gradients, optimiser scratch), by CUDA's allocator (NaN on a
    CPU, which has no such counter)."""
    peak = peak_memory_bytes(device)
    return {"mem_params_bytes": sum(v for k, v in memory.items() if k.startswith("params_")),
            "mem_optimizer_bytes": memory["optimizer"], "mem_peak_bytes": peak,
            "mem_update_peak_bytes": peak - held_before_update if device.type == "cuda" else float("nan")}


def reward_parts(task, reward_fn, tokenizer, rollout) -> dict:
    """Mean of each named reward over the rollout, {"reward_answer": ..., "reward_format": ...}, for
    tasks that bring their own rewards (the think/answer tasks; TRL logs rewards/<name>/mean the same
    way): the format-reward rate tells a model that learned the shape from one that learned the
    answer. Empty for other tasks or a custom reward function."""
    if task.rewards is None or not isinstance(reward_fn, WeightedReward) or rollout.examples is None:
        return {}
    decoded = [tokenizer.decode_until_eos(row) for row in rollout.completion_ids.tolist()]
    texts, finished = [text for text, _ in decoded], [done for _, done in decoded]
    parts = reward_fn.breakdown_batch([e.prompt for e in rollout.examples], texts,
                                      [e.answer for e in rollout.examples], finished)
    return {f"reward_{name}": sum(values) / len(values) for name, values in parts.items()}
