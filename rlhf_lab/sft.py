"""Supervised fine-tuning: next-token cross-entropy on the completion only.

    input   <bos> 4 7 + 8 5 = 2 3 1 <eos>
    loss              . . . . . x x x x      (prompt positions are masked out)

AdamW with linear warm-up then cosine decay, gradient clipping, greedy accuracy on the held-out
split every `eval_every` steps, and a pandas history. Deterministic for a seed on CPU.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .device import autocast, pick_device
from .evaluate import greedy_accuracy
from .model import LlamaModel, ModelConfig
from .tasks import TASKS, get_task


def lab_model_config(tokenizer, **overrides) -> ModelConfig:
    """The lab's standard tiny model for a tokenizer: 2 layers, hidden 64, GQA 4 query / 2 kv heads of
    dim 16, SwiGLU width 176: ~96k parameters, the smallest size tried, and enough for ~100% on 3-digit
    addition (data/checkpoints/README.md compares sizes).

    initializer_range 0.06 instead of Llama's 0.02: at width 64, std 0.02 makes q.k ~ 0, attention
    starts uniform and gets tiny gradients (they scale with the other projection's weights): SFT was
    still at ~10% accuracy after 1500 steps, where with 0.06 three seeds out of four passed 50% within
    400-800 steps.
    """
    base = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=176, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.06,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    base.update(overrides)
    return ModelConfig(**base)


@dataclass
class SFTConfig:
    """Settings of one SFT run (the fields are what `python -m rlhf_lab sft` exposes)."""

    task: str = "addition"
    task_params: dict = field(default_factory=lambda: {"digits": 3})
    n_train: int = 20000
    n_test: int = 500
    steps: int = 2000
    batch_size: int = 64
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    eval_every: int = 200
    eval_examples: int = 500
    stop_at_accuracy: float | None = None  # stop at the first evaluation reaching this accuracy
    seed: int = 0  # initialisation and batch order
    data_seed: int = 0  # the train/test split; fixed at 0 so every run (SFT or RL) holds out the same test set
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {sorted(TASKS)}, got {self.task!r}")
        for name in ("n_train", "n_test", "batch_size", "eval_examples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("steps", "warmup_steps", "eval_every", "seed", "data_seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm!r}")
        if self.stop_at_accuracy is not None and not 0 < self.stop_at_accuracy <= 1:
            raise ValueError(f"stop_at_accuracy must be in (0, 1] or None, got {self.stop_at_accuracy!r}")
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
    only ever follows the real tokens, which the causal mask already hides it from."""
    logits = model(input_ids[:, :-1]).logits  # (N, L-1, V) float32
    targets, mask = input_ids[:, 1:], loss_mask[:, 1:]
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return (nll * mask.reshape(-1)).sum() / mask.sum().clamp(min=1)


def lr_at(step: int, config: SFTConfig) -> float:
    """Linear warm-up to learning_rate, then cosine decay to 10% of it at `steps`."""
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train_sft(
    config: SFTConfig,
    tokenizer,
    model: LlamaModel | None = None,
    callback: Callable[[dict], None] | None = None,
    progress: bool = True,
) -> tuple[LlamaModel, pd.DataFrame]:
    """Train (or continue training) `model` on `config.task`. Returns (model, history).

    history has one row per step: step, loss, lr, grad_norm, wall_time, and `accuracy` (held-out
    greedy exact match) on evaluation steps (NaN elsewhere). `callback(row)` is called per step.
    """
    device = pick_device(config.device)
    torch.manual_seed(config.seed)
    task = get_task(config.task, **config.task_params)
    train, test = task.make_split(config.data_seed, config.n_train, config.n_test)
    eval_set = test[: config.eval_examples]
    if model is None:
        model = LlamaModel(lab_model_config(tokenizer))
    model.to(device).train()
    ids, loss_mask = encode_examples(tokenizer, train, device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.learning_rate, betas=(0.9, 0.98),
    )
    generator = torch.Generator().manual_seed(config.seed)
    rows, start = [], time.perf_counter()
    bar = tqdm(range(config.steps), desc=f"sft {config.task}", disable=not progress, leave=False)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        batch = torch.randint(0, len(train), (config.batch_size,), generator=generator).to(device)
        batch_ids, batch_mask = ids[batch], loss_mask[batch]
        width = int(batch_mask.nonzero()[:, 1].max()) + 1  # trim the shared right padding
        with autocast(device):
            loss = completion_loss(model, batch_ids[:, :width], batch_mask[:, :width])
        if not torch.isfinite(loss):
            raise FloatingPointError(f"SFT loss became {loss.item()} at step {step}; lower learning_rate")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        row = {"step": step + 1, "loss": loss.item(), "lr": optimizer.param_groups[0]["lr"],
               "grad_norm": float(grad_norm), "wall_time": time.perf_counter() - start, "accuracy": float("nan")}
        last = step + 1 == config.steps
        if config.eval_every and ((step + 1) % config.eval_every == 0 or last):
            row["accuracy"] = greedy_accuracy(model, tokenizer, task, eval_set)
            bar.set_postfix(loss=f"{row['loss']:.3f}", acc=f"{row['accuracy']:.2f}")
        rows.append(row)
        if callback is not None:
            callback(row)
        if config.stop_at_accuracy is not None and row["accuracy"] >= config.stop_at_accuracy:
            break
    model.eval()
    history = pd.DataFrame(rows)
    history.attrs["config"] = asdict(config)
    return model, history
