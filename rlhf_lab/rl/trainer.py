"""One training loop for every algorithm.

    for each step:
        rollout   sample prompts, G completions each with the lab's cached `generate`; score them
        no-grad   log pi_ref (KL), log pi_old (when minibatches go off-policy), critic values (PPO)
        advantages   algorithm.compute_advantages(rollout)
        update    num_iterations passes x num_minibatches shuffled minibatches of algorithm.loss
        metrics   one row of `history`; distributions for the live plots; callbacks

Faults: each step is atomic. A non-finite loss or gradient, or a KeyboardInterrupt (Stop in
Jupyter), restores the weights and optimiser state from before the step, keeps every completed
row of `history`, and returns; call `train()` again to continue.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from ..device import autocast, pick_device
from ..evaluate import completion_budget, greedy_accuracy
from ..sampling import SamplingConfig, generate
from ..tasks import get_task
from .advantages import overlong_soft_penalty
from .algorithm import Algorithm
from .config import RLConfig
from .metrics import (
    METRIC_COLUMNS,
    UpdateStats,
    kl_metrics,
    model_bytes,
    optimizer_bytes,
    peak_memory_bytes,
    reward_stats,
)
from .rollout import Rollout, policy_forward


class NonFiniteLossError(FloatingPointError):
    """The loss or the gradient of a step was NaN or infinite."""


@dataclass
class StepDistributions:
    """What the live plots show for one step (CPU tensors)."""

    step: int
    advantages: torch.Tensor  # (N,) one value per completion (first token's advantage)
    rewards: torch.Tensor  # (N,)
    num_generations: int
    token_ratios: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # every token's ratio, all passes
    sequence_ratios: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # (n,) per completion, all passes


class Callback:
    """Subclass and override what you need; `Trainer(callbacks=[...])` or `trainer.add_callback`."""

    def on_train_begin(self, trainer: Trainer) -> None: ...

    def on_step_end(self, trainer: Trainer, metrics: dict, distributions: StepDistributions | None) -> None: ...

    def on_train_end(self, trainer: Trainer) -> None: ...


class Trainer:
    """Train `model` (default: the shipped RL starting checkpoint) with `config.algo`."""

    def __init__(self, config: RLConfig, model=None, tokenizer=None, callbacks=(), algorithm: Algorithm | None = None):
        from . import ALGORITHMS

        self.config = config
        self.algorithm = algorithm or ALGORITHMS[config.algo](config)
        self.device = pick_device(config.device)
        torch.manual_seed(config.seed)
        if model is None:
            from ..presets import load_checkpoint

            model, tokenizer, _ = load_checkpoint(config.init_checkpoint)
        if tokenizer is None:
            raise ValueError("tokenizer is required when a model is passed")
        self.tokenizer = tokenizer
        self.policy = model.to(self.device)
        self.ref_model = copy.deepcopy(self.policy).eval().requires_grad_(False)
        self.critic = None
        if self.algorithm.uses_critic:
            if getattr(config, "critic", "head") == "separate":
                self.critic = copy.deepcopy(self.policy)
                self.critic.add_value_head()
            else:
                self.policy.add_value_head()
        params = list(self.policy.parameters()) + (list(self.critic.parameters()) if self.critic else [])
        self.optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay,
                                           betas=(0.9, 0.99))
        self.task = get_task(config.task, **config.task_params)
        self.reward_fn = self.task.reward_fn(config.reward_weights)  # validates the weights' names
        self.train_examples, test = self.task.make_split(0, config.n_train, config.n_test)  # data seed fixed
        self.eval_examples = test[: config.eval_examples]
        self.max_completion_length = config.max_completion_length or completion_budget(self.train_examples)
        self.algorithm.max_completion_length = self.max_completion_length
        self.sampling = SamplingConfig(do_sample=True, temperature=config.temperature,
                                       max_new_tokens=self.max_completion_length, return_logprobs=True)
        self.sample_generator = torch.Generator(self.device).manual_seed(config.seed)
        self.data_generator = torch.Generator().manual_seed(config.seed)
        self.callbacks = list(callbacks)
        self.rows: list[dict] = []
        self.distributions: list[StepDistributions] = []
        self.step = 0
        self.train_time = 0.0  # seconds spent in training steps (evaluation excluded)
        self.stop_reason: str | None = None

    # ------------------------------------------------------------------------------------------
    # Public API

    @property
    def history(self) -> pd.DataFrame:
        frame = pd.DataFrame(self.rows)
        ordered = [c for c in METRIC_COLUMNS if c in frame.columns]
        return frame[ordered + [c for c in frame.columns if c not in ordered]]

    def add_callback(self, callback) -> None:
        self.callbacks.append(callback)

    def evaluate(self, examples=None) -> float:
        """Held-out greedy exact-match accuracy."""
        return greedy_accuracy(self.policy, self.tokenizer, self.task, examples or self.eval_examples,
                               max_new_tokens=self.max_completion_length)

    def train(self, steps: int | None = None, time_budget: float | None = None) -> pd.DataFrame:
        """Run `steps` more steps (default config.steps) or until `time_budget` seconds of training.

        Returns the history. Stops early, cleanly, on KeyboardInterrupt or a non-finite loss
        (`self.stop_reason` says which); the model is then as it was after the last good step.
        """
        c = self.config
        steps = c.steps if steps is None else steps
        time_budget = c.time_budget if time_budget is None else time_budget
        budget_end = None if time_budget is None else self.train_time + time_budget
        last_step = self.step + steps
        self.stop_reason = None
        self._call("on_train_begin")
        try:
            if not self.rows:  # step 0: where we start from
                self.rows.append({"step": 0, "wall_time": 0.0, "eval_accuracy": self.evaluate()})
            while self.step < last_step and (budget_end is None or self.train_time < budget_end):
                metrics, distributions = self._train_step()
                self.rows.append(metrics)
                if distributions is not None:
                    self.distributions.append(distributions)
                out_of_time = budget_end is not None and self.train_time >= budget_end
                if c.eval_every and (self.step % c.eval_every == 0 or self.step == last_step or out_of_time):
                    metrics["eval_accuracy"] = self.evaluate()
                self._call("on_step_end", metrics, distributions)
            self.stop_reason = self.stop_reason or ("time_budget" if self.step < last_step else "steps")
        except KeyboardInterrupt:
            self.stop_reason = "interrupted"
            print(f"Training interrupted after step {self.step}; model and history are intact "
                  f"({len(self.rows)} rows). Call train() again to continue.")
        except NonFiniteLossError as exc:
            self.stop_reason = "non_finite"
            warnings.warn(str(exc), RuntimeWarning, stacklevel=2)
        finally:
            self._call("on_train_end")
        return self.history

    def save(self, folder: str | Path) -> Path:
        """The policy as a Hugging Face folder (atomic) plus history.csv beside it."""
        from ..model import save_pretrained

        last_eval = self.history["eval_accuracy"].dropna()
        meta = {"algo": self.config.algo, "step": self.step,
                "eval_accuracy": float(last_eval.iloc[-1]) if len(last_eval) else None}
        folder = save_pretrained(self.policy, folder, tokenizer=self.tokenizer, metadata=meta)
        self.history.to_csv(folder / "history.csv", index=False)
        return folder

    def memory_bytes(self) -> dict:
        """Parameter and optimiser-state bytes of every model this trainer holds."""
        models = {"policy": self.policy, "reference": self.ref_model}
        if self.critic is not None:
            models["critic"] = self.critic
        out = {f"params_{name}": model_bytes(m) for name, m in models.items()}
        out["optimizer"] = optimizer_bytes(self.optimizer)
        return out

    # ------------------------------------------------------------------------------------------
    # One step

    def _call(self, event: str, *args) -> None:
        for callback in self.callbacks:
            method = getattr(callback, event, None)
            if method is not None:
                method(self, *args)

    def _snapshot(self):
        clone = lambda sd: {k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in sd.items()}  # noqa: E731
        return (clone(self.policy.state_dict()), clone(self.critic.state_dict()) if self.critic else None,
                copy.deepcopy(self.optimizer.state_dict()), copy.deepcopy(getattr(self.algorithm, "kl_controller", None)),
                self.sample_generator.get_state(), self.data_generator.get_state())

    def _restore(self, snapshot) -> None:
        policy, critic, optimizer, kl_controller, sample_state, data_state = snapshot
        self.policy.load_state_dict(policy)
        if self.critic is not None:
            self.critic.load_state_dict(critic)
        self.optimizer.load_state_dict(optimizer)
        if kl_controller is not None:
            self.algorithm.kl_controller = kl_controller
        self.sample_generator.set_state(sample_state)
        self.data_generator.set_state(data_state)

    def _train_step(self) -> tuple[dict, StepDistributions | None]:
        snapshot = self._snapshot()
        try:
            return self._unsafe_train_step()
        except BaseException:
            self._restore(snapshot)  # a half-done step never leaks into the model
            raise

    def _unsafe_train_step(self):
        c = self.config
        step = self.step + 1
        for group in self.optimizer.param_groups:
            group["lr"] = c.learning_rate * min(1.0, step / c.warmup_steps) if c.warmup_steps else c.learning_rate
        t0 = time.perf_counter()
        rollout = self._collect_rollout()
        t1 = time.perf_counter()
        self.algorithm.compute_advantages(rollout)
        if not torch.isfinite(rollout.advantages).all():
            bad = int((~torch.isfinite(rollout.rewards)).sum())
            raise NonFiniteLossError(
                f"non-finite advantages at step {step} ({bad} non-finite reward(s)); training stopped and the "
                f"weights were kept from step {self.step}"
            )
        stats, extra = self._update(rollout, step)
        t2 = time.perf_counter()

        self.step = step
        self.train_time += t2 - t0
        m = rollout.completion_mask
        lengths = rollout.lengths
        advantages = rollout.advantages[:, 0] if rollout.advantages.shape[1] else torch.zeros(len(rollout))
        metrics = {
            "step": step, "wall_time": self.train_time, "step_time": t2 - t0, "rollout_time": t1 - t0,
            "update_time": t2 - t1,
            **reward_stats(rollout.rewards, c.num_generations),
            "accuracy": rollout.correct.float().mean().item(),
            "eval_accuracy": float("nan"),
            **extra,
            **stats.metrics(),
            "adv_mean": rollout.advantages[m.bool()].mean().item() if m.any() else float("nan"),
            "adv_std": rollout.advantages[m.bool()].std().item() if m.sum() > 1 else float("nan"),
            "completion_len_mean": lengths.float().mean().item(),
            "completion_len_max": lengths.max().item(),
            "truncation_rate": rollout.truncated.float().mean().item(),
            "lr": self.optimizer.param_groups[0]["lr"],
            "tokens_per_s": lengths.sum().item() / max(t2 - t0, 1e-9),
            "num_rollout_rows": len(rollout),
            "kl_coef": getattr(c, "kl_coef", c.beta),
        }
        memory = self.memory_bytes()
        metrics["mem_params_bytes"] = sum(v for k, v in memory.items() if k.startswith("params_"))
        metrics["mem_optimizer_bytes"] = memory["optimizer"]
        metrics["mem_peak_bytes"] = peak_memory_bytes(self.device)
        self.algorithm.after_step(metrics)
        distributions = None
        if c.keep_distributions:
            distributions = StepDistributions(
                step=step, advantages=advantages.float().cpu(), rewards=rollout.rewards.float().cpu(),
                num_generations=c.num_generations,
                token_ratios=torch.cat(stats.token_ratios) if stats.token_ratios else torch.empty(0),
                sequence_ratios=torch.cat(stats.sequence_ratios) if stats.sequence_ratios else torch.empty(0),
            )
        return metrics, distributions

    @torch.no_grad()
    def _sample(self, examples, num_generations: int, config: SamplingConfig) -> Rollout:
        prompts = [self.tokenizer.encode(e.prompt, add_bos=True) for e in examples]
        with autocast(self.device):
            out = generate(self.policy, prompts, config, num_return_sequences=num_generations,
                           generator=self.sample_generator)
        rewards, correct = [], []
        for row, ids in enumerate(out.completion_ids.tolist()):
            example = examples[row // num_generations]
            text, finished = self.tokenizer.decode_until_eos(ids)
            rewards.append(self.reward_fn(example.prompt, text, example.answer, finished))
            correct.append(self.task.score(example.prompt, text, example.answer, finished))
        mask = out.completion_mask.float()
        return Rollout(
            input_ids=out.sequences, attention_mask=out.attention_mask, prompt_width=out.prompt_ids.shape[1],
            completion_ids=out.completion_ids, completion_mask=mask,
            rewards=torch.tensor(rewards, dtype=torch.float32, device=self.device),
            correct=torch.tensor(correct, dtype=torch.float32, device=self.device),
            finished=out.finished, num_generations=num_generations,
        )

    def _draw_prompts(self, count: int):
        index = torch.randint(len(self.train_examples), (count,), generator=self.data_generator)
        return [self.train_examples[i] for i in index.tolist()]

    @torch.no_grad()
    def _collect_rollout(self) -> Rollout:
        c, G = self.config, self.config.num_generations
        self.policy.eval()
        examples = self._draw_prompts(c.prompts_per_step)
        rollout = self._sample(examples, G, self.sampling)
        if getattr(c, "dynamic_sampling", False):  # DAPO: keep only groups whose rewards differ
            parts, kept_examples = [], []
            for round_ in range(c.max_resample_rounds + 1):
                if round_:
                    examples = self._draw_prompts(c.prompts_per_step)
                    rollout = self._sample(examples, G, self.sampling)
                informative = rollout.rewards.view(-1, G).std(1) > 0
                rows = informative.repeat_interleave(G).nonzero().squeeze(1)
                parts.append(rollout.select(rows))
                kept_examples += [e for e, keep in zip(examples, informative.tolist()) if keep]
                if len(kept_examples) >= c.prompts_per_step:
                    break
            if kept_examples:
                rollout = Rollout.concat(parts)
                keep = min(len(kept_examples), c.prompts_per_step) * G
                rollout = rollout.select(torch.arange(keep, device=self.device))
                examples = kept_examples[: keep // G]
        if getattr(c, "overlong_buffer", 0):
            rollout.rewards = rollout.rewards + overlong_soft_penalty(
                rollout.lengths, self.max_completion_length, c.overlong_buffer)
        if self.algorithm.uses_greedy_baseline:  # ReMax: score one greedy answer per prompt
            greedy = SamplingConfig(do_sample=False, max_new_tokens=self.max_completion_length)
            rollout.greedy_rewards = self._sample(examples, 1, greedy).rewards
        T = c.temperature
        with autocast(self.device):
            rollout.ref_logprobs = policy_forward(self.ref_model, rollout, T).logprobs
            if not c.on_policy or self.algorithm.uses_critic:
                rollout.old_logprobs = policy_forward(self.policy, rollout, T).logprobs
            if self.algorithm.uses_critic:
                critic = self.critic or self.policy
                rollout.old_values = policy_forward(critic, rollout, T, with_values=True).values
        if getattr(c, "mask_truncated_completions", False):
            rollout.completion_mask = rollout.completion_mask * rollout.finished[:, None].float()
        self.policy.train()
        return rollout

    def _update(self, rollout: Rollout, step: int) -> tuple[UpdateStats, dict]:
        c = self.config
        stats = UpdateStats()
        extra: dict = {}
        N = len(rollout)
        size = N // c.num_minibatches
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        entropies, kls, explained = [], [], []
        for iteration in range(c.num_iterations):
            order = torch.randperm(N, generator=self.data_generator).to(self.device)
            for k in range(c.num_minibatches):
                minibatch = rollout.select(order[k * size : (k + 1) * size])
                first_pass = iteration == 0
                with autocast(self.device):
                    policy = policy_forward(self.policy, minibatch, c.temperature, with_entropy=first_pass,
                                            with_values=self.algorithm.uses_critic and self.critic is None)
                    if self.critic is not None:
                        policy.values = policy_forward(self.critic, minibatch, c.temperature, with_values=True).values
                if minibatch.old_logprobs is None:  # on-policy: old = new.detach(), the ratio is exactly 1
                    minibatch.old_logprobs = policy.logprobs.detach()
                loss, info = self.algorithm.loss(minibatch, policy)
                if not torch.isfinite(loss):
                    raise NonFiniteLossError(
                        f"non-finite loss ({loss.item()}) at step {step}; training stopped and the weights were "
                        f"kept from step {step - 1}"
                    )
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm))
                if not math.isfinite(grad_norm):
                    raise NonFiniteLossError(
                        f"non-finite gradient norm at step {step}; training stopped and the weights were kept "
                        f"from step {step - 1}"
                    )
                self.optimizer.step()
                mask = minibatch.completion_mask
                stats.add(info, mask, grad_norm, keep=c.keep_distributions)
                if first_pass:
                    entropies.append((policy.entropy * mask).sum().item() / max(mask.sum().item(), 1))
                    kls.append(kl_metrics(minibatch.old_logprobs, minibatch.ref_logprobs, mask))
                    if minibatch.returns is not None and policy.values is not None:
                        from .losses import explained_variance

                        explained.append(float(explained_variance(policy.values.detach(), minibatch.returns, mask)))
        extra["entropy"] = sum(entropies) / len(entropies)
        extra["kl_k1"] = sum(k["kl_k1"] for k in kls) / len(kls)
        extra["kl_k3"] = sum(k["kl_k3"] for k in kls) / len(kls)
        extra["explained_variance"] = sum(explained) / len(explained) if explained else float("nan")
        return stats, extra
