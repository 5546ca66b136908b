"""The RL training loop. Every algorithm runs the same phases, which you can also call one at a time:

    trainer = Trainer(make_config(algo))            # or Trainer(config, model=..., reward_fn=my_reward)
    rollout = trainer.collect_rollout()             # 1. sample, score, no-grad log-probs the loss needs
    trainer.algorithm.compute_advantages(rollout)   # 2. each completion token's advantage
    stats = trainer.update(rollout)                 # 3. minibatches of loss -> backward -> optimiser step
    trainer.train(steps=100)                        # whole steps, with evaluation and callbacks

The loop knows an algorithm only through its hooks (algorithm.py) and never names one. What every
trainer shares (the loop, atomic steps, Stop, save and resume) comes from rlhf_lab.train.loop; the
metrics row is built in metrics.py. An MoE policy switches on a callback that measures its routing
(routing.py). With LoRA (config.lora_r) the reference is the policy with its adapters disabled.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..checkpoints import model_and_tokenizer
from ..model.lora import adapters_disabled, add_lora, merged_model
from ..sampling import SamplingConfig
from ..tasks import get_task
from ..tasks.rewards import check_reward_fn
from ..train.callbacks import Callback, NonFiniteLossError, call_hooks
from ..train.evaluate import completion_budget, greedy_accuracy
from ..train.loop import TrainingLoop, backward_and_step
from ..train.run_state import weights_sha256
from ..train.schedule import learning_rate_at
from ..util.device import autocast, pick_device
from ..util.limits import (
    check_memory,
    check_positions,
    check_tokenizer_fits,
    generation_bytes,
    training_bytes,
)
from .algorithm import Algorithm, LossInfo
from .config import RLConfig
from .metrics import (
    METRIC_COLUMNS,
    StepDistributions,
    UpdateStats,
    memory_row,
    model_bytes,
    optimizer_bytes,
    reward_parts,
    sampled_kl_metrics,
    step_distributions,
    step_row,
)
from .off_policy import corrected_minibatch
from .rollout import PolicyOutput, Rollout, RolloutSampler, exact_match_reward, learned_models, policy_forward
from .routing import RoutingMonitor, check_routing_replay, is_moe

__all__ = ["Callback", "LossAndGradient", "NonFiniteLossError", "StepDistributions", "Trainer"]


@dataclass
class LossAndGradient:
    """`Trainer.loss_and_gradient`: a minibatch's loss, its report, and d loss / d parameters (flat)."""

    loss: float
    info: LossInfo
    gradient: torch.Tensor  # (num_trainable_parameters,)


