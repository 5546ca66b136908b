"""Per-step metrics: what to watch while an RL run trains, and the memory each model costs.

The names are the columns of `Trainer.history` (a pandas DataFrame) and of history.csv.
"""

from __future__ import annotations

import resource
import sys

import torch

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


class UpdateStats:
    """Accumulates minibatch statistics over the passes of one step (token-weighted where it matters)."""

    def __init__(self) -> None:
        self.tokens = 0.0
        self.clipped_low = 0.0
        self.clipped_high = 0.0
        self.ratio_sum = 0.0
        self.ratio_min = float("inf")
        self.ratio_max = float("-inf")
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

    def add(self, info, mask: torch.Tensor, grad_norm: float, keep: bool) -> None:
        """One minibatch's loss report (LossInfo), its completion mask and its gradient norm."""
        m = mask.bool()
        # ratio_* and the token histogram show pi/pi_old per token; for GSPO the loss applies s_i instead
        ratios = info.token_ratio[m]
        self.tokens += m.sum().item()
        self.clipped_low += info.clipped_low[m].sum().item()
        self.clipped_high += info.clipped_high[m].sum().item()
        if ratios.numel():
            self.ratio_sum += ratios.sum().item()
            self.ratio_min = min(self.ratio_min, ratios.min().item())
            self.ratio_max = max(self.ratio_max, ratios.max().item())
        self.policy_losses.append(info.policy_loss)
        self.value_losses.append(info.value_loss)
        self.value_clip.append(info.value_clip_fraction)
        self.kl_penalties.append(info.kl_penalty)
        self.grad_norms.append(grad_norm)
        if keep:
            self.token_ratios.append(ratios.float().cpu())
            self.sequence_ratios.append(info.sequence_ratio.float().cpu())

    def add_first_pass(self, entropy: torch.Tensor, old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor | None,
                       mask: torch.Tensor, explained_variance: float | None = None) -> None:
        """Where the sampling policy stands (entropy, KL to the reference), measured once per minibatch.
        ref_logprobs None (the step skipped the reference's forward): no KL here."""
        self.entropies.append((entropy * mask).sum().item() / max(mask.sum().item(), 1))
        if ref_logprobs is not None:
            self.kls.append(kl_metrics(old_logprobs, ref_logprobs, mask))
        if explained_variance is not None:
            self.explained.append(explained_variance)

    def metrics(self) -> dict:
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        tokens = max(self.tokens, 1.0)
        seq = torch.cat(self.sequence_ratios) if self.sequence_ratios else torch.empty(0)
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
        }


def kl_metrics(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> dict:
    """Token-mean KL of the sampling policy to the reference, by two estimators."""
    log_ratio = (logprobs - ref_logprobs).float()  # log pi - log pi_ref
    k1 = log_ratio
    k3 = torch.expm1(-log_ratio) + log_ratio  # pi_ref/pi - log(pi_ref/pi) - 1
    return {"kl_k1": masked_mean(k1, mask).item(), "kl_k3": masked_mean(k3, mask).item()}
