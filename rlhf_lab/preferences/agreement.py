"""How much annotators agree, beyond chance: Cohen's kappa (two raters) and Fleiss' kappa (m raters).

    Cohen:  kappa = (p_o - p_e) / (1 - p_e),  p_o = observed agreement,
            p_e = sum_k p_A(k) p_B(k)  (chance agreement from each rater's own label frequencies)
    Fleiss: P_i = (sum_k n_ik^2 - m) / (m (m - 1)),  P_bar = mean_i P_i,
            p_k = sum_i n_ik / (N m),  P_e = sum_k p_k^2,  kappa = (P_bar - P_e) / (1 - P_e)

1 = perfect agreement, 0 = what chance gives, < 0 = worse than chance (Cohen 1960; Fleiss 1971).

Agreement also bounds a reward model. If two annotators each give the "true" preference with
probability q, independently, they agree with probability p_o = q^2 + (1 - q)^2, so
q = (1 + sqrt(2 p_o - 1)) / 2 (`accuracy_ceiling`): even a reward model that knew the true
preference exactly would match one annotator's held-out labels only a fraction q of the time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..util.validation import check_number


def cohen_kappa(labels_a: Sequence, labels_b: Sequence) -> float:
    """Cohen's kappa of two raters' labels on the same items (any hashable labels).

    Equal to `sklearn.metrics.cohen_kappa_score(labels_a, labels_b)`. When both raters always give one
    and the same label, p_e = 1 and kappa is undefined: like sklearn, this returns nan.
    """
    labels_a, labels_b = list(labels_a), list(labels_b)
    if len(labels_a) != len(labels_b) or not labels_a:
        raise ValueError(f"labels_a and labels_b must be non-empty and of equal length, got {len(labels_a)} "
                         f"and {len(labels_b)}")
    n = len(labels_a)
    observed = sum(a == b for a, b in zip(labels_a, labels_b)) / n
    categories = set(labels_a) | set(labels_b)
    chance = sum((labels_a.count(k) / n) * (labels_b.count(k) / n) for k in categories)
    if chance == 1.0:
        return math.nan
    return (observed - chance) / (1 - chance)


def rating_counts(labels: Sequence[Sequence], categories: Sequence | None = None) -> torch.Tensor:
    """(N items, m raters) labels -> (N, K) counts n_ik of raters who put item i in category k."""
    rows = [list(row) for row in labels]
    categories = sorted({label for row in rows for label in row}) if categories is None else list(categories)
    index = {category: k for k, category in enumerate(categories)}
    counts = torch.zeros((len(rows), len(categories)), dtype=torch.float64)
    for i, row in enumerate(rows):
        for label in row:
            counts[i, index[label]] += 1
    return counts


def fleiss_kappa(label_matrix) -> float:
    """Fleiss' kappa from an (N items, K categories) matrix of counts n_ik, every row summing to the
    same number of raters m >= 2 (build it from raw labels with `rating_counts`)."""
    counts = torch.as_tensor(label_matrix, dtype=torch.float64)
    if counts.dim() != 2 or counts.shape[0] == 0:
        raise ValueError(f"label_matrix must be (items, categories) counts, got shape {tuple(counts.shape)}")
    raters = counts.sum(dim=1)
    m = float(raters[0])
    if m < 2 or not bool((raters == m).all()):
        raise ValueError(f"every item must be rated by the same number (>= 2) of raters, got row sums "
                         f"{sorted(set(raters.tolist()))}")
    n_items = counts.shape[0]
    per_item = ((counts**2).sum(dim=1) - m) / (m * (m - 1))  # P_i: agreeing rater pairs of item i
    p_bar = float(per_item.mean())
    p_k = counts.sum(dim=0) / (n_items * m)  # share of all ratings in category k
    p_e = float((p_k**2).sum())
    if p_e == 1.0:
        return math.nan
    return (p_bar - p_e) / (1 - p_e)


def accuracy_ceiling(agreement: float) -> float:
    """The accuracy q of one annotator against the true preference implied by a pairwise agreement
    p_o = q^2 + (1 - q)^2 of two equally reliable, independent annotators: q = (1 + sqrt(2 p_o - 1)) / 2.
    A reward model predicting that annotator's held-out labels cannot expect more than q."""
    # below 0.5 two binary raters agree less than chance
    check_number("agreement", agreement, low=0.5, high=1.0)
    return (1 + math.sqrt(2 * agreement - 1)) / 2
