"""Supervised fine-tuning: next-token cross-entropy on the completion only.

    input   <bos> 4 7 + 8 5 = 2 3 1 <eos>
    loss              . . . . . x x x x      (prompt positions are masked out)

    trainer = SFTTrainer(config, tokenizer, callbacks=[LiveDashboard()])   # the task's reference answers
    trainer = SFTTrainer(config, tokenizer, model=student, train_examples=teacher_examples)  # distillation
    history = trainer.train(time_budget=60)       # call again to continue: same optimizer, same step count

AdamW with linear warm-up then cosine decay (`schedule.learning_rate_at`), gradient clipping, greedy
accuracy on the held-out split every `eval_every` steps, and a pandas history. Deterministic for a
seed on CPU. Each step is atomic: Stop / KeyboardInterrupt or a non-finite loss leaves the model and
the optimizer as they were after the last completed step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from .model import LlamaModel, ModelConfig, moe_aux_loss
from .tasks import get_task, task_names
from .tasks.jsonl import SPLIT_N_TRAIN
from .train.callbacks import NonFiniteLossError, ProgressBar
from .train.evaluate import greedy_accuracy
from .train.loop import SupervisedLoop, backward_and_step
from .train.run_state import Checkpointer, has_state, remaining
from .util.device import autocast, check_device, pick_device
from .util.limits import check_memory, check_sequence_length, check_tokenizer_fits, training_bytes
from .util.validation import Validated, setting

# The lab model's size: the shipped checkpoints' (data/checkpoints/README.md says why this size).
MODEL_SIZE: dict = dict(
    hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    initializer_range=0.06,
)
# The MoE variant (data/checkpoints/README.md, "MoE model"): Qwen3-MoE style (the family of GSPO's
# Qwen3-30B-A3B: q/k norm, renormalised top-k weights), 8 SwiGLU experts of width 88 per layer, top-2,
# so each token's active MLP (2 x 88) has the dense model's width 176. The rest is MODEL_SIZE.
MOE_MODEL_SIZE: dict = dict(
    MODEL_SIZE, model_type="qwen3_moe", num_local_experts=8, num_experts_per_tok=2, moe_intermediate_size=88,
    norm_topk_prob=True,
)


def lab_model_config(tokenizer, **overrides) -> ModelConfig:
    """The lab's standard tiny model for a tokenizer: 2 layers, hidden 64, GQA 4 query / 2 kv heads of
    dim 16, SwiGLU width 176: ~96k parameters, the smallest size that learns 3-digit addition to ~100%
    (data/checkpoints/README.md compares sizes).

    initializer_range 0.06 instead of Llama's 0.02: at width 64, std 0.02 makes q.k ~ 0, so attention
    starts uniform and its gradients, which scale with the other projection's weights, are tiny: SFT
    stalls.
    """
    base = dict(
        vocab_size=len(tokenizer),
        **MODEL_SIZE,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    base.update(overrides)
    return ModelConfig(**base)


@dataclass
class SFTConfig(Validated):
    """Settings of one SFT run (the fields are what `python -m rlhf_lab sft` exposes); each field
    declares what it accepts (rlhf_lab.util.validation), checked at construction and on assignment."""

    task: str = setting("addition", choices=task_names, help="the task whose reference answers are imitated")
    task_params: dict = setting(default_factory=lambda: {"digits": 3}, help="the task's parameters")
    n_train: int = setting(SPLIT_N_TRAIN, ge=1, help="training split (the one the checkpoints and RL use)")
    n_test: int = setting(500, ge=1, help="held-out split")
    steps: int = setting(2000, ge=0, help="optimiser steps; also the length of the cosine decay")
    batch_size: int = setting(64, ge=1, help="examples per step")
    learning_rate: float = setting(3e-3, gt=0, le=1, help="peak AdamW learning rate")
    warmup_steps: int = setting(100, ge=0, help="linear warm-up steps")
    weight_decay: float = setting(0.01, ge=0, help="AdamW's, on weight matrices only")
    max_grad_norm: float = setting(1.0, gt=0, help="gradient clipping norm")
    eval_every: int = setting(200, ge=0, help="steps between held-out evaluations; 0: never evaluate")
    eval_examples: int = setting(500, ge=1, help="held-out problems per evaluation (<= n_test)")
    stop_at_accuracy: float | None = setting(None, gt=0, le=1, help="stop at the first evaluation this good")
    time_budget: float | None = setting(None, gt=0, help="seconds of training (evaluation excluded)")
    seed: int = setting(0, ge=0, help="initialisation and batch order")
    data_seed: int = setting(0, ge=0, help="the train/test split; 0 holds out the test set every run uses")
    device: str = setting("cpu", check=check_device, help="cpu, cuda, cuda:N, mps or auto")

    def check(self) -> None:
        if self.eval_examples > self.n_test:
            raise ValueError(
                f"eval_examples ({self.eval_examples}) must be <= n_test ({self.n_test}): evaluation "
                "draws its problems from the test split"
            )
        get_task(self.task, **self.task_params)  # validates the task's own parameters


def encode_examples(tokenizer, examples: Sequence, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids (N, L), loss_mask (N, L)); loss_mask marks completion tokens and EOS,
    aligned with the TARGET position (the token being predicted)."""
    rows, masks = [], []
    for example in examples:
        prompt = tokenizer.encode(example.prompt, add_bos=True)
        completion = tokenizer.encode(example.completion, add_eos=True)
        rows.append(prompt + completion)
        masks.append([0] * len(prompt) + [1] * len(completion))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, : len(r)] = torch.tensor(r)
        loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids.to(device), loss_mask.to(device)


