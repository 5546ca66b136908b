"""GSPO — Group Sequence Policy Optimization (Qwen team, arXiv 2507.18071).

Everything is GRPO's (group advantages, clip, KL, aggregation) except the importance ratio, one per
completion instead of one per token:

    s_i = (pi(y_i) / pi_old(y_i)) ** (1 / |y_i|) = exp( mean_t log(pi(y_it) / pi_old(y_it)) )

length-normalised so that long and short answers live on the same scale, and clipped as a whole:
either every token of a completion is clipped or none is. That is why GSPO's clip range is tiny
(3e-4 / 4e-4 in the paper vs 0.2 / 0.27 for GRPO) and why its clipped FRACTION of tokens is far
larger than GRPO's.

GSPO-token (importance_sampling_level="sequence_token"): s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)];
same value and gradient as GSPO when every token shares A_i, but it allows per-token advantages.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..util.validation import setting
from .grpo import GRPO, GRPOConfig
from .losses import gspo_ratio


@dataclass
class GSPOConfig(GRPOConfig):
    algo: str = "gspo"
    epsilon: float = 3e-4  # the paper's clip range, about 667x smaller than GRPO's 0.2
    epsilon_high: float | None = 4e-4
    num_minibatches: int = 4  # the paper splits each rollout into 4 minibatches: later ones are off-policy
    importance_sampling_level: str = setting("sequence", choices=("sequence", "sequence_token"),
                                             help="sequence_token: GSPO-token")


class GSPO(GRPO):
    name = "gspo"
    config_class = GSPOConfig

    def importance_ratio(self, logprobs, old_logprobs, mask):
        """Sequence-level: s_i broadcast to every token of completion i."""
        token_level = self.config.importance_sampling_level == "sequence_token"
        return gspo_ratio(logprobs, old_logprobs, mask, token_level=token_level)
