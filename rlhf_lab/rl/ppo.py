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
The critic is PPO's own: a value head on the policy's trunk (critic="head") or a separate model
with its own head (critic="separate", as TRL does; a copy of the policy, or `critic_init`). A critic
must be able to judge a partial answer. With critic_readout="prefix_likelihood" a frozen model that
knows the task judges the tokens written so far and only a small head learns (a critic started from
a model that can judge, as InstructGPT starts its value model from the reward model):

    V(s_t) = exp( sum_{k<t} log p_phi(y_k | x, y_<k) ) * sigmoid(w . h_phi(s_t) + b)
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
    critic_init: str | None = setting(None, help="separate critic's checkpoint; None: a copy of the policy")
    critic_readout: str = setting("value", choices=("value", "prefix_likelihood"),
                                  help="V = head(h_t), or the frozen critic's prefix likelihood x head")
    critic_learning_rate: float | None = setting(None, gt=0, le=1, help="None: learning_rate")

    def check(self) -> None:
        super().check()
        for name, value, default in (("critic_init", self.critic_init, None),
                                     ("critic_readout", self.critic_readout, "value")):
            if value != default and self.critic != "separate":
                raise ValueError(f"{name}={value!r} needs critic='separate', got critic={self.critic!r}")


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
        self.explained_variance_mc = float("nan")
        self.critic = None

    def setup(self, policy):
        """The critic V(s_t): a zero-initialised linear head (OpenAI's choice), on the policy's own trunk,
        or on a separate model (a copy of the starting policy, or `critic_init`), which doubles the
        parameters but keeps the value loss from disturbing the policy's features. The prefix-likelihood
        readout freezes that model: only the head learns."""
        c = self.config
        self.critic = policy
        if c.critic == "separate":
            init = c.critic_init
            self.critic = copy.deepcopy(policy) if init is None else self.load_critic(init, policy)
            self.critic.requires_grad_(c.critic_readout == "value")
        self.critic.add_value_head()

    @staticmethod
    def load_critic(name, policy):
        """`critic_init`'s model, without any head it carries, on the policy's device; its tokenizer must
        be the policy's (the critic reads the policy's token ids)."""
        from ..checkpoints import load_checkpoint

        critic, tokenizer, _ = load_checkpoint(name, device=policy.device)
        if critic.config.vocab_size != policy.config.vocab_size:
            raise ValueError(f"critic_init {name!r} has a vocabulary of {critic.config.vocab_size} tokens, "
                             f"the policy {policy.config.vocab_size}: it must read the policy's tokens")
        critic.value_head = None
        critic.config.value_head = False
        return critic

    def models(self):
        return {"critic": self.critic} if self.config.critic == "separate" else {}

    def parameter_groups(self, policy_parameters):
        """The critic learns at critic_learning_rate when it is set: its own AdamW group."""
        rate = self.config.critic_learning_rate
        if rate is None:
            return super().parameter_groups(policy_parameters)
        critic = ([p for p in self.critic.parameters() if p.requires_grad] if self.config.critic == "separate"
                  else list(self.critic.value_head.parameters()))
        own = {id(p) for p in critic}
        policy = [p for p in policy_parameters if id(p) not in own]
        return [{"params": policy, "base_lr": self.config.learning_rate}, {"params": critic, "base_lr": rate}]

    def critic_values(self, rollout, outputs) -> torch.Tensor:
        """V(s_t), (N, T): from the policy's forward `outputs` when the head sits on its trunk, else the
        separate critic's own forward (with gradient when called with gradients on), read at its own
        temperature 1: with critic_readout="prefix_likelihood", the probability it gives the tokens
        before t times sigmoid(head)."""
        if self.config.critic == "head":
            return outputs.values
        with autocast(self.critic.device, self.config.bf16):
            out = policy_forward(self.critic, rollout, 1.0, with_values=True, share_prompts=True)
        if self.config.critic_readout == "value":
            return out.values
        logprobs = out.logprobs.detach() * rollout.completion_mask  # log p_phi(y_k | x, y_<k)
        before = torch.cumsum(logprobs, dim=1) - logprobs  # sum_{k<t} log p_phi(y_k)
        return torch.exp(before) * torch.sigmoid(out.values)

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
        # The critic against the actual (Monte-Carlo) return: `explained_variance` measures it against
        # GAE's lambda-return, which holds the critic's own values when lam < 1.
        monte_carlo = gae(token_rewards, rollout.old_values, mask, c.gamma, 1.0)[1]
        self.explained_variance_mc = float(explained_variance(rollout.old_values, monte_carlo, mask))

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
        metrics["explained_variance_mc"] = self.explained_variance_mc
        samples = self.config.prompts_per_step * self.config.num_generations
        self.kl_controller.update(self.last_sequence_kl, samples)

    def state_dict(self) -> dict:
        return {"kl_coef": self.kl_controller.value, "last_sequence_kl": self.last_sequence_kl}

    def load_state_dict(self, state: dict) -> None:
        self.kl_controller.value = state["kl_coef"]
        self.last_sequence_kl = state["last_sequence_kl"]
