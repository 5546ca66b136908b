"""Human-feedback exercises: Cohen's kappa (annotator agreement).

Cohen's kappa (Cohen 1960), for two annotators who labelled the same N items:

    kappa = (p_o - p_e) / (1 - p_e)
    p_o   = (1/N) sum_i [a_i == b_i]                 observed agreement
    p_e   = sum_k p_A(k) p_B(k)                      agreement expected by chance, from each
                                                     annotator's OWN label frequencies

1 = perfect agreement, 0 = chance level, < 0 = worse than chance. Parity reference:
`sklearn.metrics.cohen_kappa_score` (which returns nan when p_e = 1, as here).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence

from .core import Case, Exercise, Mistake, spec_cases


def cohen_kappa(labels_a: Sequence, labels_b: Sequence) -> float:
    """Cohen's kappa of two equally long label sequences (any hashable labels). nan when p_e = 1
    (both annotators always gave the same single label: agreement is not informative)."""
    if len(labels_a) != len(labels_b) or len(labels_a) == 0:
        raise ValueError(f"labels_a and labels_b must be non-empty and equally long, got {len(labels_a)} "
                         f"and {len(labels_b)}")
    n = len(labels_a)
    p_observed = sum(a == b for a, b in zip(labels_a, labels_b)) / n  # p_o
    count_a, count_b = Counter(labels_a), Counter(labels_b)
    p_chance = sum(count_a[k] * count_b[k] for k in count_a) / n**2  # p_e = sum_k p_A(k) p_B(k)
    if p_chance == 1.0:
        return math.nan
    return (p_observed - p_chance) / (1.0 - p_chance)  # (p_o - p_e) / (1 - p_e)


# ----------------------------------------------------------------------------------------------
# wrong variants


def _raw_agreement(labels_a, labels_b):
    return sum(a == b for a, b in zip(labels_a, labels_b)) / len(labels_a)


def _scott_pi(labels_a, labels_b):
    n = len(labels_a)
    p_observed = sum(a == b for a, b in zip(labels_a, labels_b)) / n
    pooled = Counter(labels_a) + Counter(labels_b)
    p_chance = sum((c / (2 * n)) ** 2 for c in pooled.values())  # pooled frequencies: Scott's pi
    return math.nan if p_chance == 1.0 else (p_observed - p_chance) / (1.0 - p_chance)


def _uniform_chance(labels_a, labels_b):
    n = len(labels_a)
    p_observed = sum(a == b for a, b in zip(labels_a, labels_b)) / n
    p_chance = 1.0 / len(set(labels_a) | set(labels_b))  # 1/K: assumes every label equally likely
    return math.nan if p_chance == 1.0 else (p_observed - p_chance) / (1.0 - p_chance)


def _chance_from_counts(labels_a, labels_b):
    n = len(labels_a)
    p_observed = sum(a == b for a, b in zip(labels_a, labels_b)) / n
    count_a, count_b = Counter(labels_a), Counter(labels_b)
    p_chance = sum(count_a[k] * count_b[k] for k in count_a) / n  # divided by N once, not N^2
    return math.nan if p_chance == 1.0 else (p_observed - p_chance) / (1.0 - p_chance)


KAPPA_MISTAKES = (
    Mistake("raw_agreement", "this is the observed agreement p_o: kappa subtracts the agreement expected by "
            "chance, (p_o - p_e) / (1 - p_e).", _raw_agreement),
    Mistake("pooled_frequencies", "p_e from the two annotators' pooled label frequencies is Scott's pi; "
            "Cohen's kappa uses each annotator's own frequencies: p_e = sum_k p_A(k) p_B(k).", _scott_pi),
    Mistake("uniform_chance", "p_e = 1/K assumes every label is equally likely; use the label frequencies "
            "each annotator actually used.", _uniform_chance),
    Mistake("chance_from_counts", "p_e must multiply two FREQUENCIES: sum_k n_A(k) n_B(k) / N^2, not / N.",
            _chance_from_counts),
)


def _spec_vector_064() -> tuple[list[int], list[int]]:
    """100 balanced items; each annotator flips 10 of them (5 per class), one flip shared, so
    p_o = 0.82 = (1 - f)^2 + f^2 with f = 0.1, p_e = 0.5 and kappa = 1 - 4 f (1 - f) = 0.64."""
    truth = [1] * 50 + [0] * 50
    a, b = list(truth), list(truth)
    for i in list(range(0, 5)) + list(range(50, 55)):
        a[i] = 1 - a[i]
    for i in list(range(4, 9)) + list(range(55, 60)):
        b[i] = 1 - b[i]
    return a, b


def kappa_cases(seed: int) -> list[Case]:
    a064, b064 = _spec_vector_064()
    cases = spec_cases([
        ("spec: f = 0.1 flips -> 0.64", {"labels_a": a064, "labels_b": b064}, 0.64),
        ("p_o 0.75, p_e 0.5", {"labels_a": [1, 1, 0, 0], "labels_b": [1, 0, 0, 0]}, 0.5),
        ("perfect", {"labels_a": [0, 1, 2, 1], "labels_b": [0, 1, 2, 1]}, 1.0),
        ("always disagree", {"labels_a": [0, 1, 0, 1], "labels_b": [1, 0, 1, 0]}, -1.0),
        ("skewed labels", {"labels_a": [1] * 8 + [0, 0], "labels_b": [1] * 9 + [0]}, 0.6153846),
        ("three labels, one unused by b", {"labels_a": [0, 1, 2, 2, 1, 0], "labels_b": [0, 1, 1, 1, 1, 0]},
         0.5),
    ])
    cases.append(Case("p_e = 1: undefined", {"labels_a": [1, 1, 1], "labels_b": [1, 1, 1]}, math.nan))
    rng = random.Random(seed)
    for i in range(6):
        n, k = rng.randint(5, 40), rng.randint(2, 4)
        a = [rng.randrange(k) for _ in range(n)]
        b = [x if rng.random() < 0.7 else rng.randrange(k) for x in a]  # correlated annotators
        cases.append(Case(f"random {i}", {"labels_a": a, "labels_b": b}))
    return cases


EXERCISES = [
    Exercise(
        name="cohen_kappa", title="Cohen's kappa for two annotators", topic="preferences",
        difficulty="easy", minutes=10,
        signature='''def cohen_kappa(labels_a: list, labels_b: list) -> float:
    """Cohen's kappa of two annotators' labels on the same N items (lists of equal length N).

        kappa = (p_o - p_e) / (1 - p_e)
        p_o = fraction of items where the two labels agree
        p_e = sum over labels k of p_A(k) * p_B(k), each annotator's own label frequencies

    Return nan when p_e == 1. (Cohen 1960; sklearn.metrics.cohen_kappa_score.)
    """''',
        reference=cohen_kappa, make_cases=kappa_cases, mistakes=KAPPA_MISTAKES,
        hints=("p_o is easy: the mean of [a == b].",
               "p_e is the probability that two INDEPENDENT annotators with these label frequencies agree.",
               "For balanced binary labels p_e = 0.5, so kappa = 2 p_o - 1."),
        source="Cohen (1960); spec: preferences section 1",
    ),
]
