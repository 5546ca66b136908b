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
    implicit_rewards,
    ipo_loss,
    preference_logits,
    sequence_logprobs,
)

__all__ = [
    "LOSS_TYPES", "DPOConfig", "DPOTrainer", "dpo_loss", "encode_pairs", "implicit_rewards",
    "ipo_loss", "preference_logits", "sequence_logprobs",
]
