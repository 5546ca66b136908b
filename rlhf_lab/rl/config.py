"""`RLConfig`: what every algorithm shares. Each algorithm module adds its own fields.

Field names follow TRL's GRPOConfig / PPOConfig where they exist (num_generations, num_iterations,
beta, epsilon, epsilon_high, temperature, max_completion_length, learning_rate, max_grad_norm...).
Every field is validated at construction and again when assigned later (rlhf_lab.util.validation);
errors name the field and the allowed values. Settings that only some methods use live in their
config classes: beta in the policy-gradient family (policy_gradient.py), kl_coef and the critic in
PPO's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..tasks.jsonl import SPLIT_N_TRAIN
from ..util.validation import Validated, check_bool, check_choice, check_number, check_optional
from .off_policy import CORRECTIONS, LEVELS


@dataclass
class RLConfig(Validated):
    """Shared settings: the rollout, the optimiser, the schedule and the bookkeeping."""

    algo: str = "base"
    # --- where we start and what we train on
    init_checkpoint: str = "addition_rl_start"  # a shipped checkpoint name or a folder
    task: str = "addition"
    task_params: dict = field(default_factory=lambda: {"digits": 3})
    reward_weights: dict | None = None  # e.g. {"correct": 1.0, "partial": 0.5}; None: the task's default
    n_train: int = SPLIT_N_TRAIN  # same split as SFT, so the held-out test set is the checkpoint's
    n_test: int = 500
    # --- rollout
    prompts_per_step: int = 32  # distinct prompts per rollout
    num_generations: int = 8  # G completions per prompt
    temperature: float = 1.0
    max_completion_length: int | None = None  # None: the task's longest answer + EOS + 2
    # --- optimisation
    learning_rate: float = 2e-4
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    num_iterations: int = 1  # passes over each rollout (PPO's "epochs"; TRL's num_iterations)
    num_minibatches: int = 1  # minibatches per pass; > 1 makes later minibatches off-policy
    epsilon: float = 0.2  # clip range (lower)
    epsilon_high: float | None = None  # clip range (upper); None -> epsilon
    routing_replay: bool = False  # MoE policy: compute pi_theta with pi_old's experts (GSPO paper, section 5)
    # --- rollouts the learner did not sample itself (stale or mismatched; off_policy.py)
    off_policy: str = "none"  # none | naive | decoupled | tis | mis
    off_policy_level: str = "token"  # token | sequence (product) | geometric (mean of the logs)
    off_policy_cap: float = 2.0  # C: tis truncates the weight at C, mis keeps 1/C <= r <= C
    # --- schedule and bookkeeping
    steps: int = 200
    time_budget: float | None = None  # seconds of training wall time (evaluation excluded)
    stop_at_accuracy: float | None = None  # stop at the first held-out evaluation reaching this accuracy
    eval_every: int = 10
    eval_examples: int = 200
    seed: int = 0
    device: str = "cpu"
    keep_distributions: bool = True  # per-step advantages / ratios for the live plots
    # When the loss does not use the reference (GRPO / GSPO at beta = 0), the KL-to-reference metrics
    # (kl_k1, kl_k3) come from the reference's forward on this many completions, evenly spaced over
    # the batch (one per prompt at the defaults: its first), not on all of them: a noisier estimate of
    # the same token mean for an eighth of the rows. None: every completion (the exact batch mean);
    # 0: no KL metrics then (NaN).
    kl_metric_samples: int | None = 32
    # --- the step engine (what a real model on a GPU needs; the same code runs on the CPU)
    # bf16 autocast (log-probs stay fp32); None: on CUDA when supported; True: also on CPU
    bf16: bool | None = None
    attn_implementation: str | None = None  # "eager" / "sdpa"; None: the model's own setting
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, ~1 more forward
    lora_r: int = 0  # > 0: train LoRA adapters of this rank (peft) instead of every weight
    lora_alpha: float = 32.0  # LoRA scale alpha / r
    offload_reference: bool = False  # keep the reference model on the CPU, on the device only for its forward

    def __post_init__(self) -> None:
        from ..tasks import TASKS

        check_choice("task", self.task, tuple(sorted(TASKS)))
        if not isinstance(self.task_params, dict):
            raise ValueError(f"task_params must be a dict such as {{'digits': 3}}, got {self.task_params!r}")
        if self.reward_weights is not None and not isinstance(self.reward_weights, dict):
            raise ValueError("reward_weights must be a dict such as {'correct': 1.0} or None, "
                             f"got {self.reward_weights!r}")
        for name in ("n_train", "n_test", "prompts_per_step", "num_generations", "num_iterations",
                     "num_minibatches", "eval_examples"):
            check_number(name, getattr(self, name), low=1, integer=True)
        for name in ("warmup_steps", "steps", "eval_every", "seed"):
            check_number(name, getattr(self, name), low=0, integer=True)
        if self.eval_examples > self.n_test:
            raise ValueError(
                f"eval_examples ({self.eval_examples}) must be <= n_test ({self.n_test}): evaluation "
                "draws its problems from the test split"
            )
        check_number("temperature", self.temperature, low=0, low_open=True)
        if self.max_completion_length is not None:
            check_number("max_completion_length", self.max_completion_length, low=1, integer=True)
        check_number("learning_rate", self.learning_rate, low=0, low_open=True)
        check_number("weight_decay", self.weight_decay, low=0)
        check_number("max_grad_norm", self.max_grad_norm, low=0, low_open=True)
        check_bool("keep_distributions", self.keep_distributions)
        check_bool("routing_replay", self.routing_replay)
        check_choice("off_policy", self.off_policy, CORRECTIONS)
        check_choice("off_policy_level", self.off_policy_level, LEVELS)
        check_number("off_policy_cap", self.off_policy_cap, low=1, low_open=True)
        check_optional(check_number, "kl_metric_samples", self.kl_metric_samples, low=0, integer=True)
        check_optional(check_bool, "bf16", self.bf16)
        check_optional(check_choice, "attn_implementation", self.attn_implementation, ("eager", "sdpa"))
        for name in ("gradient_checkpointing", "offload_reference"):
            check_bool(name, getattr(self, name))
        check_number("lora_r", self.lora_r, low=0, integer=True)
        check_number("lora_alpha", self.lora_alpha, low=0, low_open=True)
        check_number("epsilon", self.epsilon, low=0, high=1, high_open=True)
        if self.epsilon_high is not None:
            check_number("epsilon_high", self.epsilon_high, low=0)
        if self.time_budget is not None:
            check_number("time_budget", self.time_budget, low=0, low_open=True)
        check_optional(check_number, "stop_at_accuracy", self.stop_at_accuracy, low=0, high=1, low_open=True)
        batch = self.prompts_per_step * self.num_generations
        if batch % self.num_minibatches:
            raise ValueError(
                f"num_minibatches ({self.num_minibatches}) must divide "
                f"prompts_per_step * num_generations ({batch})"
            )

    @property
    def eps_low(self) -> float:
        return self.epsilon

    @property
    def eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def on_policy(self) -> bool:
        """One pass, one minibatch: the policy that sampled is the one being updated (ratio == 1)."""
        return self.num_iterations == 1 and self.num_minibatches == 1

    def replace(self, **changes) -> RLConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
