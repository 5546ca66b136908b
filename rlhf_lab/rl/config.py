"""`RLConfig`: what every algorithm shares. Each algorithm module adds its own fields.

Field names follow TRL's GRPOConfig / PPOConfig where they exist (num_generations, num_iterations,
beta, epsilon, epsilon_high, temperature, max_completion_length, learning_rate, max_grad_norm...).
Each field declares what it accepts, checked at construction and again when assigned later
(rlhf_lab.util.validation); errors name the field and the allowed values. Settings that only some
methods use live in their config classes: beta in the policy-gradient family (policy_gradient.py),
kl_coef and the critic in PPO's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..tasks import task_names
from ..tasks.jsonl import SPLIT_N_TRAIN
from ..util.device import check_device
from ..util.validation import Validated, setting
from .off_policy import CORRECTIONS, LEVELS


@dataclass
class RLConfig(Validated):
    """Shared settings: the rollout, the optimiser, the schedule and the bookkeeping."""

    algo: str = setting("base", help="the algorithm; each config class fixes its own")
    # --- where we start and what we train on
    init_checkpoint: str = setting("addition_rl_start", help="a shipped checkpoint name or a folder")
    task: str = setting("addition", choices=task_names, help="what the policy is trained on")
    task_params: dict = setting(default_factory=lambda: {"digits": 3}, help="the task's parameters")
    reward_weights: dict | None = setting(None, help='e.g. {"correct": 1.0, "partial": 0.5}; None: default')
    n_train: int = setting(SPLIT_N_TRAIN, ge=1, help="same split as SFT: the checkpoint's held-out test set")
    n_test: int = setting(500, ge=1, help="held-out split")
    # --- rollout
    prompts_per_step: int = setting(32, ge=1, help="distinct prompts per rollout")
    num_generations: int = setting(8, ge=1, help="G completions per prompt")
    temperature: float = setting(1.0, gt=0, help="sampling temperature")
    max_completion_length: int | None = setting(None, ge=1, help="None: the task's longest answer + EOS + 2")
    # --- optimisation
    learning_rate: float = setting(2e-4, gt=0, le=1, help="AdamW learning rate")
    warmup_steps: int = setting(0, ge=0, help="linear warm-up steps")
    weight_decay: float = setting(0.0, ge=0, help="AdamW's weight decay")
    max_grad_norm: float = setting(1.0, gt=0, help="gradient clipping norm")
    num_iterations: int = setting(1, ge=1, help="passes over each rollout (PPO's epochs)")
    num_minibatches: int = setting(1, ge=1, help="minibatches per pass; > 1 makes later ones off-policy")
    epsilon: float = setting(0.2, ge=0, lt=1, help="clip range (lower)")
    epsilon_high: float | None = setting(None, ge=0, help="clip range (upper); None: epsilon")
    routing_replay: bool = setting(False, help="MoE: pi_theta with pi_old's experts (GSPO paper, section 5)")
    # --- rollouts the learner did not sample itself (stale or mismatched; off_policy.py)
    off_policy: str = setting("none", choices=CORRECTIONS, help="none | naive | decoupled | tis | mis")
    off_policy_level: str = setting("token", choices=LEVELS, help="token | sequence (product) | geometric")
    off_policy_cap: float = setting(2.0, gt=1, help="C: tis truncates the weight at C; mis keeps 1/C..C")
    # --- schedule and bookkeeping
    steps: int = setting(200, ge=0, help="RL steps")
    time_budget: float | None = setting(None, gt=0, help="seconds of training (evaluation excluded)")
    stop_at_accuracy: float | None = setting(None, gt=0, le=1, help="stop at the first evaluation this good")
    eval_every: int = setting(10, ge=0, help="steps between held-out evaluations; 0: never")
    eval_examples: int = setting(200, ge=1, help="held-out problems per evaluation (<= n_test)")
    seed: int = setting(0, ge=0, help="sampling, prompt order and minibatch order")
    device: str = setting("cpu", check=check_device, help="cpu, cuda, cuda:N, mps or auto")
    keep_distributions: bool = setting(True, help="per-step advantages / ratios for the live plots")
    # When the loss does not use the reference (GRPO / GSPO at beta = 0), the KL-to-reference metrics
    # (kl_k1, kl_k3) come from the reference's forward on this many completions, evenly spaced over
    # the batch (one per prompt at the defaults: its first), not on all of them: a noisier estimate of
    # the same token mean for an eighth of the rows.
    kl_metric_samples: int | None = setting(32, ge=0, help="None: every completion; 0: no KL metrics")
    # --- the step engine (what a real model on a GPU needs; the same code runs on the CPU)
    bf16: bool | None = setting(None, help="bf16 autocast (log-probs stay fp32); None: on CUDA if supported")
    attn_implementation: str | None = setting(None, choices=("eager", "sdpa"), help="None: the model's own")
    gradient_checkpointing: bool = setting(False, help="recompute activations in backward: less memory")
    lora_r: int = setting(0, ge=0, help="> 0: train LoRA adapters of this rank (peft), not every weight")
    lora_alpha: float = setting(32.0, gt=0, help="LoRA scale alpha / r")
    offload_reference: bool = setting(False, help="keep the reference on the CPU but for its forward")

    def check(self) -> None:
        if self.eval_examples > self.n_test:
            raise ValueError(f"eval_examples ({self.eval_examples}) must be <= n_test ({self.n_test}): "
                             "evaluation draws its problems from the test split")
        batch = self.prompts_per_step * self.num_generations
        if batch % self.num_minibatches:
            raise ValueError(f"num_minibatches ({self.num_minibatches}) must divide prompts_per_step * "
                             f"num_generations ({batch})")

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