def completion_loss(model, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over completion tokens. Right padding needs no attention mask: padding
    only ever follows the real tokens, which the causal mask already hides it from.

    An MoE model adds its router losses (`rlhf_lab.model.moe_aux_loss`: the load-balancing loss and the
    optional z-loss, times their coefficients), counted over the non-padding tokens."""
    inputs = input_ids[:, :-1]
    out = model(inputs)
    logits = out.logits  # (N, L-1, V) float32
    targets, mask = input_ids[:, 1:], loss_mask[:, 1:]
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    loss = (nll * mask.reshape(-1)).sum() / mask.sum().clamp(min=1)
    if out.router_logits is not None:
        real = inputs != model.config.pad_token_id  # (N, L-1): right padding is the only pad token
        loss = loss + moe_aux_loss(model.config, out.router_logits, real)
    return loss


HISTORY_COLUMNS = (
    "step",
    "wall_time",
    "step_time",
    "loss",
    "eval_accuracy",
    "lr",
    "grad_norm",
    "tokens_per_s",
)


class SFTTrainer(SupervisedLoop):
    """SFT of `model` (default: a fresh `lab_model_config` model) on `train_examples`.

    Args:
        config: the run's settings; `config.task` also scores the held-out evaluation.
        tokenizer: the lab tokenizer (`rlhf_lab.text.tokenizer.default_tokenizer()`).
        model: the model to fine-tune (moved to `config.device`); None builds a fresh one seeded by
        config.seed.
        train_examples: `Example`s to imitate (prompt, answer, completion); default the task's training split.
            Pass a teacher's answers as completions to distil it.
        eval_examples: held-out `Example`s for `evaluate`; default the first `config.eval_examples` of the
            task's test split (the one the RL trainer evaluates on).
        callbacks: `rlhf_lab.train.callbacks.Callback`s (LiveDashboard, ProgressBar, ...).

    After `train()`: `history` (one row per step, row 0 = the model before training), `step`,
    `train_time` (seconds in training steps, evaluation excluded) and `stop_reason`
    ("steps" | "time_budget" | "stop_at_accuracy" | "interrupted" | "non_finite").
    """

    dashboard_kind = "sft"  # LiveDashboard draws its SFT panels for this trainer
    history_columns = HISTORY_COLUMNS

    def __init__(self, config: SFTConfig, tokenizer, model: LlamaModel | None = None,
                 train_examples: Sequence | None = None, eval_examples: Sequence | None = None,
                 callbacks=()) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.device = pick_device(config.device)
        torch.manual_seed(config.seed)
        self.task = get_task(config.task, **config.task_params)
        if train_examples is None or eval_examples is None:
            train, test = self.task.make_split(config.data_seed, config.n_train, config.n_test)
        self.train_examples = list(train if train_examples is None else train_examples)
        self.eval_examples = list(test[: config.eval_examples] if eval_examples is None else eval_examples)
        if not self.train_examples:
            raise ValueError("train_examples must hold at least one Example, got none")
        if not self.eval_examples:
            raise ValueError("eval_examples must hold at least one Example, got none")
        self.task.check_tokenizer(tokenizer, "a model with its own BPE tokenizer (a Hugging Face folder)")
        if model is None:
            model = LlamaModel(lab_model_config(tokenizer))
        self.model = model.to(self.device).train()
        check_tokenizer_fits(tokenizer, self.model.config)
        # Every example encoded once, right-padded: (N, L) token ids and the completion mask.
        self.input_ids, self.loss_mask = encode_examples(tokenizer, self.train_examples, self.device)
        check_sequence_length(self.model.config, self.input_ids.shape[1], "the longest training example")
        self.check_batch_fits()
        self.start(callbacks)

    # ------------------------------------------------------------------------------------------
    # Public API

    def evaluate(self, examples: Sequence | None = None) -> float:
        """Greedy exact-match accuracy on `examples` (default `eval_examples`), scored by config.task."""
        examples = self.eval_examples if examples is None else examples
        return greedy_accuracy(self.model, self.tokenizer, self.task, examples)

    def check_batch_fits(self) -> None:
        """Refuse a batch_size whose step cannot fit in memory, before anything is allocated (also
        when config.batch_size was raised after construction)."""
        rows, length = self.config.batch_size, self.input_ids.shape[1]
        check_memory(training_bytes(self.model.config, rows, length), self.device,
                     f"an SFT step of {rows} examples", "batch_size")

    def before_train(self) -> None:
        self.check_batch_fits()
        self.model.train()

    def after_train(self) -> None:
        self.model.eval()

    def start_row(self) -> dict:
        # eval_every = 0 means no evaluation at all (a pure speed or loss run)
        return {"step": 0, "wall_time": 0.0,
                "eval_accuracy": self.evaluate() if self.config.eval_every else math.nan}

    def early_stop(self, metrics: dict) -> str | None:
        target = self.config.stop_at_accuracy
        return "stop_at_accuracy" if target is not None and metrics["eval_accuracy"] >= target else None

    # ------------------------------------------------------------------------------------------
    # One step

    def _step(self) -> dict:
        """One optimiser step on a random batch of the training examples; returns its row."""
        c = self.config
        step = self.step + 1
        self.set_learning_rate(step)
        t0 = time.perf_counter()
        batch = torch.randint(0, len(self.input_ids), (c.batch_size,), generator=self.batch_generator)
        batch = batch.to(self.device)
        batch_ids, batch_mask = self.input_ids[batch], self.loss_mask[batch]
        width = int(batch_mask.nonzero()[:, 1].max()) + 1  # trim the shared right padding
        with autocast(self.device):
            loss = completion_loss(self.model, batch_ids[:, :width], batch_mask[:, :width])
        grad_norm = backward_and_step(loss, self.optimizer, self.model.parameters(), c.max_grad_norm, step,
                                      "SFT")
        step_time = time.perf_counter() - t0
        self.step = step
        self.train_time += step_time
        # completion tokens + EOS: what the loss trains
        supervised_tokens = float(batch_mask[:, 1:width].sum())
        return {"step": step, "wall_time": self.train_time, "step_time": step_time, "loss": loss.item(),
                "eval_accuracy": math.nan, "lr": self.optimizer.param_groups[0]["lr"], "grad_norm": grad_norm,
                "tokens_per_s": supervised_tokens / max(step_time, 1e-9)}


def train_sft(config: SFTConfig, tokenizer, model: LlamaModel | None = None, callbacks=(),
              progress: bool = True, state_dir=None, save_every: int = 10,
              resume_hint: str | None = None) -> tuple[LlamaModel, pd.DataFrame]:
    """Train (or continue training) `model` on `config.task`'s training split. Returns (model, history).

    The script-style front of `SFTTrainer` (presets and the CLI use it); `history` is the trainer's.
    A KeyboardInterrupt is re-raised after the trainer stopped cleanly, and a non-finite loss raises
    NonFiniteLossError, so a script never saves a half-trained model as if it were done.

    state_dir: a folder for the resumable state (`rlhf_lab.train.run_state`): the run continues from the
        state saved there, if any, to `config.steps` in all, and saves it every `save_every` steps
        (0: only at the end) and at any stop. None: no state, `config.steps` steps from here.
    resume_hint: what the interrupt message tells the user to do next (the CLI's `--resume` command).
    """
    callbacks = list(callbacks) + ([ProgressBar()] if progress else [])
    trainer = SFTTrainer(config, tokenizer, model=model, callbacks=callbacks)
    if resume_hint is not None:
        trainer.resume_hint = resume_hint
    steps = time_budget = None  # config.steps, config.time_budget
    if state_dir is not None:
        if has_state(state_dir):
            trainer.resume(state_dir)
        trainer.add_callback(Checkpointer(state_dir, every=save_every))
        steps, time_budget = remaining(trainer)
    history = trainer.train(steps=steps, time_budget=time_budget)
    if trainer.stop_reason == "interrupted":
        raise KeyboardInterrupt
    if trainer.stop_reason == "non_finite":
        raise NonFiniteLossError(f"SFT loss became non-finite at step {trainer.step + 1}; lower "
                                 "learning_rate")
    history.attrs["config"] = asdict(config)
    return trainer.model, history
