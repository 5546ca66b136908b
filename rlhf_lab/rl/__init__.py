"""RL fine-tuning on one loop: PPO, GRPO (and variants), GSPO, RLOO, REINFORCE, ReMax.

    from rlhf_lab.rl import Trainer, make_config
    trainer = Trainer(make_config("grpo", steps=50))
    history = trainer.train()
"""

from .algorithm import Algorithm, LossInfo
from .baselines import RLOO, Reinforce, ReinforceConfig, ReMax, ReMaxConfig, RLOOConfig
from .config import RLConfig
from .grpo import GRPO, GRPOConfig
from .gspo import GSPO, GSPOConfig
from .ppo import PPO, PPOConfig
from .rollout import Rollout, policy_forward
from .trainer import Callback, NonFiniteLossError, StepDistributions, Trainer

ALGORITHMS: dict[str, type[Algorithm]] = {
    "ppo": PPO,
    "grpo": GRPO,
    "gspo": GSPO,
    "rloo": RLOO,
    "reinforce": Reinforce,
    "remax": ReMax,
}


def make_config(algo: str, **overrides) -> RLConfig:
    """The config class of `algo` with its defaults, updated with `overrides` (validated)."""
    if algo not in ALGORITHMS:
        raise ValueError(f"algo must be one of {tuple(ALGORITHMS)}, got {algo!r}")
    return ALGORITHMS[algo].config_class(**overrides)


__all__ = [
    "ALGORITHMS", "GRPO", "GSPO", "PPO", "RLOO", "Algorithm", "Callback", "GRPOConfig", "GSPOConfig",
    "LossInfo", "NonFiniteLossError", "PPOConfig", "RLConfig", "RLOOConfig", "ReMax", "ReMaxConfig",
    "Reinforce", "ReinforceConfig", "Rollout", "StepDistributions", "Trainer", "make_config", "policy_forward",
]
