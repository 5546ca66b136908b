"""The learning-rate schedule of every trainer in the package (SFT and RL).

    lr
    |      ______________________  constant
    |     /  ``--..__
    |    /           ``--..___      cosine, down to min_fraction * lr at total_steps
    |   /                     ``--
    +--+-------------------------+---> step
       warmup_steps              total_steps

Linear warm-up (Goyal et al. 2017, "Accurate, large minibatch SGD") keeps AdamW's first updates
small while its second-moment estimates are still noise; cosine decay (Loshchilov & Hutter 2017,
SGDR) lowers the rate smoothly so the last steps refine instead of jumping around.
"""

from __future__ import annotations

import math

from ..util.validation import check_choice, check_number, check_optional

SCHEDULES = ("constant", "cosine")


def learning_rate_at(step: int, learning_rate: float, warmup_steps: int = 0, total_steps: int | None = None,
                     schedule: str = "constant", min_fraction: float = 0.1) -> float:
    """The learning rate of one optimizer step.

    step: 1-based index of the step about to run. Linear warm-up lr*step/warmup_steps for step <=
    warmup_steps,
    then constant, or cosine decay to min_fraction*lr at total_steps.

        warm-up   lr_t = lr * t / W                                     for t <= W
        constant  lr_t = lr                                             for t > W
        cosine    lr_t = lr * (m + (1 - m) * (1 + cos(pi * p)) / 2),  p = min(1, (t - 1 - W) / max(1, T - W))

    with W = warmup_steps, T = total_steps, m = min_fraction. The cosine starts at lr on the first step after
    the warm-up and stays at m * lr from step T + 1 on (a run continued past T keeps the last rate).
    """
    check_number("step", step, low=1, integer=True)
    check_number("learning_rate", learning_rate, low=0, low_open=True)
    check_number("warmup_steps", warmup_steps, low=0, integer=True)
    check_choice("schedule", schedule, SCHEDULES)
    check_number("min_fraction", min_fraction, low=0, high=1)
    if schedule == "cosine" and total_steps is None:
        raise ValueError("total_steps must be given for schedule='cosine', got None")
    check_optional(check_number, "total_steps", total_steps, low=1, integer=True)

    if warmup_steps and step <= warmup_steps:
        # (lr * t) / W and lr * (t / W) can differ in the last bit: each schedule keeps the rounding its
        # trainer has always used (SFT the first, RL the second), so earlier runs reproduce bit for bit.
        if schedule == "cosine":
            return learning_rate * step / warmup_steps
        return learning_rate * (step / warmup_steps)
    if schedule == "constant":
        return learning_rate
    progress = (step - 1 - warmup_steps) / max(1, total_steps - warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))  # 1 -> 0 over the run
    return learning_rate * (min_fraction + (1 - min_fraction) * cosine)
