"""Common implementation mistakes in PPO/GRPO code, as algorithms you can train with (interview Q26).

Teaching exhibits, kept out of the core modules: each mistake is either a setting the package
already offers (no advantage whitening, a gradient-norm clip so large it never binds) or a small
subclass that does ONE thing wrong and is otherwise the package's algorithm. Pass them to the
public trainer and read the symptom on its history and dashboard:

    from rlhf_lab.teach.mistakes import mistake_run
    config, algorithm = mistake_run("forward_gae", steps=30)
    trainer = Trainer(config, algorithm=algorithm)

| name                         | what is wrong                                              |
| ---------------------------- | ---------------------------------------------------------- |
| `reference`                  | nothing: PPO with the package's defaults                          |
| `no_advantage_normalisation` | GAE advantages used raw (`whiten_advantages=False`)               |
| `no_gradient_clipping`       | `max_grad_norm=1e9`, a clip that never binds                      |
| `low_precision_logprobs`     | pi_old's log-probs in bfloat16 (a bf16 sampler), pi's in float32  |
| `forward_gae`                | GAE run forwards in time (the exercises' `forward_order` mistake) |
"""

from __future__ import annotations

import dataclasses

import torch

from ..exercises.rl import GAE_MISTAKES
from ..exercises.training import LearnerPPO
from ..rl.ppo import PPO, PPOConfig
from ..util.validation import check_choice

MISTAKES = ("reference", "no_advantage_normalisation", "no_gradient_clipping", "low_precision_logprobs",
            "forward_gae")
NO_CLIP = 1e9  # a gradient-norm "clip" no gradient of this model reaches: clipping is effectively off


# The wrong GAE is the exercises' catalogued "forward_order" variant: one copy of each mistake.
forward_gae = {mistake.name: mistake.variant for mistake in GAE_MISTAKES}["forward_order"]


class ForwardGAEPPO(LearnerPPO):
    """PPO whose GAE runs forwards in time, A_t = delta_t + gamma * lam * A_{t-1} (should be A_{t+1}).
    The score sits on the LAST token, so only the last token's advantage sees it; every earlier
    token's advantage is built from the TD errors before it. Everything else is the package's PPO."""

    def __init__(self, config: PPOConfig) -> None:
        super().__init__(config, gae=forward_gae)


class LowPrecisionLogprobsPPO(PPO):
    """PPO whose stored log pi_old is rounded to `dtype` (bfloat16: what a bf16 inference engine
    returns) while log pi is float32. On the first minibatch pi == pi_old, so every ratio should be
    exactly 1; the rounding alone moves it."""

    dtype = torch.bfloat16

    def loss(self, minibatch, policy):
        rounded = minibatch.old_logprobs.to(self.dtype).float()  # the precision the sampler kept
        return super().loss(dataclasses.replace(minibatch, old_logprobs=rounded), policy)


def mistake_run(name: str, settings: dict | None = None, **overrides) -> tuple[PPOConfig, PPO]:
    """(config, algorithm) for the PPO run that makes mistake `name` (one of MISTAKES), with the
    shared `settings` and `overrides` applied: pass both to `rl.Trainer(config, algorithm=algorithm)`."""
    check_choice("name", name, MISTAKES)
    changes = {"no_advantage_normalisation": {"whiten_advantages": False},
               "no_gradient_clipping": {"max_grad_norm": NO_CLIP}}.get(name, {})
    config = PPOConfig(**{**(settings or {}), **overrides, **changes})
    algorithms = {"forward_gae": ForwardGAEPPO, "low_precision_logprobs": LowPrecisionLogprobsPPO}
    algorithm = algorithms.get(name, PPO)
    return config, algorithm(config)


__all__ = ["MISTAKES", "NO_CLIP", "ForwardGAEPPO", "LowPrecisionLogprobsPPO", "forward_gae", "mistake_run"]
