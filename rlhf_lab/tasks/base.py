"""The task interface: a finite space of problems, sampled into disjoint train/test splits.

A task numbers every problem it can pose, `0 .. space_size() - 1`, and turns a number into an
`Example` with `example_at(index)`. Splitting is then the same for every task: draw
`n_train + n_test` DISTINCT numbers with a seeded RNG (sampling without replacement), the first
`n_train` are the training set, the rest the test set. Distinct numbers give distinct prompts, so
train and test never share a prompt and neither contains duplicates, even when the whole space is
small (1-digit addition has only 100 problems).

The out-of-distribution (OOD) test set comes from a second space of strictly longer problems
(`ood_space_size` / `ood_example_at`), so it is disjoint from both splits by construction.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from rlhf_lab.tasks.formats import PLAIN, TASK_CHARS, extract_answer
from rlhf_lab.tasks.rewards import RewardFn, WeightedReward
from rlhf_lab.util.validation import check_number


@dataclass(frozen=True)
class Example:
    """One problem. `completion` is exactly what the model should generate after `prompt`, without EOS.

    For plain formats completion == answer; scratchpad formats put the carry steps in `completion`
    while `answer` stays the bare reference answer that the rewards compare against.
    """

    prompt: str
    answer: str
    completion: str


def sample_distinct(rng: random.Random, space_size: int, k: int) -> list[int]:
    """k distinct integers from range(space_size), in random order (sampling without replacement)."""
    if k > space_size:
        raise ValueError(f"cannot draw {k} distinct problems from a space of {space_size}")
    if space_size <= 4 * k:
        # Small space: shuffle-based sampling, no rejection loop that could crawl near the end.
        return rng.sample(range(space_size), k)
    # Large space (possibly > sys.maxsize, which range() cannot len()): collisions are rare, reject them.
    seen: set[int] = set()
    drawn: list[int] = []
    while len(drawn) < k:
        index = rng.randrange(space_size)
        if index not in seen:
            seen.add(index)
            drawn.append(index)
    return drawn


class Task(ABC):
    """Base class. Subclasses are frozen dataclasses whose fields are the task's parameters.

    Class attributes: `answer_format` (how the completion is laid out, see formats.py) and
    `default_reward` (weights of the named rewards in rewards.py used by `reward`).
    """

    answer_format: ClassVar[str] = PLAIN
    default_reward: ClassVar[dict[str, float]] = {"correct": 1.0}
    chars: ClassVar[str | None] = TASK_CHARS  # every character the task writes; None: free text (BPE tokenizer)
    rewards: ClassVar[dict | None] = None  # the task's own named rewards; None: rewards.REWARDS
    accuracy_reward: ClassVar[str] = "correct"  # the reward whose 0/1 value is the accuracy

    @property
    @abstractmethod
    def name(self) -> str:
        """The registry name of this task, e.g. 'addition_cot'."""

    @abstractmethod
    def space_size(self) -> int:
        """How many distinct prompts the task can pose."""

    @abstractmethod
    def example_at(self, index: int) -> Example:
        """The problem numbered `index` in [0, space_size()); distinct indices give distinct prompts."""

    @abstractmethod
    def ood_space_size(self, extra: int = 1) -> int:
        """How many distinct OOD prompts there are with problems `extra` longer."""

    @abstractmethod
    def ood_example_at(self, index: int, extra: int = 1) -> Example:
        """The OOD problem numbered `index` in [0, ood_space_size(extra))."""

    def params(self) -> dict[str, Any]:
        """The task's parameters, e.g. {'digits': 3, 'answer_format': 'plain'} (for manifests)."""
        return asdict(self)  # type: ignore[call-overload]  # subclasses are dataclasses

    def make_split(self, seed: int, n_train: int, n_test: int) -> tuple[list[Example], list[Example]]:
        """Disjoint (train, test) lists of distinct prompts; the same seed gives the same lists.

        Tasks that differ only in format (addition, addition_cot, addition_answer_first) draw the same
        problems for the same seed and parameters, so their datasets differ only in the completions.
        """
        for name, value in (("seed", seed), ("n_train", n_train), ("n_test", n_test)):
            check_number(name, value, low=0, integer=True)
        if n_train + n_test > self.space_size():
            raise ValueError(
                f"n_train + n_test must be <= {self.space_size()} (all distinct prompts of {self!r}), "
                f"got {n_train} + {n_test}"
            )
        rng = random.Random(seed)
        indices = sample_distinct(rng, self.space_size(), n_train + n_test)
        examples = [self.example_at(index) for index in indices]
        return examples[:n_train], examples[n_train:]

    def make_ood_test(self, seed: int, n_test: int, extra: int = 1) -> list[Example]:
        """A test set of distinct, strictly longer problems (e.g. n+1-digit operands), seeded."""
        for name, value in (("seed", seed), ("n_test", n_test)):
            check_number(name, value, low=0, integer=True)
        check_number("extra", extra, low=1, integer=True)
        space = self.ood_space_size(extra)
        if n_test > space:
            raise ValueError(f"n_test must be <= {space} (all distinct OOD prompts), got {n_test}")
        # A string seed is hashed deterministically (sha512), independent of PYTHONHASHSEED.
        rng = random.Random(f"ood:{seed}:{extra}")
        return [self.ood_example_at(index, extra) for index in sample_distinct(rng, space, n_test)]

    def check_tokenizer(self, tokenizer, hint: str = "a BPE tokenizer") -> None:
        """Raise ValueError if `tokenizer` is a character tokenizer (one with `chars`) and this task
        writes free text (`chars` None), which only a BPE tokenizer encodes. `hint` says what to use.
        (A character missing from a character tokenizer is named when it is met.)"""
        if getattr(tokenizer, "chars", None) is not None and self.chars is None:
            raise ValueError(f"task {self.name!r} writes free text, which the character tokenizer cannot "
                             f"encode: it needs a BPE tokenizer; use {hint}")

    # Reward hooks ---------------------------------------------------------------------------------

    def extract_answer(self, completion: str) -> str | None:
        """The answer digits of a completion in this task's format, or None if there is none."""
        return extract_answer(completion, self.answer_format)

    def reward_fn(self, weights: dict[str, float] | None = None) -> RewardFn:
        """A reward function with this task's answer format bound; `weights=None` uses `default_reward`."""
        return WeightedReward(self.default_reward if weights is None else weights, self.answer_format,
                              rewards=self.rewards)

    def reward(self, prompt: str, completion: str, reference: str, finished: bool = True) -> float:
        """The task's default RL reward (see `default_reward`); same contract as rewards.py."""
        return self.reward_fn()(prompt, completion, reference, finished)

    def score(self, prompt: str, completion: str, reference: str, finished: bool = True) -> float:
        """Exact-match accuracy, 1.0 or 0.0: the evaluation metric, whatever the RL reward is."""
        return self.reward_fn({self.accuracy_reward: 1.0})(prompt, completion, reference, finished)
