"""Workloads for measuring the split: what makes overlapping generation with training pay.

`SlowReward` waits `seconds` per batch before scoring: a stand-in for a reward model served on other
GPUs or a code sandbox, whose latency the rollout side pays and the learner need not. It is a
module-level class, so it pickles to the rollout processes.
"""

from __future__ import annotations

import time

from ..rl.rollout import score_completions


class SlowReward:
    """reward_fn's scores after a `seconds` wait per batch."""

    def __init__(self, reward_fn, seconds: float) -> None:
        self.reward_fn, self.seconds = reward_fn, seconds

    def score_batch(self, prompts, completions, answers, finished) -> list[float]:
        time.sleep(self.seconds)
        return score_completions(self.reward_fn, prompts, completions, answers, finished).tolist()
