"""PPO for RLHF (Schulman et al. 2017; Ziegler et al. 2019; Ouyang et al. 2022), as in OpenAI's
lm-human-preferences and TRL's PPO trainer.

With r_t the per-token reward, V the critic, rho the importance ratio and R the returns:

    r_t     = -kl_coef * (log pi_old(a_t) - log pi_ref(a_t))   (+ the score on the last completion token)
    delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)
    A_t     = delta_t + gamma * lambda * A_{t+1}          (GAE), then whitened over the batch
    rho_t   = pi(a_t) / pi_old(a_t)
    loss    = mean_t max(-A_t rho_t, -A_t clip(rho_t, 1 - eps, 1 + eps))            policy
            + vf_coef * 0.5 * mean_t max((V - R)^2, (clip(V, V_old +- c) - R)^2)    critic

Unlike GRPO: a learned critic supplies a per-token baseline, and the KL to the reference enters
the REWARD (per token, k1) rather than the loss. The KL coefficient may adapt to a target.
The critic is PPO's own: a value head on the policy's trunk (critic="head") or a separate copy of
the model with its own head (critic="separate", as TRL does).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ..util.device import autocast
from ..util.validation import setting
from .advantages import gae, ppo_token_rewards, whiten
from .algorithm import Algorithm, LossInfo
from .config import RLConfig
from .kl import KL_ESTIMATORS, AdaptiveKLController, FixedKLController
from .losses import clipped_surrogate, clipped_value_loss, explained_variance, masked_mean, token_log_ratio
from .rollout import policy_forward


@dataclass
class PPOConfig(RLConfig):
    algo: str = "ppo"
    num_iterations: int = 2  # PPO epochs over each rollout (OpenAI used 4; 2 is faster on a CPU here)
    num_minibatches: int = 2
    gamma: float = setting(1.0, ge=0, le=1, help="discount")
    lam: float = setting(0.95, ge=0, le=1, help="GAE's lambda")
    kl_coef: float = setting(0.05, ge=0, help="KL weight in the reward (TRL's default)")
    kl_estimator: str = setting("k1", choices=KL_ESTIMATORS, help="the per-token KL in the reward")
    adaptive_kl: bool = setting(False, help="adapt kl_coef towards target_kl")
    target_kl: float = setting(6.0, gt=0, help="adaptive controller: target KL per sequence (nats)")
    kl_horizon: int = setting(10000, ge=1, help="adaptive controller's horizon")
    whiten_advantages: bool = setting(True, help="normalise the advantages over the batch")
    whiten_rewards: bool = setting(False, help="normalise the per-token rewards over the batch")
    vf_coef: float = setting(0.1, ge=0, help="weight of the value loss")
    cliprange_value: float = setting(0.2, gt=0, help="clip range of the value update")
    missing_eos_penalty: float | None = setting(None, ge=0, help="subtracted from unfinished answers' scores")
    critic: str = setting("head", choices=("head", "separate"), help="value head on the trunk, or own model")


class PPO(Algorithm):
    name = "ppo"
    config_class = PPOConfig
    needs_old_logprobs = True  # the KL in the reward compares pi_old with pi_ref, even on-policy

    def __init__(self, config: PPOConfig) -> None:
        super().__init__(config)
        self.kl_controller = (
            AdaptiveKLController(config.kl_coef, config.target_kl, config.kl_horizon)
            if config.adaptive_kl else FixedKLController(config.kl_coef)
        )
        self.last_sequence_kl = 0.0
        self.critic = None

    def setup(self, policy):
        """The critic V(s_t): a zero-initialised linear head (OpenAI's choice), on the policy's own trunk,
        or on a separate copy of the starting model, which doubles the parameters but keeps the value
        loss from disturbing the policy's features."""
        self.critic = copy.deepcopy(policy) if self.config.critic == "separate" else policy
        self.critic.add_value_head()

    def models(self):
        return {"critic": self.critic} if self.config.critic == "separate" else {}

    def critic_values(self, rollout, outputs) -> torch.Tensor:
        """V(s_t), (N, T): from the policy's forward `outputs` when the head sits on its trunk, else the
        separate critic's own forward (with gradient when called with gradients on)."""
        if self.config.critic == "head":
            return outputs.values
        with autocast(self.critic.device, self.config.bf16):
            return policy_forward(self.critic, rollout, self.config.temperature, with_values=True,
                                  share_prompts=True).values

    def before_update(self, rollout, old):
        rollout.old_logprobs = old.logprobs
        rollout.old_values = self.critic_values(rollout, old)

    def compute_advantages(self, rollout):
        c, mask = self.config, rollout.completion_mask
        score = rollout.rewards.clone()
        if c.missing_eos_penalty is not None:
            score = score - c.missing_eos_penalty * (~rollout.finished).float()
        token_rewards, kl = ppo_token_rewards(
            score, rollout.old_logprobs, rollout.ref_logprobs, mask, self.kl_controller.value, c.kl_estimator
        )
        if c.whiten_rewards:
            token_rewards = whiten(token_rewards, mask, shift_mean=False)
        advantages, returns = self.estimate_advantages(token_rewards, rollout.old_values, mask)
        if c.whiten_advantages:
            advantages = self.normalize_advantages(advantages, mask)
        rollout.token_rewards, rollout.advantages, rollout.returns = token_rewards, advantages, returns
        self.last_sequence_kl = float(kl.sum(1).mean())  # KL per sequence drives the adaptive controller

    def estimate_advantages(self, token_rewards, values, mask):
        """GAE over the per-token rewards: (advantages, returns), each (N, T). A subclass may swap the
        estimator (rlhf_lab.exercises plugs a learner's own GAE in here)."""
        return gae(token_rewards, values, mask, self.config.gamma, self.config.lam)

    def normalize_advantages(self, advantages, mask):
        """Advantages to mean 0, std 1 over the batch's real tokens (when config.whiten_advantages)."""
        return whiten(advantages, mask)

    def loss(self, minibatch, policy):
        c, mask = self.config, minibatch.completion_mask
        ratio = torch.exp(token_log_ratio(policy.logprobs, minibatch.old_logprobs))  # rho_t
        advantages = minibatch.advantages
        per_token, clipped_low, clipped_high = clipped_surrogate(ratio, advantages, c.eps_low, c.eps_high)
        policy_loss = masked_mean(per_token, mask)
        values = self.critic_values(minibatch, policy)
        value_loss, value_clip_fraction = clipped_value_loss(
            values, minibatch.old_values, minibatch.returns, mask, c.cliprange_value
        )
        loss = policy_loss + c.vf_coef * value_loss
        explained = float(explained_variance(values.detach(), minibatch.returns, mask))
        report = LossInfo.of(policy_loss, ratio, clipped_low, clipped_high, minibatch.old_logprobs, minibatch,
                             policy, value_loss=value_loss.item(), explained_variance=explained,
                             value_clip_fraction=float(value_clip_fraction))
        return loss, report

    @property
    def kl_coefficient(self) -> float:
        return self.kl_controller.value

    def after_step(self, metrics):
        samples = self.config.prompts_per_step * self.config.num_generations
        self.kl_controller.update(self.last_sequence_kl, samples)

    def state_dict(self) -> dict:
        return {"kl_coef": self.kl_controller.value, "last_sequence_kl": self.last_sequence_kl}

    def load_state_dict(self, state: dict) -> None:
        self.kl_controller.value = state["kl_coef"]
        self.last_sequence_kl = state["last_sequence_kl"]
