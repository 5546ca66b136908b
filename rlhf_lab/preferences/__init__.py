"""Human feedback: preference pairs, reward models, over-optimisation, and DPO.

    from rlhf_lab.preferences import DPOConfig, DPOTrainer, dpo_loss
    trainer = DPOTrainer(DPOConfig(beta=0.1), pairs=pairs)   # pairs: (prompt, chosen, rejected)
    trainer.train(steps=100)
"""

from .dpo import (
    LOSS_TYPES,
    DPOConfig,
    DPOTrainer,
    dpo_loss,
    encode_pairs,
    greedy_scores,
    implicit_rewards,
    ipo_loss,
    preference_logits,
    sampled_kl,
    sequence_logprobs,
)

__all__ = [
    "LOSS_TYPES", "DPOConfig", "DPOTrainer", "dpo_loss", "encode_pairs", "greedy_scores", "implicit_rewards",
    "ipo_loss", "preference_logits", "sampled_kl", "sequence_logprobs",
]
