"""Held-out evaluation shared by SFT, RL and the notebooks: greedy decoding, exact-match accuracy."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..sampling import SamplingConfig, generate


def completion_budget(examples: Sequence, slack: int = 2) -> int:
    """max_new_tokens for a set of examples: the longest reference completion, + EOS, + slack."""
    return max(len(e.completion) for e in examples) + 1 + slack


def standard_error(accuracy: float, n: int) -> float:
    """Standard error of an accuracy measured on n independent problems: sqrt(p (1 - p) / n).

    Two accuracies on the same n problems that differ by less than ~2 of these are within noise."""
    return math.sqrt(accuracy * (1 - accuracy) / n)


def encode_prompts(tokenizer, prompts: Sequence[str]) -> list[list[int]]:
    return [tokenizer.encode(p, add_bos=True) for p in prompts]


@torch.no_grad()
def greedy_accuracy(
    model,
    tokenizer,
    task,
    examples: Sequence,
    batch_size: int = 512,
    max_new_tokens: int | None = None,
    return_completions: bool = False,
):
    """Fraction of `examples` whose greedy completion is exactly right (`task.score`).

    Returns the accuracy, or (accuracy, completions) with return_completions=True.
    """
    if len(examples) == 0:
        raise ValueError("examples must hold at least one Example to evaluate on, got none")
    was_training = model.training
    model.eval()
    config = SamplingConfig(do_sample=False, max_new_tokens=max_new_tokens or completion_budget(examples))
    correct, completions = 0.0, []
    try:
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            out = generate(model, encode_prompts(tokenizer, [e.prompt for e in chunk]), config)
            for example, row in zip(chunk, out.completion_ids.tolist()):
                text, finished = tokenizer.decode_until_eos(row)
                correct += task.score(example.prompt, text, example.answer, finished)
                completions.append(text)
    finally:
        model.train(was_training)
    accuracy = correct / len(examples)
    return (accuracy, completions) if return_completions else accuracy
