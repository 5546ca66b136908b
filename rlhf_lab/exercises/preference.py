"""Human-feedback exercises: Cohen's kappa (annotator agreement), the Bradley-Terry reward-model
loss and the DPO / IPO loss from per-token log-probabilities.

The references are the package's functions (`rlhf_lab.preferences`: cohen_kappa, bradley_terry_loss,
dpo_loss). The DPO exercise starts one step earlier than `preferences.dpo_loss`, from per-token
log-probabilities and completion masks, so that the sum over tokens (DPO) versus the mean over tokens
(TRL's IPO) is part of what is written, and can be got wrong.

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
from .. import preferences
from ..preferences import bradley_terry_loss, cohen_kappa
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


def _chance_fixed_half(labels_a, labels_b):
    n = len(labels_a)
    p_observed = sum(a == b for a, b in zip(labels_a, labels_b)) / n
    return 2 * p_observed - 1  # p_e = 0.5 taken for granted: kappa = (p_o - 0.5) / 0.5


KAPPA_MISTAKES = (
    Mistake("raw_agreement", "this is the observed agreement p_o: kappa subtracts the agreement expected by "
            "chance, (p_o - p_e) / (1 - p_e).", _raw_agreement,
            zh="这只是观测一致率 p_o：Kappa 还要扣除偶然一致的部分，(p_o − p_e) / (1 − p_e)。"),
    Mistake("pooled_frequencies", "p_e from the two annotators' pooled label frequencies is Scott's pi; "
            "Cohen's kappa uses each annotator's own frequencies: p_e = sum_k p_A(k) p_B(k).", _scott_pi,
            zh="用两位标注员合并后的标签频率算 p_e，得到的是 Scott's pi；Cohen's Kappa "
               "用的是两人各自的标签频率：p_e = Σ_k p_A(k) p_B(k)。"),
    Mistake("uniform_chance", "p_e = 1/K assumes every label is equally likely; use the label frequencies "
            "each annotator actually used.", _uniform_chance,
            zh="p_e = 1/K 假设每类标签出现的概率都一样；应当用两位标注员实际给出各类标签的频率。"),
    Mistake("chance_from_counts", "p_e must multiply two FREQUENCIES: sum_k n_A(k) n_B(k) / N^2, not / N.",
            _chance_from_counts, zh="p_e 是两个频率相乘：Σ_k n_A(k) n_B(k) / N²，而不是只除以 N。"),
    Mistake("chance_fixed_half", "p_e = 0.5, i.e. kappa = 2 p_o - 1, holds only for two labels that each "
            "annotator uses exactly half of the time; with skewed labels, or more than two, compute "
            "p_e = sum_k p_A(k) p_B(k) from the labels.", _chance_fixed_half,
            zh="p_e = 0.5（即 kappa = 2 p_o − 1）只在两类标签、且每位标注员恰好各用一半时才成立；"
               "标签分布不均衡或"
               "多于两类时，要从标注结果算出 p_e = Σ_k p_A(k) p_B(k)。"),
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
        ("known value: f = 0.1 flips -> 0.64", {"labels_a": a064, "labels_b": b064}, 0.64,
         "已知值：翻转率 f = 0.1 → 0.64"),
        ("p_o 0.75, p_e 0.5", {"labels_a": [1, 1, 0, 0], "labels_b": [1, 0, 0, 0]}, 0.5,
         "p_o = 0.75，p_e = 0.5"),
        ("perfect", {"labels_a": [0, 1, 2, 1], "labels_b": [0, 1, 2, 1]}, 1.0, "完全一致"),
        ("always disagree", {"labels_a": [0, 1, 0, 1], "labels_b": [1, 0, 1, 0]}, -1.0, "完全不一致"),
        ("skewed labels", {"labels_a": [1] * 8 + [0, 0], "labels_b": [1] * 9 + [0]}, 0.6153846,
         "标签分布不均衡"),
        ("three labels, one unused by b", {"labels_a": [0, 1, 2, 2, 1, 0], "labels_b": [0, 1, 1, 1, 1, 0]},
         0.5, "三类标签，b 有一类从没用过"),
    ])
    cases.append(Case("p_e = 1: undefined", {"labels_a": [1, 1, 1], "labels_b": [1, 1, 1]}, math.nan,
                      name_zh="p_e = 1：无定义"))
    rng = random.Random(seed)
    for i in range(6):
        n, k = rng.randint(5, 40), rng.randint(2, 4)
        a = [rng.randrange(k) for _ in range(n)]
        b = [x if rng.random() < 0.7 else rng.randrange(k) for x in a]  # correlated annotators
        cases.append(Case(f"random {i}", {"labels_a": a, "labels_b": b}, name_zh=f"随机用例 {i}"))
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
        "chosen_rewards": torch.tensor([1.0]), "rejected_rewards": torch.tensor([0.0]), "margin": 0.0},
        [0.31326],
        "已知值：r_w = 1，r_l = 0 → log(1 + e^-1)")])
    cases.append(Case("a large wrong-way gap (r_w - r_l = -120)", {
        "chosen_rewards": torch.tensor([-60.0, 0.5]), "rejected_rewards": torch.tensor([60.0, 0.0]),
        "margin": 0.0},
        name_zh="奖励差很大且方向相反（r_w − r_l = −120）"))
    g = torch.Generator().manual_seed(seed)
    for i, margin in enumerate([0.0, 0.5, 2.0]):
        cases.append(
            Case(
                f"random {i}: margin {margin}",
                {
                    "chosen_rewards": torch.randn(6, generator=g) * 2,
                    "rejected_rewards": torch.randn(6, generator=g) * 2,
                    "margin": margin,
                },
                name_zh=f"随机用例 {i}：间隔 {margin}",
            )
        )
    return cases


BRADLEY_TERRY_MISTAKES = (
    Mistake("naive_log_sigmoid", "torch.log(torch.sigmoid(x)) underflows to log(0) = -inf for x < -104 in "
            "float32 (a confidently wrong reward model): use F.logsigmoid(x), or softplus(-x).", _bt_naive,
            zh="在 float32 下，x < −104 时 `torch.log(torch.sigmoid(x))` 会下溢成 log(0) = "
               "−inf（奖励模型错得很离谱时"
               "就会出现）：改用 `F.logsigmoid(x)` 或 `softplus(-x)`。"),
    Mistake("missing_log", "the loss is the negative LOG-likelihood -log sigmoid(r_w - r_l); -sigmoid(...) "
            "has vanishing gradients exactly where the model is most wrong.", _bt_no_log,
            zh="损失是负对数似然 −log σ(r_w − r_l)；写成 −σ(...) 的话，恰恰在模型错得最厉害的地方梯度消失。"),
    Mistake("chosen_rejected_swapped", "the chosen completion's reward comes first: sigmoid(r_w - r_l) is "
            "the probability that the chosen one wins.", _bt_swapped,
            zh="被选回答的奖励在前：σ(r_w − r_l) 是被选回答胜出的概率。"),
    Mistake("margin_sign", "the margin is subtracted, -log sigmoid(r_w - r_l - m): the chosen reward must "
            "beat the rejected one BY m.", _bt_margin_sign,
            zh="间隔是减掉的：−log σ(r_w − r_l − m)，被选回答的奖励要比被拒回答的高出 m 才算赢。"),
)


# ----------------------------------------------------------------------------------------------
# DPO and IPO from per-token log-probabilities


def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_mask,
             rejected_mask, beta: float = 0.1, label_smoothing: float = 0.0, loss_type: str = "sigmoid"):
    """The package's `preferences.dpo_loss` on sequence log-probs made from the per-token ones: the sum
    over the completion's tokens for DPO, the mean for IPO (TRL's convention, see preferences/dpo.py)."""

    def sequence_logp(token_logps, mask):  # (B, T) -> (B,)
        total = (token_logps * mask).sum(-1)  # log pi(y|x) of the whole completion
        return total / mask.sum(-1) if loss_type == "ipo" else total

    return preferences.dpo_loss(sequence_logp(policy_chosen_logps, chosen_mask),
                                sequence_logp(policy_rejected_logps, rejected_mask),
                                sequence_logp(ref_chosen_logps, chosen_mask),
                                sequence_logp(ref_rejected_logps, rejected_mask),
                                beta=beta, loss_type=loss_type, label_smoothing=label_smoothing)


DPO_EXCLUSIVE = (frozenset({"loss_type_ignored", "ipo_summed"}),)


def _dpo_variant(flags: frozenset):
    """The DPO/IPO loss with the mistakes named in `flags` made (any compatible set)."""

    def variant(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_mask,
                rejected_mask, beta=0.1, label_smoothing=0.0, loss_type="sigmoid"):
        ipo = loss_type == "ipo" and "loss_type_ignored" not in flags
        mean = ("ipo_summed" not in flags) if ipo else ("mean_instead_of_sum" in flags)

        def sequence_logp(token_logps, mask):
            if "padding_counted" in flags:
                return token_logps.mean(-1) if mean else token_logps.sum(-1)
            total = (token_logps * mask).sum(-1)
            return total / mask.sum(-1) if mean else total

        pc = sequence_logp(policy_chosen_logps, chosen_mask)
        pr = sequence_logp(policy_rejected_logps, rejected_mask)
        rc = sequence_logp(ref_chosen_logps, chosen_mask)
        rr = sequence_logp(ref_rejected_logps, rejected_mask)
        h = pc - pr if "reference_ignored" in flags else (pc - rc) - (pr - rr)
        if "chosen_rejected_swapped" in flags:
            h = -h
        if ipo:
            return (h - 1 / (2 * beta)) ** 2
        z = h if "missing_beta" in flags else beta * h
        naive = "naive_log_sigmoid" in flags
        log_sigmoid = (lambda v: torch.log(torch.sigmoid(v))) if naive else F.logsigmoid
        if "label_smoothing_ignored" in flags:
            return -log_sigmoid(z)
        return -(1 - label_smoothing) * log_sigmoid(z) - label_smoothing * log_sigmoid(-z)

    return variant


def _dpo_forms(flags: frozenset) -> tuple:
    return (_dpo_variant(flags),) if all(len(flags & group) <= 1 for group in DPO_EXCLUSIVE) else ()


def _dpo(name: str, message: str, zh: str) -> Mistake:
    return Mistake(name, message, _dpo_forms(frozenset({name}))[0], zh=zh)


DPO_MISTAKES = (
    _dpo("missing_beta", "the logit is beta * h: without beta the loss saturates (and the implicit reward "
         "is beta * log-ratio).",
         "送进 sigmoid 的是 β·h：少了 β，损失很快饱和（隐式奖励也是 β 乘以对数比率）。"),
    _dpo("reference_ignored", "h uses log-RATIOS to the reference: (log pi(y_w) - log pi_ref(y_w)) - "
         "(log pi(y_l) - log pi_ref(y_l)), not the policy's log-probs alone.",
         "h 用的是相对参考模型的对数比率：(log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))，"
         "不能只用策略模型自己的对数概率。"),
    _dpo("chosen_rejected_swapped", "h = chosen log-ratio minus rejected log-ratio; swapped, DPO learns the "
         "opposite preference.",
         "h 是被选回答的对数比率减去被拒回答的；写反了，DPO 学到的就是相反的偏好。"),
    _dpo("label_smoothing_ignored", "conservative DPO: -(1 - eps) log sigmoid(beta h) - eps log "
         "sigmoid(-beta h) (TRL's label_smoothing).",
         "标签平滑（保守 DPO）：−(1 − ε) log σ(βh) − ε log σ(−βh)，对应 TRL 的 `label_smoothing`。"),
    _dpo("naive_log_sigmoid", "torch.log(torch.sigmoid(x)) underflows to -inf for x < -104 in float32: use "
         "F.logsigmoid.",
         "在 float32 下，x < −104 时 `torch.log(torch.sigmoid(x))` 会下溢成 −inf：改用 `F.logsigmoid`。"),
    _dpo("mean_instead_of_sum", "DPO's log pi(y|x) is the SUM of the completion's token log-probs (the "
         "log-probability of the whole completion); the mean over tokens is TRL's IPO (or SimPO's length "
         "normalisation), not DPO.",
         "DPO 里的 log π(y|x) 是回答中所有 token 对数概率之和（整段回答的对数概率）；按 token 取平均是 TRL "
         "中 IPO 的做法（或 SimPO 的长度归一化），不是 DPO。"),
    _dpo("ipo_summed", "loss_type='ipo' averages each completion's token log-probs over its own tokens "
         "before forming h (TRL; the paper writes sums): with sums h grows with the length, and the squared "
         "loss is dominated by the long completions.",
         "loss_type='ipo' 时，要先在每个回答自己的 token 上对对数概率求平均，再构造 h（TRL 的做法，"
         "论文里写的是求和）；"
         "用求和的话 h 随长度增长，平方损失会被长回答主导。"),
    _dpo("padding_counted", "sum (or average) over the completion's own tokens only: multiply by the mask; "
         "padded positions hold log-probs of tokens that were never generated.",
         "只能在回答自己的 token 上求和（或求平均）：先乘以掩码；填充位置上的对数概率对应的是从未生成过的 "
         "token。"),
    _dpo("loss_type_ignored", "loss_type='ipo' asks for IPO's squared loss (h - 1/(2 beta))^2 on "
         "token-averaged log-probs, not DPO's -log sigmoid.",
         "loss_type='ipo' 要求的是 IPO 的平方损失 (h − 1/(2β))²（用按 token 平均的对数概率），不是 DPO 的 "
         "−log σ。"),
)


def _tokens(values: list[float], width: int, fill: float) -> torch.Tensor:
    """One row of per-token log-probs padded to `width` with `fill` (what a model says at padding)."""
    return torch.tensor([values + [fill] * (width - len(values))])


def dpo_cases(seed: int) -> list[Case]:
    def pair(chosen, ref_chosen, rejected, ref_rejected, beta, eps, loss_type="sigmoid"):
        width = max(len(chosen), len(rejected)) + 1  # at least one padded position per row
        return {"policy_chosen_logps": _tokens(chosen, width, -7.0),
                "policy_rejected_logps": _tokens(rejected, width, -6.0),
                "ref_chosen_logps": _tokens(ref_chosen, width, -5.0),
                "ref_rejected_logps": _tokens(ref_rejected, width, -4.0),
                "chosen_mask": (torch.arange(width) < len(chosen)).float()[None],
                "rejected_mask": (torch.arange(width) < len(rejected)).float()[None],
                "beta": beta, "label_smoothing": eps, "loss_type": loss_type}

    # chosen: 2 tokens, summed log-ratio +1 (mean +1/2); rejected: 3 tokens, summed log-ratio -1 (mean -1/3)
    chosen, ref_chosen = [-2.0, -2.0], [-2.5, -2.5]
    rejected, ref_rejected = [-3.0, -3.0, -2.0], [-2.5, -2.5, -2.0]
    vector = (chosen, ref_chosen, rejected, ref_rejected)
    cases = spec_cases([
        ("known value: beta 0.1, log-ratios +1 / -1", pair(*vector, 0.1, 0.0),
         [0.59814], "已知值：β = 0.1，对数比率 +1 / −1"),
        ("known value: the same with label_smoothing 0.1", pair(*vector, 0.1, 0.1), [0.61814],
         "已知值：同上，标签平滑 0.1"),
        # TRL's IPO on token means: h = 1/2 + 1/3 = 5/6, loss = (5/6 - 1/(2 * 0.1))^2 = 625/36
        ("IPO on token means: h = 5/6, (5/6 - 5)^2", pair(*vector, 0.1, 0.0, "ipo"),
         [625 / 36], "IPO 按 token 取平均：h = 5/6，(5/6 − 5)²"),
    ])
    cases.append(Case("a large wrong-way logit (beta h = -149.5)", pair(
        [-500.0, -500.0], ref_chosen, rejected, [-252.5, -252.5, -2.0], 0.1, 0.0),
        name_zh="βh 方向相反且绝对值很大（βh = −149.5）"))
    g = torch.Generator().manual_seed(seed)
    settings = [(0.1, 0.0, "sigmoid"), (0.5, 0.2, "sigmoid"), (0.1, 0.0, "ipo"), (0.5, 0.0, "ipo")]
    for i, (beta, eps, loss_type) in enumerate(settings):
        batch, width = 4, 7
        chosen_len = torch.randint(1, width, (batch,), generator=g)
        rejected_len = torch.randint(1, width, (batch,), generator=g)
        logps = {key: -torch.rand(batch, width, generator=g) * 3 for key in
                 ("ref_chosen_logps", "ref_rejected_logps")}
        for side in ("chosen", "rejected"):
            noise = torch.randn(batch, width, generator=g) * 0.5
            logps[f"policy_{side}_logps"] = logps[f"ref_{side}_logps"] + noise
        cases.append(Case(f"random {i}: {loss_type}, beta {beta}, label_smoothing {eps}", {
            **{key: logps[key] for key in ("policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps",
                                           "ref_rejected_logps")},
            "chosen_mask": (torch.arange(width)[None] < chosen_len[:, None]).float(),
            "rejected_mask": (torch.arange(width)[None] < rejected_len[:, None]).float(),
            "beta": beta, "label_smoothing": eps, "loss_type": loss_type},
            name_zh=f"随机用例 {i}：{loss_type}，β = {beta}，标签平滑 {eps}"))
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
               "Check p_e on skewed labels: if both annotators say 1 on 90% of the items, p_e = 0.9 * 0.9 + "
               "0.1 * 0.1 = 0.82, so raw agreement of 0.82 is only chance (kappa 0)."),
        source="Cohen (1960)",
        title_zh="标注一致性：两位标注员的 Cohen's Kappa 系数",
        question="How do you measure whether two annotators agree beyond chance?",
        question_zh="怎么判断两位标注员的一致性超出了偶然水平？Kappa 系数怎么算？",
        explanation="Observed agreement overstates agreement when labels are skewed; kappa subtracts the "
                    "agreement two independent annotators with the same label frequencies would reach.",
        explanation_zh="标签分布不均衡时，观测一致率会高估一致性；Kappa 扣除的是两位相互独立、"
                       "各自保持原有标签频率的标注员纯靠偶然就能达到的一致率。",
        hints_zh=("p_o 很简单：[a == b] 的平均值。",
                  "p_e 是两位互相独立、各自按这样的标签频率标注的标注员碰巧给出相同标签的概率。",
                  "用不均衡的标签检验一下 p_e：如果两人都有 90% 的样本标 1，p_e = 0.9 × 0.9 + 0.1 × 0.1 = "
                  "0.82，于是 0.82 的原始一致率只是偶然水平（Kappa 为 0）。"),
    ),
    Exercise(
        name="bradley_terry_loss", title="the Bradley-Terry reward-model loss", topic="preferences",
        difficulty="easy", minutes=5,
        signature='''def bradley_terry_loss(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor,
                       margin=0.0) -> torch.Tensor:
    """Reward-model loss over B preference pairs. chosen_rewards, rejected_rewards: (B,); returns a scalar.

        loss = mean over pairs of -log sigmoid(r_w - r_l - m)

    Must stay finite for any float32 rewards. (Bradley & Terry 1952; InstructGPT; Llama 2's margin.)
    """''',
        reference=bradley_terry_loss, make_cases=bradley_terry_cases, mistakes=BRADLEY_TERRY_MISTAKES,
        hints=("P(y_w beats y_l) = sigmoid(r_w - r_l); the loss is its negative log.",
               "torch.nn.functional.logsigmoid is log(sigmoid(x)) without the underflow."),
        source="Bradley-Terry; InstructGPT (arXiv 2203.02155)",
        title_zh="Bradley-Terry 奖励模型损失",
        question="Write the reward model's loss.",
        question_zh="写出奖励模型的损失函数。",
        explanation="Bradley-Terry models the probability that the chosen answer beats the rejected one as a "
                    "sigmoid of their reward difference; the loss is its negative log, with an optional "
                    "margin.",
        explanation_zh="Bradley-Terry 模型把被选回答胜过被拒回答的概率写成两者奖励差的 sigmoid；"
                       "损失就是它的负对数，还可以减去一个间隔。",
        hints_zh=("P(y_w 胜过 y_l) = σ(r_w − r_l)；损失是它的负对数。",
                  "`torch.nn.functional.logsigmoid` 就是不会下溢的 log(sigmoid(x))。"),
    ),
    Exercise(
        name="dpo_loss", title="the DPO and IPO losses from per-token log-probabilities", topic="preferences",
        difficulty="medium", minutes=15,
        signature='''def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
             ref_rejected_logps, chosen_mask, rejected_mask, beta: float = 0.1,
             label_smoothing: float = 0.0, loss_type: str = "sigmoid") -> torch.Tensor:
    """DPO's (or IPO's) loss per preference pair, from per-token log-probabilities.

    *_logps: (B, T) the log-prob of each completion token under the policy and under the frozen
    reference (padded positions hold anything); chosen_mask, rejected_mask: (B, T), 1 on the
    completion's own tokens. Returns (B,): one loss per pair.

        log pi(y) = sum_t mask_t logp_t                 loss_type "sigmoid" (DPO)
                  = the same sum / sum_t mask_t         loss_type "ipo" (TRL averages over tokens)
        h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))
        "sigmoid": loss = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)    eps = label_smoothing
        "ipo":     loss = (h - 1 / (2 beta))^2

    (DPO arXiv 2305.18290; IPO arXiv 2310.12036; TRL DPOTrainer.)
    """''',
        reference=dpo_loss, make_cases=dpo_cases, mistakes=DPO_MISTAKES, combine=_dpo_forms,
        output_unit="one loss per pair", output_unit_zh="每个偏好对各一个损失值",
        hints=("Mask, then reduce over tokens: a sum for DPO, a mean over the completion's own tokens for "
               "IPO.",
               "Four sequence log-probs make two log-ratios; h is their difference. F.logsigmoid(beta * h) "
               "is log sigmoid without underflow.",
               "label_smoothing mixes in the loss of the flipped label, -log sigmoid(-beta h)."),
        source="DPO (arXiv 2305.18290); IPO (arXiv 2310.12036); TRL DPOTrainer",
        title_zh="直接偏好优化：从逐 token 对数概率写 DPO 与 IPO 损失",
        question="Write the DPO loss (and IPO's) from the models' per-token log-probabilities.",
        question_zh="从模型的逐 token 对数概率出发，手写 DPO（直接偏好优化）和 IPO 的损失。",
        explanation="DPO trains the policy directly on preference pairs: the implicit reward is beta times "
                    "the log-ratio to the reference, and the loss is Bradley-Terry on those implicit rewards "
                    "(label smoothing mixes in the flipped label). A completion's log-probability is the sum "
                    "of its tokens' log-probs; TRL's IPO uses their mean.",
        explanation_zh="DPO 直接在偏好对上训练策略：隐式奖励是 β 乘以相对参考模型的对数比率，"
                       "损失就是这些隐式奖励上的 Bradley-Terry 损失（标签平滑则按比例混入标签翻转后的损失）"
                       "。一个回答的对数概率是它各个 token 对数概率之和；TRL 的 IPO 用的是平均值。",
        hints_zh=("先乘掩码，再沿 token 归约：DPO 求和，IPO 在回答自己的 token 上求平均。",
                  "四个序列对数概率组成两个对数比率，h 是两者之差。`F.logsigmoid(beta * h)` 是不会下溢的 "
                  "log sigmoid。",
                  "标签平滑混入的是标签翻转时的损失 −log σ(−βh)。"),
    ),
]
