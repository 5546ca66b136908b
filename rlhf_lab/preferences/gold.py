"""The hidden gold preference that plays the human (Gao, Schulman, Hilton 2022, arXiv 2210.10760).

In Gao et al. a large "gold" reward model labels the data that smaller proxy reward models learn
from, so the proxy can be checked against the gold at any time, something real RLHF cannot do.
Here the gold is a rule that knows the right answer:

    gold = 0.5 * correct + 0.5 * partial          (0.0 when the model did not finish)
    partial = sum_i [pred_i == ref_i] / max(|pred|, |ref|)

`correct` rewards the exact answer; `partial` gives digit credit and divides by the LONGER length,
so every character beyond the answer costs credit: '231' -> 1.0, '201' -> 0.33, '2310' -> 0.375,
'231000' -> 0.25. Length is never rewarded for itself. That is the point: the simulated annotators
(annotators.py) do reward length a little, as human raters do (Singhal et al. 2023), and a reward
model trained on their labels can learn that bias, which the gold never shares.
"""

from __future__ import annotations

from ..tasks.rewards import correctness_reward, partial_credit_reward

CORRECT_WEIGHT = 0.5  # the exact answer
PARTIAL_WEIGHT = 0.5  # digit credit, with every extra character counting against it


def gold_reward(prompt: str, completion: str, answer: str, finished: bool = True) -> float:
    """The gold score in [0, 1] of one completion; the task rewards' signature, so it can be a
    `reward_fn` of the RL trainer too. 0.0 when `finished` is False (cut off before EOS)."""
    return (CORRECT_WEIGHT * correctness_reward(prompt, completion, answer, finished)
            + PARTIAL_WEIGHT * partial_credit_reward(prompt, completion, answer, finished))
