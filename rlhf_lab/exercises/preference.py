"""Human-feedback exercises: Cohen's kappa (annotator agreement), the Bradley-Terry reward-model
loss and the DPO loss.

The DPO reference is the package's `rlhf_lab.preferences.dpo_loss`. Cohen's kappa and Bradley-Terry
are written here until `rlhf_lab.preferences` has `cohen_kappa` and `bradley_terry_loss` (same
formulas and test vectors); then these exercises should point at those.

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

import torch
import torch.nn.functional as F

# The references are the package's own functions (rlhf_lab.preferences).
from ..preferences import bradley_terry_loss, cohen_kappa, dpo_loss
from .core import Case, Exercise, Mistake, spec_cases

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


def _flip_vector_064() -> tuple[list[int], list[int]]:
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
    a064, b064 = _flip_vector_064()
    cases = spec_cases([
        ("known value: f = 0.1 flips -> 0.64", {"labels_a": a064, "labels_b": b064}, 0.64),
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


# ----------------------------------------------------------------------------------------------
# Bradley-Terry


def _bt_naive(chosen_rewards, rejected_rewards, margin=0.0):
    return -torch.log(torch.sigmoid(chosen_rewards - rejected_rewards - margin)).mean()


def _bt_no_log(chosen_rewards, rejected_rewards, margin=0.0):
    return -torch.sigmoid(chosen_rewards - rejected_rewards - margin).mean()


def _bt_swapped(chosen_rewards, rejected_rewards, margin=0.0):
    return -F.logsigmoid(rejected_rewards - chosen_rewards - margin).mean()


def _bt_margin_sign(chosen_rewards, rejected_rewards, margin=0.0):
    return -F.logsigmoid(chosen_rewards - rejected_rewards + margin).mean()


def bradley_terry_cases(seed: int) -> list[Case]:
    cases = spec_cases([("known value: r_w 1, r_l 0 -> log(1 + e^-1)", {
        "chosen_rewards": torch.tensor([1.0]), "rejected_rewards": torch.tensor([0.0]), "margin": 0.0}, [0.31326])])
    cases.append(Case("a large wrong-way gap (r_w - r_l = -120)", {
        "chosen_rewards": torch.tensor([-60.0, 0.5]), "rejected_rewards": torch.tensor([60.0, 0.0]), "margin": 0.0}))
    g = torch.Generator().manual_seed(seed)
    for i, margin in enumerate([0.0, 0.5, 2.0]):
        cases.append(Case(f"random {i}: margin {margin}", {"chosen_rewards": torch.randn(6, generator=g) * 2,
                                                           "rejected_rewards": torch.randn(6, generator=g) * 2,
                                                           "margin": margin}))
    return cases


BRADLEY_TERRY_MISTAKES = (
    Mistake("naive_log_sigmoid", "torch.log(torch.sigmoid(x)) underflows to log(0) = -inf for x < -104 in float32 "
            "(a confidently wrong reward model): use F.logsigmoid(x), or softplus(-x).", _bt_naive),
    Mistake("missing_log", "the loss is the negative LOG-likelihood -log sigmoid(r_w - r_l); -sigmoid(...) "
            "has vanishing gradients exactly where the model is most wrong.", _bt_no_log),
    Mistake("chosen_rejected_swapped", "the chosen completion's reward comes first: sigmoid(r_w - r_l) is the "
            "probability that the chosen one wins.", _bt_swapped),
    Mistake("margin_sign", "the margin is subtracted, -log sigmoid(r_w - r_l - m): the chosen reward must beat "
            "the rejected one BY m.", _bt_margin_sign),
)


# ----------------------------------------------------------------------------------------------
# DPO


def _dpo_variant(wrong):
    def variant(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta=0.1,
                label_smoothing=0.0):
        return wrong(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
                     label_smoothing)

    return variant


def _h(pc, pr, rc, rr):
    return (pc - rc) - (pr - rr)


DPO_MISTAKES = (
    Mistake("missing_beta", "the logit is beta * h: without beta the loss saturates (and the implicit reward "
            "is beta * log-ratio).", _dpo_variant(lambda pc, pr, rc, rr, b, e: -(1 - e) * F.logsigmoid(
                _h(pc, pr, rc, rr)) - e * F.logsigmoid(-_h(pc, pr, rc, rr)))),
    Mistake("reference_ignored", "h uses log-RATIOS to the reference: (log pi(y_w) - log pi_ref(y_w)) - "
            "(log pi(y_l) - log pi_ref(y_l)), not the policy's log-probs alone.",
            _dpo_variant(lambda pc, pr, rc, rr, b, e: -(1 - e) * F.logsigmoid(b * (pc - pr))
                         - e * F.logsigmoid(-b * (pc - pr)))),
    Mistake("chosen_rejected_swapped", "h = chosen log-ratio minus rejected log-ratio; swapped, DPO learns the "
            "opposite preference.", _dpo_variant(lambda pc, pr, rc, rr, b, e: -(1 - e) * F.logsigmoid(
                -b * _h(pc, pr, rc, rr)) - e * F.logsigmoid(b * _h(pc, pr, rc, rr)))),
    Mistake("label_smoothing_ignored", "conservative DPO: -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h) "
            "(TRL's label_smoothing).", _dpo_variant(lambda pc, pr, rc, rr, b, e: -F.logsigmoid(
                b * _h(pc, pr, rc, rr)))),
    Mistake("naive_log_sigmoid", "torch.log(torch.sigmoid(x)) underflows to -inf for x < -104 in float32: use "
            "F.logsigmoid.", _dpo_variant(lambda pc, pr, rc, rr, b, e: -(1 - e) * torch.log(torch.sigmoid(
                b * _h(pc, pr, rc, rr))) - e * torch.log(torch.sigmoid(-b * _h(pc, pr, rc, rr))))),
)


def dpo_cases(seed: int) -> list[Case]:
    def pair(chosen_ratio, rejected_ratio, beta, eps):
        return {"policy_chosen_logps": torch.tensor([-5.0 + chosen_ratio]),
                "policy_rejected_logps": torch.tensor([-7.0 + rejected_ratio]),
                "ref_chosen_logps": torch.tensor([-5.0]), "ref_rejected_logps": torch.tensor([-7.0]),
                "beta": beta, "label_smoothing": eps}

    cases = spec_cases([("known value: beta 0.1, log-ratios +1 / -1", pair(1.0, -1.0, 0.1, 0.0), [0.59814]),
                        ("known value: the same with label_smoothing 0.1", pair(1.0, -1.0, 0.1, 0.1), [0.61814])])
    cases.append(Case("a large wrong-way logit (beta h = -150)", pair(-1000.0, 500.0, 0.1, 0.0)))
    g = torch.Generator().manual_seed(seed)
    for i, (beta, eps) in enumerate([(0.1, 0.0), (0.5, 0.2), (1.0, 0.0)]):
        ref_chosen, ref_rejected = -torch.rand(5, generator=g) * 20, -torch.rand(5, generator=g) * 20
        cases.append(Case(f"random {i}: beta {beta}, label_smoothing {eps}", {
            "policy_chosen_logps": ref_chosen + torch.randn(5, generator=g) * 3,
            "policy_rejected_logps": ref_rejected + torch.randn(5, generator=g) * 3,
            "ref_chosen_logps": ref_chosen, "ref_rejected_logps": ref_rejected, "beta": beta, "label_smoothing": eps}))
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
        source="Cohen (1960)",
    ),
    Exercise(
        name="bradley_terry_loss", title="the Bradley-Terry reward-model loss", topic="preferences",
        difficulty="easy", minutes=5,
        signature='''def bradley_terry_loss(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, margin=0.0) -> torch.Tensor:
    """Reward-model loss over B preference pairs. chosen_rewards, rejected_rewards: (B,); returns a scalar.

        loss = mean over pairs of -log sigmoid(r_w - r_l - m)

    Must stay finite for any float32 rewards. (Bradley & Terry 1952; InstructGPT; Llama 2's margin.)
    """''',
        reference=bradley_terry_loss, make_cases=bradley_terry_cases, mistakes=BRADLEY_TERRY_MISTAKES,
        hints=("P(y_w beats y_l) = sigmoid(r_w - r_l); the loss is its negative log.",
               "torch.nn.functional.logsigmoid is log(sigmoid(x)) without the underflow."),
        source="Bradley-Terry; InstructGPT (arXiv 2203.02155)",
    ),
    Exercise(
        name="dpo_loss", title="the DPO loss (with label smoothing)", topic="preferences", difficulty="medium",
        minutes=10,
        signature='''def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta: float = 0.1, label_smoothing: float = 0.0) -> torch.Tensor:
    """DPO's loss per pair. Each input (B,): log pi(y|x) summed over the completion's tokens, under the
    policy and under the frozen reference. Returns (B,).

        h    = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))
        loss = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)      eps = label_smoothing

    (Rafailov et al. 2023, arXiv 2305.18290; TRL DPOTrainer's "sigmoid" loss with label_smoothing.)
    """''',
        reference=dpo_loss, make_cases=dpo_cases, mistakes=DPO_MISTAKES,
        hints=("Four log-probs make two log-ratios; h is their difference.",
               "F.logsigmoid(beta * h) is log sigmoid without underflow.",
               "label_smoothing mixes in the loss of the flipped label, -log sigmoid(-beta h)."),
        source="DPO (arXiv 2305.18290); TRL DPOTrainer",
    ),
]