class Trainer(TrainingLoop):
    """Train `model` (default: the shipped RL starting checkpoint) with `config.algo`.

    reward_fn: what the optimiser maximises; default the task's rule (config.reward_weights). Any
    callable (prompt, completion, answer, finished) -> float, or an object with
    `score_batch(prompts, completions, answers, finished)`. Accuracy is always the task's exact match.
    """

    dashboard_kind = "rl"  # which view LiveDashboard draws
    history_columns = METRIC_COLUMNS

    def __init__(self, config: RLConfig, model=None, tokenizer=None, reward_fn=None, callbacks=(),
                 algorithm: Algorithm | None = None):
        from . import ALGORITHMS

        self.config = c = config
        self.algorithm = algorithm or ALGORITHMS[c.algo](c)
        self.device = pick_device(c.device)
        torch.manual_seed(c.seed)
        model, self.tokenizer = model_and_tokenizer(model, tokenizer, c.init_checkpoint)
        if c.attn_implementation is not None:
            model.set_attn_implementation(c.attn_implementation)
        model.gradient_checkpointing_enable(c.gradient_checkpointing)
        self.policy = model.to(self.device)
        check_routing_replay(c, self.policy)
        self.ref_model = self.make_reference()
        self.algorithm.setup(self.policy)  # what the method trains beside the policy, e.g. a critic
        # fused: the whole AdamW update in one kernel on the CPU and CUDA (the same formula as foreach)
        fused = self.device.type in ("cpu", "cuda")
        policy_parameters = [p for p in self.policy.parameters() if p.requires_grad]  # LoRA: the adapters
        groups = self.algorithm.parameter_groups(policy_parameters)  # each with its base learning rate
        self.optimizer = torch.optim.AdamW(groups, lr=c.learning_rate, weight_decay=c.weight_decay,
                                           betas=(0.9, 0.99), fused=fused or None,
                                           foreach=None if fused else True)
        self.task = get_task(c.task, **c.task_params)
        self.task.check_tokenizer(self.tokenizer, "a model with its own BPE tokenizer (CLI: --model DIR)")
        accuracy_fn = exact_match_reward(self.task)
        if reward_fn is not None:
            check_reward_fn(reward_fn)
        if reward_fn is None:
            reward_fn = self.task.reward_fn(c.reward_weights)  # validates the weights' names
            if reward_fn.weights == accuracy_fn.weights:  # the reward is the exact match: score once
                reward_fn = accuracy_fn
        self.train_examples, self.test_examples = self.task.make_split(0, c.n_train, c.n_test)  # data seed 0
        self.eval_examples = self.test_examples[: c.eval_examples]  # what evaluate() scores during training
        self.max_completion_length = c.max_completion_length or completion_budget(self.train_examples)
        check_rollout_fits(self)
        sampling = SamplingConfig(do_sample=True, temperature=c.temperature,
                                  max_new_tokens=self.max_completion_length, return_logprobs=True)
        self.sampler = RolloutSampler(
            self.policy, self.tokenizer, self.task, reward_fn, self.train_examples, sampling,
            c.num_generations, sample_generator=torch.Generator(self.device).manual_seed(c.seed),
            data_generator=torch.Generator().manual_seed(c.seed), accuracy_fn=accuracy_fn,
        )
        monitors = [RoutingMonitor()] if is_moe(self.policy) else []
        self.init_loop([*monitors, *callbacks])
        self.distributions: list[StepDistributions] = []
        self._identity: dict[str, str] | None = None

    def make_reference(self):
        """pi_ref, frozen: a copy of the starting policy. With LoRA the policy gets its adapters here and
        the reference is its own base (adapters disabled): None, no second copy."""
        if self.config.lora_r:
            self.policy = add_lora(self.policy, self.config.lora_r, self.config.lora_alpha)
            return None
        reference = copy.deepcopy(self.policy).eval().requires_grad_(False)
        return reference.to("cpu") if self.config.offload_reference else reference

    # ------------------------------------------------------------------------------------------
    # One step

    def _step(self) -> tuple[dict, StepDistributions | None]:
        c, step = self.config, self.step + 1
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate_at(step, group["base_lr"], c.warmup_steps)
        start = time.perf_counter()
        # the reference's forward over the whole batch only when the loss reads it, or when every row's
        # KL is asked for (kl_metric_samples=None); otherwise the KL metrics come from a few rows
        with_reference = self.algorithm.needs_reference_logprobs or c.kl_metric_samples is None
        rollout = self.collect_rollout(with_reference=with_reference)
        extra = {}
        if not with_reference:
            with torch.inference_mode(), self.autocast():
                extra = sampled_kl_metrics(rollout, c.kl_metric_samples, self.reference_logprobs)
        collected = time.perf_counter()
        held = self.reset_peak_memory()
        self.compute_advantages(rollout)
        stats = self.update(rollout)
        done = time.perf_counter()

        self.step, self.train_time = step, self.train_time + done - start
        times = {"wall_time": self.train_time, "step_time": done - start, "rollout_time": collected - start,
                 "update_time": done - collected}
        extra.update(reward_parts=reward_parts(self.task, self.reward_fn, self.tokenizer, rollout),
                     lr=self.optimizer.param_groups[0]["lr"])
        row = step_row(step, rollout, stats, times, extra)
        row.update(memory_row(self.memory_bytes(), self.device, held))
        self.algorithm.after_step(row)
        row["kl_coef"] = self.algorithm.kl_coefficient  # after the hook: an adaptive weight has moved
        return row, step_distributions(step, rollout, stats) if c.keep_distributions else None

    @torch.no_grad()
    def collect_rollout(self, with_reference: bool = True) -> Rollout:
        """Phase 1: sample and score `prompts_per_step` x G completions, let the algorithm shape the
        batch, then the no-grad forwards the loss needs: log pi_ref (with_reference) and the sampling
        policy's own forward when the algorithm asks for log pi_old (an MoE policy's routing always)."""
        self.policy.eval()
        try:
            with self.autocast():
                sampled = self.sampler(self.config.prompts_per_step)
                rollout = self.algorithm.shape_rollout(sampled, self.sampler)
                if with_reference:
                    rollout.ref_logprobs = self.reference_logprobs(rollout)
                old = None
                if self.algorithm.needs_old_logprobs or is_moe(self.policy):
                    old = self.policy_outputs(rollout, replay=False)
                    rollout.old_expert_indices = old.expert_indices  # pi_old's experts (MoE; else None)
                self.algorithm.before_update(rollout, old)
        finally:
            self.policy.train()
        return rollout

    def compute_advantages(self, rollout: Rollout) -> None:
        """Phase 2: the algorithm's advantages. A non-finite one (from a NaN or inf reward) stops the
        step before any weight changes."""
        self.algorithm.compute_advantages(rollout)
        if not torch.isfinite(rollout.advantages).all():
            bad = int((~torch.isfinite(rollout.rewards)).sum())
            raise NonFiniteLossError(
                f"non-finite advantages at step {self.step + 1} ({bad} non-finite reward(s)); "
                f"training stopped and the weights were kept from step {self.step}"
            )

    def update(self, rollout: Rollout) -> UpdateStats:
        """Phase 3: `num_iterations` passes over the rollout, each in `num_minibatches` shuffled
        minibatches, one `minibatch_step` each. rollout.advantages must be filled (phase 2)."""
        c, stats = self.config, UpdateStats()
        call_hooks(self.callbacks, "on_update_begin", self, rollout)
        size = len(rollout) // c.num_minibatches
        for iteration in range(c.num_iterations):
            order = torch.randperm(len(rollout), generator=self.sampler.data_generator).to(self.device)
            for k in range(c.num_minibatches):
                minibatch = rollout.select(order[k * size : (k + 1) * size])
                info, grad_norm, policy = self.minibatch_step(minibatch, with_entropy=iteration == 0)
                stats.add(info, minibatch, policy, grad_norm, first_pass=iteration == 0,
                          keep=c.keep_distributions)
                call_hooks(self.callbacks, "on_minibatch_end", self, minibatch, policy, info)
        call_hooks(self.callbacks, "on_update_end", self, rollout, stats)
        return stats

    def minibatch_step(self, minibatch: Rollout,
                       with_entropy: bool = False) -> tuple[LossInfo, float, PolicyOutput]:
        """One optimiser step on one minibatch: loss -> backward -> clip the gradient norm -> AdamW step.
        Returns (the loss's report, the gradient norm before clipping, the forward's outputs)."""
        policy = self.policy_outputs(minibatch, with_entropy=with_entropy)
        # a rollout sampled by another copy of the policy (stale, or mismatched): off_policy.py
        minibatch = corrected_minibatch(minibatch, policy.logprobs, self.config)
        loss, info = self.algorithm.loss(minibatch, policy)
        if policy.aux_loss is not None:  # MoE: the router's load-balancing (+ z) loss, already weighted
            loss = loss + policy.aux_loss
        grad_norm = backward_and_step(
            loss, self.optimizer, self.trainable_parameters(), self.config.max_grad_norm, self.step + 1, "RL"
        )
        return info, grad_norm, policy

    # ------------------------------------------------------------------------------------------
    # Forwards

    def policy_outputs(self, minibatch: Rollout, with_entropy: bool = False,
                       replay: bool = True) -> PolicyOutput:
        """Log pi(token) under the current weights (with gradient when enabled), and the value head's
        V(s_t) when the policy has one. replay: with config.routing_replay an MoE policy routes each
        token to the experts pi_old chose."""
        experts = minibatch.old_expert_indices if replay and self.config.routing_replay else None
        with self.autocast():
            return policy_forward(self.policy, minibatch, self.config.temperature, with_entropy=with_entropy,
                                  with_values=True, share_prompts=True, expert_indices=experts)

    def reference_logprobs(self, rollout: Rollout) -> torch.Tensor:
        """(N, T) log pi_ref of the rollout's tokens: the frozen copy (moved to the device for this
        forward when off-loaded), or with LoRA the policy with its adapters disabled."""
        T = self.config.temperature
        if self.ref_model is None:
            with adapters_disabled(self.policy):
                return policy_forward(self.policy, rollout, T, share_prompts=True).logprobs
        if not self.config.offload_reference:
            return policy_forward(self.ref_model, rollout, T, share_prompts=True).logprobs
        try:
            return policy_forward(self.ref_model.to(self.device), rollout, T, share_prompts=True).logprobs
        finally:
            self.ref_model.to("cpu")

    def loss_and_gradient(self, minibatch: Rollout, algorithm: Algorithm | None = None,
                          on_policy: bool = False) -> LossAndGradient:
        """The loss of `minibatch` under the current weights and its gradient (flattened over
        `trainable_parameters()`), with this trainer's algorithm or another one. Nothing is updated.
        on_policy=True (or no stored old log-probs) takes pi_old = pi_theta.detach(): ratio exactly 1,
        what `update` does with one pass and one minibatch."""
        algorithm = algorithm or self.algorithm
        policy = self.policy_outputs(minibatch)
        if on_policy or minibatch.old_logprobs is None:
            minibatch = dataclasses.replace(minibatch, old_logprobs=policy.logprobs.detach())
        loss, info = algorithm.loss(minibatch, policy)
        params = self.trainable_parameters()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        flat = torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(grads, params)])
        return LossAndGradient(loss=loss.item(), info=info, gradient=flat)

    # ------------------------------------------------------------------------------------------
    # What the trainer holds

    @property
    def reward_fn(self):
        """The reward the optimiser sees (pass another one to the constructor)."""
        return self.sampler.reward_fn

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimiser trains, group by group: the policy's trainable parameters (LoRA: the
        adapters only), then those of the algorithm's own models (e.g. a separate critic)."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def autocast(self):
        """bf16 autocast when config.bf16 asks for it (None: on CUDA when supported); log-probs stay fp32."""
        return autocast(self.device, self.config.bf16)

    def evaluate(self, examples=None) -> float:
        """Greedy exact-match accuracy on `examples` (default: the held-out `eval_examples`)."""
        examples = self.eval_examples if examples is None else examples
        return greedy_accuracy(self.policy, self.tokenizer, self.task, examples,
                               max_new_tokens=self.max_completion_length)

    def memory_bytes(self) -> dict:
        """Bytes held: parameters of every model (the reference is 0 with LoRA, where it is the
        policy's own base weights), gradients of the trainable ones and the optimiser's states."""
        models = {"policy": self.policy, "reference": self.ref_model, **self.algorithm.models()}
        out = {f"params_{name}": model_bytes(m) if m is not None else 0 for name, m in models.items()}
        out["gradients"] = sum(p.grad.numel() * p.grad.element_size() for p in self.trainable_parameters()
                               if p.grad is not None)
        out["optimizer"] = optimizer_bytes(self.optimizer)
        return out

    def reset_peak_memory(self) -> int:
        """Bytes held before the update, with the device's peak counter reset (CUDA; 0 elsewhere)."""
        if self.device.type != "cuda":
            return 0
        torch.cuda.reset_peak_memory_stats(self.device)
        return torch.cuda.memory_allocated(self.device)

    def save(self, folder: str | Path) -> Path:
        """The policy as a Hugging Face folder (atomic) plus history.csv beside it."""
        from ..model import save_pretrained

        last_eval = self.history["eval_accuracy"].dropna()
        meta = {"algo": self.config.algo, "step": self.step,
                "eval_accuracy": float(last_eval.iloc[-1]) if len(last_eval) else None}
        # LoRA: the merged weights W + (alpha / r) B A, an ordinary checkpoint any loader reads.
        folder = save_pretrained(merged_model(self.policy), folder, tokenizer=self.tokenizer, metadata=meta)
        self.history.to_csv(folder / "history.csv", index=False)
        return folder

    def early_stop(self, metrics: dict) -> str | None:
        """"stop_at_accuracy" once a held-out evaluation reaches config.stop_at_accuracy."""
        target = self.config.stop_at_accuracy
        return "stop_at_accuracy" if target is not None and metrics["eval_accuracy"] >= target else None

    def latest_distributions(self) -> StepDistributions | None:
        return self.distributions[-1] if self.config.keep_distributions and self.distributions else None

    def identity(self) -> dict[str, str]:
        """sha256 of the reference (the starting weights; with LoRA, the policy's frozen base) and of
        a learned reward model: a resume from other weights is refused (rlhf_lab.train.run_state)."""
        if self._identity is None:  # neither changes during a run: hashed once
            reference = self.ref_model if self.ref_model is not None else {
                name: tensor for name, tensor in self.policy.state_dict().items() if "lora_" not in name}
            self._identity = {"reference": weights_sha256([reference])}
            learned = learned_models(self.reward_fn)
            if learned:
                self._identity["reward_model"] = weights_sha256(learned)
        return self._identity

    # What a step changes, for the loop's atomic steps and for save_state / resume (rlhf_lab.train)

    def state_modules(self) -> dict[str, torch.nn.Module]:
        return {"policy": self.policy, **self.algorithm.models()}

    def state_generators(self) -> dict[str, torch.Generator]:
        return {"sample": self.sampler.sample_generator, "data": self.sampler.data_generator}

    def step_state(self) -> dict:
        return self.algorithm.state_dict()

    def load_step_state(self, state: dict) -> None:
        self.algorithm.load_state_dict(state)

    def extra_state(self) -> dict:
        return {"algorithm": self.algorithm.state_dict(),
                "distributions": [dataclasses.asdict(d) for d in self.distributions]}

    def load_extra_state(self, state: dict) -> None:
        self.algorithm.load_state_dict(state["algorithm"])
        self.distributions = [StepDistributions(**d) for d in state["distributions"]]

    def _commit(self, result) -> dict:
        row, distributions = result
        self.rows.append(row)
        if distributions is not None:
            self.distributions.append(distributions)
        return row


def check_rollout_fits(trainer: Trainer) -> None:
    """Before any work: the tokenizer fits the model, prompt + completion fit its context, and a
    rollout fits in memory (rlhf_lab.util.limits)."""
    c, model_config = trainer.config, trainer.policy.config
    check_tokenizer_fits(trainer.tokenizer, model_config)
    longest = max((*trainer.train_examples, *trainer.test_examples), key=lambda e: len(e.prompt))
    prompt_tokens = len(trainer.tokenizer.encode(longest.prompt, add_bos=True))
    completion = trainer.max_completion_length
    check_positions(model_config, prompt_tokens, completion, "max_completion_length")
    trainer.algorithm.check_budget(completion)
    rows, length = c.prompts_per_step * c.num_generations, prompt_tokens + completion
    # generation, then the update's forward and backward
    needed = generation_bytes(model_config, rows, prompt_tokens, completion)
    needed += training_bytes(model_config, rows, length)
    check_memory(needed, trainer.device, f"a rollout of {rows} completions of up to {completion} tokens",
                 "prompts_per_step, num_generations or max_completion_length")
