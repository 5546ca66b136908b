"""Simulated annotators: each has a stated noise model, a flip rate and a verbosity bias.

An annotator compares two completions of the same prompt by a utility

    u(y) = gold(y) + length_bias * len(y)          (len in characters; a completion cut off
                                                    before EOS gets no length credit: gold 0, utility 0)

prefers the higher one (a tie is a coin toss), then flips its answer with probability `flip_rate`
(lapses, misreads). `length_bias` > 0 is the bias real preference data is known to carry: raters,
human or model, prefer longer answers (Singhal et al. 2023, arXiv 2310.03716). With
length_bias = 0.3, a wrong 3-digit answer (gold 0.33) loses to the same answer padded with three
junk digits (gold 0.17 + 0.9 of length credit); the gold (gold.py) would have picked the short one.

Every random draw comes from a `random.Random` seeded by the data seed, the annotator's name and
its own seed, so the labels are the same on every machine.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from ..util.validation import Validated, setting
from .gold import gold_reward


def _check_name(name: str, value) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")


@dataclass(frozen=True)
class Annotator(Validated):
    """One simulated rater.

    name: how tables and data files call it.
    flip_rate: probability that a comparison's label is flipped, in [0, 0.5].
    length_bias: utility per character of completion added to the gold score (verbosity bias); 0 = none.
    seed: this rater's own randomness (mixed with the data seed).
    """

    name: str = setting(check=_check_name, help="how tables and data files call it")
    flip_rate: float = setting(0.0, ge=0, le=0.5, help="probability that a label is flipped")
    length_bias: float = setting(0.0, ge=0, help="utility per character added to the gold score")
    seed: int = setting(0, help="this rater's own randomness")

    def utility(self, prompt: str, completion: str, answer: str, finished: bool = True) -> float:
        """u(y) = gold(y) + length_bias * len(y) for a finished completion; 0 for one cut off (no answer)."""
        if not finished:
            return 0.0
        return gold_reward(prompt, completion, answer, finished) + self.length_bias * len(completion)

    def describe(self) -> str:
        return f"{self.name}: flips {self.flip_rate:.0%} of labels, +{self.length_bias:g} utility per character"

    def label(self, comparisons: Sequence, data_seed: int = 0) -> list[int]:
        """1 where this rater prefers the first completion of a comparison, else 0.

        comparisons: items with `prompt`, `answer`, and two completions `first`, `second` with
        `first_finished`, `second_finished` (see data.Comparison). The same (comparisons, data_seed)
        give the same labels on any machine.
        """
        rng = random.Random(f"{data_seed}/{self.name}/{self.seed}")  # str seeds hash the same everywhere
        labels = []
        for c in comparisons:
            u_first = self.utility(c.prompt, c.first, c.answer, c.first_finished)
            u_second = self.utility(c.prompt, c.second, c.answer, c.second_finished)
            tie_break, flip = rng.random() < 0.5, rng.random() < self.flip_rate  # two draws per item, always
            prefers_first = u_first > u_second or (u_first == u_second and tie_break)
            labels.append(int(prefers_first != flip))
        return labels


# The panel that labelled the shipped data (data/preferences/DATASHEET.md): two careful raters
# without a length preference, and three who like longer answers to different degrees. The majority
# therefore carries a verbosity bias, as crowd preference data does.
DEFAULT_ANNOTATORS: tuple[Annotator, ...] = (
    Annotator("careful", flip_rate=0.05, length_bias=0.0, seed=1),
    Annotator("hurried", flip_rate=0.20, length_bias=0.0, seed=2),
    Annotator("verbose_a", flip_rate=0.10, length_bias=0.40, seed=3),
    Annotator("verbose_b", flip_rate=0.10, length_bias=0.30, seed=4),
    Annotator("verbose_c", flip_rate=0.15, length_bias=0.50, seed=5),
)
