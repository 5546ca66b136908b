"""One training loop for every algorithm, made of phases you can also call one at a time.

    trainer = Trainer(make_config(algo))                   # or Trainer(config, reward_fn=my_reward)
    rollout = trainer.collect_rollout()                    # 1. sample + score (+ the algorithm's shaping),
                                                           #    no-grad log pi_ref, log pi_old, V_old
    trainer.algorithm.compute_advantages(rollout)          # 2. each completion token's advantage
    stats = trainer.update(rollout)                        # 3. passes x minibatches of minibatch_step:
                                                           #    loss -> backward -> clip -> optimiser step
    stats.metrics()                                        #    what the update did (clip fractions, ratios, ...)

`train_step()` is those three phases plus one row of metrics, done atomically, and `train()` loops
over it with evaluation and callbacks; both come from `rlhf_lab.train.loop.TrainingLoop`, shared with SFT.
What a step does not need it skips: no log pi_old forward on-policy (pi_old = pi_theta.detach(), as
TRL does), no reference forward over the batch when the loss does not read log pi_ref (beta = 0,
TRL's default: the KL metrics then come from `kl_metric_samples` rows), and every teacher-forced
forward runs each distinct prompt once for its G completions (rollout.py); on Linux the memory a step
frees stays in the process for the next one instead of being page-faulted back in (allocator.py).
bench/profile_step.py shows where the time of a step goes.
`loss_and_gradient(minibatch)` gives a loss and its gradient without changing the weights (to
compare losses or advantages on the same samples).

The loop knows the algorithm only through its hooks (algorithm.py): `make_critic`,
`shape_rollout`, `needs_old_logprobs`, `needs_reference_logprobs`, `compute_advantages`, `loss`, `after_step`, `kl_coefficient`
and `state_dict`. It never names one.

A mixture-of-experts policy (rlhf_lab.rl.routing): the rollout keeps pi_old's experts, the update
adds the model's router aux loss to the algorithm's loss, `routing_replay=True` computes pi_theta with
pi_old's experts, and each step logs how many tokens changed experts (`routing_change`, ...).

The step engine (config: bf16, attn_implementation, gradient_checkpointing, lora_r, offload_reference)
is what a real model on a GPU needs; it is the same code on the CPU, where CI tests it. With LoRA
the reference policy is the frozen base (the policy with its adapters off): no second copy.
`memory_bytes()` says what is held.

Faults: each step is atomic. A non-finite loss, gradient or weight, or a KeyboardInterrupt (Stop in
Jupyter), restores the weights, optimiser, algorithm and RNG states from before the step, keeps
every completed row of `history`, and returns; call `train()` again to continue.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from ..model.lora import adapters_disabled, add_lora, merged_model
from ..sampling import SamplingConfig
from ..tasks import get_task
from ..tasks.rewards import WeightedReward
from ..train.callbacks import Callback, NonFiniteLossError
from ..train.evaluate import completion_budget, greedy_accuracy
from ..train.loop import TrainingLoop, clone_state, optimizer_snapshot, restore_optimizer
from ..train.schedule import learning_rate_at
from ..util.allocator import keep_freed_memory
from ..util.device import autocast, pick_device
from ..util.limits import check_memory, check_positions, check_tokenizer_fits, generation_bytes
from .algorithm import Algorithm, LossInfo
from .config import RLConfig
from .losses import explained_variance
from .metrics import (
    METRIC_COLUMNS,
    UpdateStats,
    kl_metrics,
    model_bytes,
    optimizer_bytes,
    peak_memory_bytes,
    reward_stats,
)
from .rollout import PolicyOutput, Rollout, RolloutSampler, exact_match_reward, policy_forward
from .routing import RoutingStats, check_routing_replay, is_moe

__all__ = ["Callback", "LossAndGradient", "NonFiniteLossError", "StepDistributions", "Trainer"]


@dataclass
class StepDistributions:
    """What the live plots show for one step (CPU tensors)."""

    step: int
    advantages: torch.Tensor  # (N,) one value per completion (first token's advantage)
    rewards: torch.Tensor  # (N,)
    num_generations: int
    token_ratios: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # every token's ratio, all passes
    sequence_ratios: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # (n,) per completion, all passes


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

    def __init__(self, config: RLConfig, model=None, tokenizer=None, reward_fn=None, callbacks=(),
                 algorithm: Algorithm | None = None):
        from . import ALGORITHMS

        self.config = config
        self.algorithm = algorithm or ALGORITHMS[config.algo](config)
        self.device = pick_device(config.device)
        keep_freed_memory()  # glibc: what a step frees stays in the process for the next (allocator.py)
        torch.manual_seed(config.seed)
        from ..checkpoints import model_and_tokenizer

        model, tokenizer = model_and_tokenizer(model, tokenizer, config.init_checkpoint)
        self.tokenizer = tokenizer
        if config.attn_implementation is not None:
            model.set_attn_implementation(config.attn_implementation)
        model.gradient_checkpointing_enable(config.gradient_checkpointing)
        self.policy = model.to(self.device)
        check_routing_replay(config, self.policy)
        if config.lora_r:  # the reference is the base itself: the policy with its adapters disabled
            self.policy = add_lora(self.policy, config.lora_r, config.lora_alpha)
            self.ref_model = None
        else:
            self.ref_model = copy.deepcopy(self.policy).eval().requires_grad_(False)
            if config.offload_reference:
                self.ref_model.to("cpu")
        self.critic = self.algorithm.make_critic(self.policy)  # None, the policy itself, or its own model
        # fused: the whole AdamW update in one kernel (CPU and CUDA), ~4x faster than foreach on the
        # CPU for this model; the same formula, weights equal to foreach's up to float32 rounding
        # (1 ulp). foreach (one multi-tensor kernel per operation) elsewhere.
        fused = self.device.type in ("cpu", "cuda")
        self.optimizer = torch.optim.AdamW(self.trainable_parameters(), lr=config.learning_rate,
                                           weight_decay=config.weight_decay, betas=(0.9, 0.99),
                                           fused=fused or None, foreach=None if fused else True)
        self.task = get_task(config.task, **config.task_params)
        accuracy_fn = exact_match_reward(self.task)
        if reward_fn is None:
            reward_fn = self.task.reward_fn(config.reward_weights)  # validates the weights' names
            if reward_fn.weights == accuracy_fn.weights:  # the reward is the exact match: score once
                reward_fn = accuracy_fn
        self.train_examples, self.test_examples = self.task.make_split(0, config.n_train, config.n_test)  # data seed fixed
        self.eval_examples = self.test_examples[: config.eval_examples]  # what evaluate() scores during training
        self.max_completion_length = config.max_completion_length or completion_budget(self.train_examples)
        self._check_bounds()
        sampling = SamplingConfig(do_sample=True, temperature=config.temperature,
                                  max_new_tokens=self.max_completion_length, return_logprobs=True)
        self.sampler = RolloutSampler(
            self.policy, tokenizer, self.task, reward_fn, self.train_examples, sampling, config.num_generations,
            sample_generator=torch.Generator(self.device).manual_seed(config.seed),
            data_generator=torch.Generator().manual_seed(config.seed), accuracy_fn=accuracy_fn,
        )
        self.callbacks = list(callbacks)
        self.rows: list[dict] = []
        self.distributions: list[StepDistributions] = []
        self.step = 0
        self.train_time = 0.0  # seconds spent in training steps (evaluation excluded)
        self.stop_reason: str | None = None

    def _check_bounds(self) -> None:
        """Before any work: the tokenizer fits the model, prompt + completion fit its context, and a
        rollout fits in memory (rlhf_lab.util.limits)."""
        c, model_config = self.config, self.policy.config
        check_tokenizer_fits(self.tokenizer, model_config)
        longest = max((*self.train_examples, *self.test_examples), key=lambda e: len(e.prompt))
        prompt_tokens = len(self.tokenizer.encode(longest.prompt, add_bos=True))
        check_positions(model_config, prompt_tokens, self.max_completion_length, "max_completion_length")
        rows, length = c.prompts_per_step * c.num_generations, prompt_tokens + self.max_completion_length
        # generation, then the update's forward/backward: ~4 float32 copies of the (rows, T, vocab)
        # logits (log-softmax, its gradient) and ~16 of each layer's (rows, length, hidden) activations
        needed = generation_bytes(model_config, rows, prompt_tokens, self.max_completion_length) + rows * length * 4 * (
            4 * model_config.vocab_size + 16 * model_config.num_hidden_layers * model_config.hidden_size)
        check_memory(needed, self.device, f"a rollout of {rows} completions of up to {self.max_completion_length} tokens",
                     "prompts_per_step, num_generations or max_completion_length")

    # ------------------------------------------------------------------------------------------
    # What the trainer holds

    @property
    def reward_fn(self):
        """The reward the optimiser sees (pass another one to the constructor)."""
        return self.sampler.reward_fn

    @property
    def history(self) -> pd.DataFrame:
        frame = pd.DataFrame(self.rows)
        ordered = [c for c in METRIC_COLUMNS if c in frame.columns]
        return frame[ordered + [c for c in frame.columns if c not in ordered]]

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The policy's trainable parameters (LoRA: the adapters only), then a separate critic's (a
        shared value head is the policy's)."""
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if self.critic is not None and self.critic is not self.policy:
            params += list(self.critic.parameters())
        return params

    def autocast(self):
        """bf16 autocast when config.bf16 asks for it (None: on CUDA when supported); log-probs stay fp32."""
        return autocast(self.device, self.config.bf16)

    def evaluate(self, examples=None) -> float:
        """Held-out greedy exact-match accuracy."""
        return greedy_accuracy(self.policy, self.tokenizer, self.task, examples or self.eval_examples,
                               max_new_tokens=self.max_completion_length)

    def memory_bytes(self) -> dict:
        """Bytes held: parameters of every model (the reference is 0 with LoRA, where it is the
        policy's own base weights), gradients of the trainable ones and the optimiser's states."""
        models = {"policy": self.policy, "reference": self.ref_model}
        if self.critic is not None and self.critic is not self.policy:
            models["critic"] = self.critic
        out = {f"params_{name}": model_bytes(m) if m is not None else 0 for name, m in models.items()}
        out["gradients"] = sum(p.grad.numel() * p.grad.element_size() for p in self.trainable_parameters()
                               if p.grad is not None)
        out["optimizer"] = optimizer_bytes(self.optimizer)
        return out

    def reward_parts(self, rollout: Rollout) -> dict:
        """Mean of each named reward over the rollout, {"reward_answer": ..., "reward_format": ...}, for
        tasks that bring their own rewards (the think/answer tasks; TRL logs rewards/<name>/mean the same
        way): the format-reward rate is what tells a model that learned the shape from one that learned
        the answer. Empty for other tasks or a custom reward function."""
        if self.task.rewards is None or not isinstance(self.reward_fn, WeightedReward) or rollout.examples is None:
            return {}
        decoded = [self.tokenizer.decode_until_eos(row) for row in rollout.completion_ids.tolist()]
        texts, finished = [text for text, _ in decoded], [done for _, done in decoded]
        parts = self.reward_fn.breakdown_batch([e.prompt for e in rollout.examples], texts,
                                               [e.answer for e in rollout.examples], finished)
        return {f"reward_{name}": sum(values) / len(values) for name, values in parts.items()}

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

    # ------------------------------------------------------------------------------------------
    # The phases of one step

    @torch.no_grad()
    def collect_rollout(self, with_reference: bool = True) -> Rollout:
        """Phase 1: sample and score `prompts_per_step` x G completions, let the algorithm shape the
        batch, then the no-grad forwards the loss needs: log pi_ref (the KL), log pi_old when the
        algorithm asks for it, and the critic's V_old. with_reference=False skips the reference's
        forward (rollout.ref_logprobs stays None): `train_step` does so when the algorithm's loss does
        not read it (`needs_reference_logprobs`: a policy gradient with no KL term in its loss)."""
        self.policy.eval()
        try:
            with self.autocast():
                rollout = self.algorithm.shape_rollout(self.sampler(self.config.prompts_per_step), self.sampler)
            T = self.config.temperature
            with self.autocast():
                if with_reference:
                    rollout.ref_logprobs = self.reference_logprobs(rollout)
                moe = is_moe(self.policy)  # pi_old's experts: for routing replay and the routing metrics
                if self.algorithm.needs_old_logprobs or self.critic is self.policy or moe:
                    old = policy_forward(self.policy, rollout, T, with_values=self.critic is self.policy,
                                         share_prompts=True)
                    if self.algorithm.needs_old_logprobs:
                        rollout.old_logprobs = old.logprobs
                    rollout.old_values = old.values
                    rollout.old_expert_indices = old.expert_indices
                if self.critic is not None and self.critic is not self.policy:
                    rollout.old_values = policy_forward(self.critic, rollout, T, with_values=True, share_prompts=True).values
        finally:
            self.policy.train()
        return rollout

    @torch.inference_mode()
    def sampled_kl_metrics(self, rollout: Rollout) -> dict:
        """kl_k1 and kl_k3 of the sampling policy to the reference, token means over
        `kl_metric_samples` completions evenly spaced over the batch: the reference's forward on
        those rows only. log pi_old is what the sampler recorded when it drew each token (the same
        distribution a teacher-forced forward gives, up to float rounding), so the policy needs no
        forward of its own. An estimate from fewer rows: noisier than the full-batch KL.
        Under inference_mode (no_grad without autograd's view and version tracking, ~5% less time for
        this forward): nothing computed here is used again, only the two numbers."""
        k = min(self.config.kl_metric_samples or 0, len(rollout))
        if k == 0:
            return {"kl_k1": float("nan"), "kl_k3": float("nan")}
        rows = torch.arange(k, device=rollout.rewards.device) * (len(rollout) // k)  # one per prompt at the defaults
        sample = rollout.select(rows)
        with self.autocast():
            ref = self.reference_logprobs(sample)
            old = sample.sampling_logprobs
            if old is None:  # a rollout built without the sampler's log-probs
                old = policy_forward(self.policy, sample, self.config.temperature, share_prompts=True).logprobs
        return kl_metrics(old, ref, sample.completion_mask)

    def early_stop(self, metrics: dict) -> str | None:
        """"stop_at_accuracy" once a held-out evaluation reaches config.stop_at_accuracy (the race's targets)."""
        target = self.config.stop_at_accuracy
        return "stop_at_accuracy" if target is not None and metrics["eval_accuracy"] >= target else None

    def policy_outputs(self, minibatch: Rollout, with_entropy: bool = False) -> PolicyOutput:
        """Log pi(token) under the weights being trained (with gradient), and V(s_t) from the critic."""
        T, shared = self.config.temperature, self.critic is self.policy
        replay = minibatch.old_expert_indices if self.config.routing_replay else None  # pi_old's experts
        with self.autocast():
            out = policy_forward(self.policy, minibatch, T, with_entropy=with_entropy, with_values=shared,
                                 share_prompts=True, expert_indices=replay)
            if self.critic is not None and not shared:
                out.values = policy_forward(self.critic, minibatch, T, with_values=True, share_prompts=True).values
        return out

    def minibatch_step(self, minibatch: Rollout, with_entropy: bool = False) -> tuple[LossInfo, float, PolicyOutput]:
        """One optimiser step on one minibatch: loss -> backward -> clip the gradient norm -> AdamW step.
        Returns (the loss's report, the gradient norm before clipping, the forward's outputs).
        Raises NonFiniteLossError on a NaN/inf loss or gradient, before the step that would use it."""
        step = self.step + 1
        policy = self.policy_outputs(minibatch, with_entropy=with_entropy)
        if minibatch.old_logprobs is None:  # on-policy: old = new.detach(), the ratio is exactly 1
            minibatch.old_logprobs = policy.logprobs.detach()
        loss, info = self.algorithm.loss(minibatch, policy)
        if policy.aux_loss is not None:  # MoE: the router's load-balancing (+ z) loss, already weighted
            loss = loss + policy.aux_loss
        if not torch.isfinite(loss):
            raise NonFiniteLossError(f"non-finite loss ({loss.item()}) at step {step}; training stopped "
                                     f"and the weights were kept from step {step - 1}")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), self.config.max_grad_norm))
        if not math.isfinite(grad_norm):
            raise NonFiniteLossError(f"non-finite gradient norm at step {step}; training stopped and the "
                                     f"weights were kept from step {step - 1}")
        self.optimizer.step()
        return info, grad_norm, policy

    def update(self, rollout: Rollout) -> UpdateStats:
        """Phase 3: `num_iterations` passes over the rollout, each in `num_minibatches` shuffled
        minibatches, one `minibatch_step` each. rollout.advantages must be filled (phase 2)."""
        c = self.config
        stats, routing = UpdateStats(), RoutingStats()
        N = len(rollout)
        size = N // c.num_minibatches
        for iteration in range(c.num_iterations):
            order = torch.randperm(N, generator=self.sampler.data_generator).to(self.device)
            for k in range(c.num_minibatches):
                minibatch = rollout.select(order[k * size : (k + 1) * size])
                first_pass = iteration == 0
                info, grad_norm, policy = self.minibatch_step(minibatch, with_entropy=first_pass)
                mask = minibatch.completion_mask
                stats.add(info, mask, grad_norm, keep=c.keep_distributions)
                routing.add(info, minibatch, policy, updates_before=iteration * c.num_minibatches + k)
                if first_pass:  # where the sampling policy stands: entropy, KL to the reference, critic fit
                    explained = None
                    if minibatch.returns is not None and policy.values is not None:
                        explained = float(explained_variance(policy.values.detach(), minibatch.returns, mask))
                    stats.add_first_pass(policy.entropy, minibatch.old_logprobs, minibatch.ref_logprobs, mask,
                                         explained)
        if rollout.old_expert_indices is not None:  # the same tokens, re-routed by the updated weights
            with torch.no_grad(), self.autocast():
                after = policy_forward(self.policy, rollout, c.temperature)
            routing.add_after_update(after, rollout, self.policy.config.num_local_experts)
        stats.extra.update(routing.metrics())
        return stats

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
        flat = torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])
        return LossAndGradient(loss=loss.item(), info=info, gradient=flat)

    # ------------------------------------------------------------------------------------------
    # A whole step, and the loop

    def latest_distributions(self) -> StepDistributions | None:
        return self.distributions[-1] if self.config.keep_distributions and self.distributions else None

    # ------------------------------------------------------------------------------------------

    def state_modules(self) -> dict[str, torch.nn.Module]:
        modules = {"policy": self.policy}
        if self.critic is not None and self.critic is not self.policy:
            modules["critic"] = self.critic
        return modules

    def state_generators(self) -> dict[str, torch.Generator]:
        return {"sample": self.sampler.sample_generator, "data": self.sampler.data_generator}

    def extra_state(self) -> dict:
        return {"algorithm": self.algorithm.state_dict(),
                "distributions": [dataclasses.asdict(d) for d in self.distributions]}

    def load_extra_state(self, state: dict) -> None:
        self.algorithm.load_state_dict(state["algorithm"])
        self.distributions = [StepDistributions(**d) for d in state["distributions"]]

    def _snapshot(self):
        separate = self.critic is not None and self.critic is not self.policy
        return (clone_state(self.policy.state_dict()), clone_state(self.critic.state_dict()) if separate else None,
                optimizer_snapshot(self.optimizer), copy.deepcopy(self.algorithm.state_dict()),
                self.sampler.sample_generator.get_state(), self.sampler.data_generator.get_state())

    def _restore(self, snapshot) -> None:
        policy, critic, optimizer, algorithm, sample_state, data_state = snapshot
        self.policy.load_state_dict(policy)
        if critic is not None:
            self.critic.load_state_dict(critic)
        restore_optimizer(self.optimizer, optimizer)
        self.algorithm.load_state_dict(algorithm)
        self.sampler.sample_generator.set_state(sample_state)
        self.sampler.data_generator.set_state(data_state)

    def _commit(self, result) -> dict:
        metrics, distributions = result
        self.rows.append(metrics)
        if distributions is not None:
            self.distributions.append(distributions)
        return metrics

    def _step(self) -> tuple[dict, StepDistributions | None]:
        c = self.config
        step = self.step + 1
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate_at(step, c.learning_rate, c.warmup_steps)
        t0 = time.perf_counter()
        # the reference's forward over the whole batch only when the loss reads it or the KL metrics
        # are asked for on every completion (kl_metric_samples=None)
        with_reference = self.algorithm.needs_reference_logprobs or c.kl_metric_samples is None
        rollout = self.collect_rollout(with_reference=with_reference)
        sampled_kl = None if with_reference else self.sampled_kl_metrics(rollout)
        t1 = time.perf_counter()
        held_before_update = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.algorithm.compute_advantages(rollout)
        if not torch.isfinite(rollout.advantages).all():
            bad = int((~torch.isfinite(rollout.rewards)).sum())
            raise NonFiniteLossError(f"non-finite advantages at step {step} ({bad} non-finite reward(s)); training "
                                     f"stopped and the weights were kept from step {self.step}")
        stats = self.update(rollout)
        t2 = time.perf_counter()

        self.step = step
        self.train_time += t2 - t0
        m = rollout.completion_mask
        lengths = rollout.lengths
        advantages = rollout.advantages[:, 0] if rollout.advantages.shape[1] else torch.zeros(len(rollout))
        metrics = {
            "step": step, "wall_time": self.train_time, "step_time": t2 - t0, "rollout_time": t1 - t0,
            "update_time": t2 - t1,
            **reward_stats(rollout.rewards, rollout.num_generations),
            **self.reward_parts(rollout),
            "accuracy": rollout.correct.float().mean().item(),
            "eval_accuracy": float("nan"),
            **stats.metrics(),
            **(sampled_kl or {}),
            "adv_mean": rollout.advantages[m.bool()].mean().item() if m.any() else float("nan"),
            "adv_std": rollout.advantages[m.bool()].std().item() if m.sum() > 1 else float("nan"),
            "completion_len_mean": lengths.float().mean().item(),
            "completion_len_max": lengths.max().item(),
            "truncation_rate": rollout.truncated.float().mean().item(),
            "lr": self.optimizer.param_groups[0]["lr"],
            "tokens_per_s": lengths.sum().item() / max(t2 - t0, 1e-9),
            "num_rollout_rows": len(rollout),
        }
        memory = self.memory_bytes()
        metrics["mem_params_bytes"] = sum(v for k, v in memory.items() if k.startswith("params_"))
        metrics["mem_optimizer_bytes"] = memory["optimizer"]
        metrics["mem_peak_bytes"] = peak_memory_bytes(self.device)
        # What the update added on top of what was already held: activations kept for backward, gradients,
        # optimiser scratch. Measured by CUDA's allocator; the CPU has no such counter (NaN).
        metrics["mem_update_peak_bytes"] = (peak_memory_bytes(self.device) - held_before_update
                                            if self.device.type == "cuda" else float("nan"))
        self.algorithm.after_step(metrics)
        metrics["kl_coef"] = self.algorithm.kl_coefficient  # after the hook: an adaptive weight has moved
        distributions = None
        if c.keep_distributions:
            distributions = StepDistributions(
                step=step, advantages=advantages.float().cpu(), rewards=rollout.rewards.float().cpu(),
                num_generations=rollout.num_generations,
                token_ratios=torch.cat(stats.token_ratios) if stats.token_ratios else torch.empty(0),
                sequence_ratios=torch.cat(stats.sequence_ratios) if stats.sequence_ratios else torch.empty(0),
            )
        return metrics, distributions
