"""The interview drill: the questions of LLM-RL interviews, a model answer to each in English and in
Chinese, what to say in one breath (the interview box), where the lab goes deep, a mock interview, the
myth table's claims, and a Chinese-English glossary (notebook 13, notebooks/GLOSSARY.md).

    from rlhf_lab.teach.drill import QUESTIONS, question_markdown, box_markdown, mock_interview
    QUESTIONS[10].title_zh, QUESTIONS[10].title_en    # Q11: 多轮智能体 / multi-turn agents
    mock_interview(seed=0)                            # a random question, the answer behind a button

The answers are short on purpose: what a candidate can say in a minute, the textbook answer first.
Each notebook section in `deep` holds the measurement behind it. Q1-Q26 follow the usual question
list; Q27-Q33 are the follow-ups that interview write-ups report (part D); Q34-Q37 are the
system-design round (part E, measured in notebook 16).
"""

from __future__ import annotations

import html
import random
import re
from dataclasses import dataclass, field

from ..util.validation import check_choice, check_number, check_optional

# Notebooks linked by file name before they exist (their links are then not checked). None at present.
PLANNED_NOTEBOOKS: tuple[str, ...] = ()

DRILL_NOTEBOOK = "13_interview_drill.ipynb"
BOX_EN = "What to say in an interview"  # the label of an interview box, and of its Chinese twin
BOX_ZH = "面试怎么答"
ANSWER_EN, ANSWER_ZH = "Model answer", "参考答案"
LANGUAGES = ("both", "en", "zh")


@dataclass(frozen=True)
class Section:
    """A place in the lab: a notebook file (relative to notebooks/) and, optionally, one of its
    headings (the text after the #'s, exactly)."""

    notebook: str
    heading: str = ""

    @property
    def anchor(self) -> str:
        """Jupyter's anchor for the heading: the text with spaces turned into dashes."""
        return self.heading.replace(" ", "-")

    @property
    def link(self) -> str:
        target = f"{self.notebook}#{self.anchor}" if self.heading else self.notebook
        label = self.notebook.removesuffix(".ipynb") + (f" — {self.heading}" if self.heading else "")
        return f"[{_escape_md(label)}]({_url(target)})"


@dataclass(frozen=True)
class Question:
    """One interview question: bilingual title, model answer and interview box (`say_*`: one bold
    sentence, then at most two more), and the notebook sections that go deep."""

    number: int
    part: str  # A to E (PARTS)
    title_zh: str
    title_en: str
    answer_en: str  # markdown, the textbook answer in short sentences
    answer_zh: str
    say_en: str  # the interview box: "**one sentence.** at most two more", at most 60 words
    say_zh: str
    deep: tuple[Section, ...] = field(default_factory=tuple)

    @property
    def heading(self) -> str:
        return f"Q{self.number} · {self.title_zh} — {self.title_en}"


PARTS: dict[str, tuple[str, str]] = {
    "A": ("RL fine-tuning: GRPO, PPO, GSPO", "强化学习微调：GRPO、PPO、GSPO"),
    "B": ("Pre-training, SFT and decoding", "预训练、SFT 与解码"),
    "C": ("The RLHF pipeline and classic RL", "RLHF 流程与经典强化学习"),
    "D": ("Follow-up questions from interview write-ups", "面经里的追问"),
    "E": ("System design: distributed and asynchronous RLHF", "系统设计：分布式与异步 RLHF"),
}


def part_heading(part: str) -> str:
    """The drill's `#` heading of a part, e.g. "A. RL fine-tuning: GRPO, PPO, GSPO · 强化学习微调：...". """
    check_choice("part", part, tuple(PARTS))
    en, zh = PARTS[part]
    return f"{part}. {en} · {zh}"


def _url(target: str) -> str:
    """A link target markdown cannot cut short: spaces and parentheses %-encoded, the rest (the
    anchors' dashes and Chinese characters included) as it is, which Jupyter and GitHub both follow."""
    return target.replace("%", "%25").replace(" ", "%20").replace("(", "%28").replace(")", "%29")


def _escape_md(text: str) -> str:
    return text.replace("[", "\\[").replace("]", "\\]")


S = Section  # short name for the tables below
NB03, NB05, NB06, NB07, NB08, NB09 = ("03_kv_cache.ipynb", "05_policy_gradients.ipynb", "06_ppo.ipynb",
                                      "07_grpo.ipynb", "08_gspo.ipynb", "09_showdown.ipynb")
NB07B = "07b_grpo_variants.ipynb"
NB10, NB11, NB12, NB15 = ("10_reward_models.ipynb", "11_reward_hacking.ipynb", "12_dpo.ipynb",
                          "15_moe_and_gspo.ipynb")
EXERCISES2 = "exercises/02_mechanisms_and_coding.ipynb"
GAE_SECTION = S(NB06, "2. Q21 — GAE: from per-token rewards and values to per-token advantages")
KL_SECTION = S(NB06, "5. Q7 — The KL penalty: in the reward (PPO, $k_1$) or in the loss (GRPO, $k_3$)")
PPO_SECTION = S(NB06, "7. Q21, Q22, Q23 — PPO in detail, its hyperparameters, and the clip range")
EPSILON_SECTION = S(NB07, "Where does $\\epsilon = 0.2$ come from, and what do $\\epsilon = 0.05$ or "
                             "$0.5$ do?")
METRICS_SECTION = S(NB07, "Q3 — Which metrics to watch during GRPO training, and what does failure look "
                             "like?")
CREDIT_SECTION = S(NB07, "Q10 — Credit assignment: one reward per answer, one advantage per token?")
PASSES_SECTION = S(NB05, "8. Q8 — On-policy or off-policy? How many passes over one batch?")
Q20_SECTION = S(NB05, "6. Q20 — REINFORCE → baseline → actor-critic → TRPO → PPO: what each step fixes")
NB04 = "04_sft_and_data_format.ipynb"
Q15_HEADING = ("Q15 — Chain-of-thought then answer, or answer then explanation: which generalises better, "
               "and why?")
GSPO_MOE_SECTION = S(NB08, "6. Q14 — Why GSPO helps Mixture-of-Experts models (measured in notebook 15)")
OFFLINE_DPO_SECTION = S(NB12, "5. DPO vs RLHF at equal CPU time")
NB16 = "16_distributed_rlhf.ipynb"
SPLIT_SECTION = S(NB16, "1. Why split generation from training? 为什么要把生成和训练拆开？")
SYNC_SECTION = S(NB16, "2. Moving the weights: one bucket or tensor by tensor? 权重同步")
STALENESS_SECTION = S(NB16, "3. Staleness: how old may a rollout be? 数据陈旧度（staleness）怎么控制？")
MISMATCH_SECTION = S(NB16, "4. The rollout/trainer mismatch: same weights, other probabilities 训推不一致")
ALLREDUCE_SECTION = S(NB16, "5. Data-parallel learners and Ring-AllReduce 梯度聚合与 Ring-AllReduce")
FAULTS_SECTION = S(NB16, "6. Faults, checkpoints and resuming 容错、断点续训与回滚")
SCALE_SECTION = S(NB16, "7. The design round at scale: a 7B PPO on 1,000 GPUs 系统设计：千卡 PPO 框架")

QUESTIONS: tuple[Question, ...] = (
    Question(
        1, "A", "GRPO 偏好对齐项目复盘：标注一致性（Kappa 系数）、奖励模型、KL 系数怎么定？",
        "Walk through a GRPO preference-alignment project: annotator agreement, the reward model, the KL "
        "coefficient",
        "Start with agreement. Cohen's $\\kappa = (p_o - p_e)/(1 - p_e)$ corrects raw agreement for chance. "
        "Landis and Koch read it as: below $0$ poor, $0$–$0.20$ slight, $0.21$–$0.40$ fair, $0.41$–$0.60$ "
        "moderate, $0.61$–$0.80$ substantial, above $0.80$ almost perfect. Random label noise caps what a "
        "reward model can learn from the labels. Then show the reward model's pairwise accuracy per epoch: "
        "train rising while held-out stalls means overfitting. Choose the KL coefficient by plotting a "
        "held-out or gold metric against the KL. Report automatic metrics beside human review: held-out "
        "accuracy, length, diversity, and the win rate against the starting policy.",
        "先讲标注一致性。Cohen's Kappa 系数 $\\kappa = (p_o - p_e)/(1 - p_e)$ 扣除了偶然一致的部分。常用 "
        "Landis 和 Koch 的分级：低于 $0$ 为差，$0$–$0.20$ 为极低，$0.21$–$0.40$ 为一般，$0.41$–$0.60$ "
        "为中等，$0.61$–$0.80$ 为高度一致，$0.80$ 以上为几乎完全一致。标签里的随机噪声决定了奖励模型从这些标"
        "签中能学到的上限。接着展示奖励模型每一轮（epoch）的成对准确率：训练集准确率上升而验证集停滞，"
        "就是过拟合。KL 系数要画出验证集（或金标准）指标随 KL 的变化曲线来选。除了人工评测，"
        "还要报告自动指标：验证集准确率、回答长度、多样性，以及相对初始策略的胜率。",
        "**Report kappa, not raw agreement.** Kappa removes the agreement that chance alone gives, and "
        "Landis and Koch's scale names its level. Random label noise caps what the reward model can learn.",
        "**报告 Kappa 系数，而不是原始一致率。** Kappa 扣除了偶然一致的部分，再用 Landis-Koch "
        "分级说明它落在哪一档。标签里的随机噪声决定了奖励模型能学到的上限。",
        (S(NB10, "2. Q1 — How do you measure annotator agreement?"),
         S(NB10, "4. Q1 — What does the accuracy curve look like, and did it overfit?"), S(NB11))),
    Question(
        2, "A", "什么时候用 SFT，什么时候用蒸馏，什么时候必须上强化学习？",
        "When is SFT enough, when distillation, when RL?",
        "SFT copies demonstrations. It is enough when good answers exist and you can write them down. "
        "Distillation copies a stronger model's outputs or distributions. It is cheaper than RL when such a "
        "teacher exists. RL needs only a way to score answers. It improves what the model already samples, "
        "and cannot reward what the model never produces, so it comes after SFT. They chain: SFT, then "
        "distillation, then RL.",
        "SFT 模仿示范数据：能写出好答案时，SFT 就够了。蒸馏模仿更强模型的输出或概率分布："
        "有这样的教师模型时，它比强化学习便宜。强化学习只需要一个能给答案打分的办法，"
        "它在模型已经能采样到的答案上继续提升；模型从来生成不出的答案，它无从奖励，所以要放在 SFT 之后。"
        "三者可以串起来：先 SFT，再蒸馏，最后强化学习。",
        "**SFT when you can write good answers, distillation when a stronger model can, RL when you can only "
        "score them.** In practice they chain. RL starts from the SFT model, because it can only reward what "
        "the model already samples.",
        "**自己能写出好答案就用 SFT，有更强的模型能写就用蒸馏，只能打分时才用强化学习。** "
        "实践中三者串联使用。强化学习从 SFT 模型出发，因为它只能奖励模型已经采样得到的答案。",
        (S(NB09, "5. Q2 — SFT, distillation or RL?"),
         S("04_sft_and_data_format.ipynb",
           "4. How the shipped RL starting checkpoint was made, and why RL wants a half-right model"))),
    Question(
        3, "A", "GRPO 训练时要监控哪些指标？奖励上升但真实效果下降（奖励黑客）怎么办？",
        "Which metrics do you watch in GRPO training, and what if reward rises while quality falls?",
        "Watch the reward mean and std, and the share of groups whose rewards are all equal: they give no "
        "gradient. Watch the KL to the reference, the clip fraction, the entropy, the completion length and "
        "truncation rate, the gradient norm, and a held-out metric the optimiser never sees. Entropy "
        "falling fast is entropy collapse: exploration stops. Reward rising while the held-out metric falls "
        "is reward hacking: the policy found what the reward over-values. Fix the reward, add a KL or "
        "ensemble penalty, or stop early.",
        "要看奖励的均值和标准差，以及组内奖励全部相同的组所占的比例（这些组不产生梯度）。还要看与参考模型的 "
        "KL、裁剪比例、熵、回答长度和截断率、梯度范数，以及一个优化器看不到的验证集指标。"
        "熵快速下降说明出现了熵坍缩，模型不再探索。奖励上升而验证集指标下降，就是奖励黑客："
        "策略找到了奖励函数高估的东西。对策是修正奖励、加 KL 惩罚或基于奖励模型集成的惩罚，"
        "或者提前停止训练。",
        "**Watch reward mean and std, zero-std groups, KL, clip fraction, entropy, length, and a held-out "
        "metric.** Reward up while the held-out metric goes down is reward hacking. Fix the reward, tighten "
        "the KL, or stop early.",
        "**盯住奖励的均值和标准差、零方差组的比例、KL、裁剪比例、熵、回答长度，以及一个验证集指标。** "
        "奖励上升而验证集指标下降，就是奖励黑客。对策是修正奖励、加强 KL 约束，或者提前停止。",
        (METRICS_SECTION, S(NB11, "2. Q3 — Why does the reward go up while quality goes down?"))),
    Question(
        4, "A", "写出 GRPO 的损失函数，并解释每一项", "Write the GRPO loss and explain every term",
        "$L = -\\frac{1}{G}\\sum_i \\frac{1}{|o_i|}\\sum_t \\min(r_{it} A_i,\\ \\mathrm{clip}(r_{it}, "
        "1-\\epsilon, 1+\\epsilon) A_i) + \\beta\\, k_3$. Here $r_{it}$ is the token's importance sampling "
        "ratio to the sampling policy. $A_i$ is the group-normalised reward, the same for every token of "
        "answer $i$. The min with the clip is a pessimistic bound: it stops pushing once the ratio has "
        "moved by $\\epsilon$. $\\beta k_3$ is the KL to the reference model. $\\epsilon = 0.2$ comes from "
        "the PPO paper's sweep on control tasks. A smaller $\\epsilon$ clips more and learns slower; a "
        "larger one lets noisy steps through.",
        "$L = -\\frac{1}{G}\\sum_i \\frac{1}{|o_i|}\\sum_t \\min(r_{it} A_i,\\ \\mathrm{clip}(r_{it}, "
        "1-\\epsilon, 1+\\epsilon) A_i) + \\beta\\, k_3$。其中 $r_{it}$ 是该 token "
        "相对采样策略的重要性采样比率；$A_i$ 是组内归一化后的奖励，同一个回答的所有 token 共用。"
        "对未裁剪项和裁剪项取 min，得到的是悲观下界：比率偏离超过 $\\epsilon$ 之后就不再继续推动。$\\beta "
        "k_3$ 是与参考模型之间的 KL。$\\epsilon = 0.2$ 来自 PPO 论文在控制任务上的调参。$\\epsilon$ 越小，"
        "被裁剪的 token 越多，学得越慢；越大，噪声大的更新越容易通过。",
        "**The GRPO loss is PPO's clipped surrogate with a group-normalised advantage, plus $\\beta$ times "
        "a KL to the reference.** With a positive advantage the clip stops the push above $1 + \\epsilon$, "
        "with a negative one below $1 - \\epsilon$. Clipped tokens give no gradient.",
        "**GRPO 的损失就是 PPO 的裁剪替代目标，优势换成组内归一化的奖励，再加上 $\\beta$ 乘以与参考模型的 "
        "KL。** 优势为正时，比率超过 $1 + \\epsilon$ 就不再推动；优势为负时，低于 $1 - \\epsilon$ "
        "就不再推动。被裁剪的 token 没有梯度。",
        (S(NB07, "Q4 — The GRPO loss, term by term"), EPSILON_SECTION)),
    Question(
        5, "A", "为什么用优势函数，而不直接用原始奖励？", "Why advantages and not raw rewards?",
        "Subtracting a baseline leaves the expected gradient unchanged and removes much of its variance. A "
        "per-prompt baseline also removes prompt difficulty: a correct answer to an easy prompt is no news. "
        "Dividing by the group std fixes the scale, but it also weights prompts by difficulty. Every group "
        "with mixed results then has the same advantage norm, $\\sqrt{G-1}$. So nearly-solved and "
        "nearly-hopeless prompts weigh as much as half-right ones. Dr. GRPO calls this the "
        "question-difficulty bias and drops the std. Raw rewards also work when they are already centred, "
        "or with huge batches, only more slowly.",
        "减去基线不改变梯度的期望，却能去掉大部分方差。按题目计算的基线还消掉了题目难度：简单题答对了，"
        "并不提供新信息。除以组内标准差统一了尺度，但也按难度给题目重新加了权：每个有对有错的组，"
        "优势向量的范数都是 $\\sqrt{G-1}$。于是几乎全对和几乎全错的题，权重和对错各半的题一样大。Dr. GRPO "
        "把这称为题目难度偏差，并去掉了除以标准差这一步。奖励本身已经是零均值时，或者批量非常大时，"
        "直接用原始奖励也能学，只是更慢。",
        "**A baseline removes variance and prompt difficulty without biasing the gradient, and the std fixes "
        "the scale.** Dividing by the std also up-weights nearly-solved and nearly-hopeless prompts, which "
        "Dr. GRPO removes. With 0/1 rewards, raw reward never pushes a wrong answer down.",
        "**基线在不引入偏差的前提下降低方差、消掉题目难度，除以标准差则统一尺度。** "
        "但除以标准差也放大了几乎全对和几乎全错的题，Dr. GRPO 因此去掉了这一步。奖励为 0/1 时，"
        "直接用原始奖励永远不会把错误答案往下压。",
        (S(NB05, "3. Q5 — Why advantages and not raw rewards? Baselines"),
         S(NB07B, "The question-difficulty bias: dividing by the group std"))),
    Question(
        6, "A", "重要性采样：为什么需要它？为什么要裁剪？", "Importance sampling: why, and why clip?",
        "After the first optimiser step, the batch was sampled by an older policy. Weighting each token by "
        "$r_t = \\pi_\\theta/\\pi_{old}$ corrects the action probabilities. It does not correct the "
        "distribution of the states (the prefixes), which $\\pi_{old}$ produced. The result is PPO's "
        "surrogate objective. Its gradient equals the policy gradient only at $\\theta = \\theta_{old}$, "
        "and nearby it is a first-order approximation, not an unbiased estimate. The exact weight of a "
        "whole answer is the product of its token ratios, whose variance explodes with length. The clip "
        "keeps $\\theta$ where the surrogate is trustworthy: past $1 \\pm \\epsilon$ a token gives no "
        "further gradient.",
        "第一次参数更新之后，这批数据就成了旧策略采样的数据。给每个 token 乘上 $r_t = \\pi_\\theta/\\pi_{old"
        "}$，修正的只是动作的概率；状态（也就是前缀）的分布仍然来自 $\\pi_{old}$。这样得到的是 PPO "
        "的替代目标：它的梯度只在 $\\theta = \\theta_{old}$ 处等于策略梯度，在附近只是一阶近似，"
        "并不是无偏估计。整条回答的精确权重是各 token 比率的乘积，方差随长度爆炸式增长。裁剪让 $\\theta$ "
        "留在替代目标可信的范围内：比率超出 $1 \\pm \\epsilon$ 后，这个 token 不再产生梯度。",
        "**Per-token ratios give PPO's surrogate objective, which is exact only at $\\theta = "
        "\\theta_{old}$.** It stays a good approximation while the policy moves little. The clip bounds how "
        "far one batch can push each token's probability.",
        "**逐 token 的重要性采样比率给出的是 PPO 的替代目标，它只在 $\\theta = \\theta_{old}$ 处精确。** "
        "策略变化不大时，它仍是不错的近似。裁剪限制了一批数据能把每个 token 的概率推多远。",
        (S(NB05, "4. Q6 — Importance sampling: reusing a batch"),
         S(NB05, "5. Clipping: the PPO surrogate (what GRPO uses too)"))),
    Question(
        7, "A", "GRPO 的 KL 和 PPO 的 KL 一样吗？", "Is GRPO's KL the same as PPO's?",
        "Same target, different place and estimator. PPO subtracts $\\beta k_1 = \\beta(\\log\\pi - "
        "\\log\\pi_{ref})$ from each token's reward, so the KL enters the advantages. GRPO adds $\\beta "
        "k_3$ to the loss. Both use the starting policy, usually the SFT model, as the reference.",
        "目标相同，位置和估计量不同。PPO 从每个 token 的奖励里减去 $\\beta k_1 = \\beta(\\log\\pi - "
        "\\log\\pi_{ref})$，KL 因此进入优势。GRPO 把 $\\beta k_3$ 直接加在损失上。"
        "两者的参考模型都是训练起点的"
        "策略，通常就是 SFT 模型。",
        "**PPO puts $-\\beta k_1$ into each token's reward; GRPO adds $\\beta k_3$ to the loss.** Both "
        "measure the KL to the same reference, the starting policy. Per token, $k_3$ is never negative and "
        "$k_1$ often is.",
        "**PPO 把 $-\\beta k_1$ 加进每个 token 的奖励，GRPO 把 $\\beta k_3$ 加在损失上。** "
        "两者的参考模型相同，"
        "都是训练起点的策略。逐 token 看，$k_3$ 永远非负，$k_1$ 经常为负。",
        (S(NB07, "Q7 — Is GRPO's KL the same as PPO's?"), KL_SECTION)),
    Question(
        8, "A", "GRPO 是 On-Policy 还是 Off-Policy（同策略/异策略）？为什么不在同一批数据上多训几轮？",
        "On-policy or off-policy? Why not many more epochs on one batch?",
        "PPO and GRPO are on-policy methods that tolerate a little off-policy data. They make a few passes "
        "over one batch, corrected by importance ratios and bounded by the clip. Each extra pass drifts "
        "further from the sampling policy. Ratios spread, more tokens are clipped and give no gradient, and "
        "the data goes stale. Measure the clip fraction and a held-out metric against the number of passes, "
        "rather than trust a rule of thumb.",
        "PPO 和 GRPO 是同策略（On-Policy）方法，但能容忍少量异策略数据：在一批数据上更新几轮，"
        "用重要性采样比率修正，再用裁剪限制幅度。每多一轮，当前策略离采样策略就更远：比率更分散，"
        "被裁剪（不产生梯度）的 token 更多，数据也越来越旧。与其相信经验法则，不如实际测一测裁剪比例和验证集"
        "指标随轮数的变化。",
        "**On-policy with a little reuse: a few passes per batch, corrected by ratios and bounded by the "
        "clip.** Each extra pass clips more tokens and uses staler data. Measure the clip fraction and a "
        "held-out metric as you add passes.",
        "**同策略，允许少量复用：每批数据训几轮，用比率修正、用裁剪约束。** 每多一轮，被裁剪的 token 更多，"
        "数据也更旧。增加轮数时，要同时看裁剪比例和验证集指标。",
        (PASSES_SECTION,)),
    Question(
        9, "A", "PPO 和 GRPO 分别怎么得到优势？", "How do PPO and GRPO get their advantages?",
        "PPO learns a critic, the value function $V$. It forms TD errors $\\delta_t = r_t + \\gamma V_{t+1} "
        "- V_t$ and sums them with GAE. That gives one advantage per token, at the cost of a second "
        "network: memory, compute, and a critic that must fit. GRPO samples $G$ answers per prompt and uses "
        "the group's mean (and std) as the baseline. That gives one advantage per answer, with no critic, "
        "for $G$ times the generation.",
        "PPO 训练一个价值模型（critic）来估计 $V$，计算时序差分（TD）误差 $\\delta_t = r_t + \\gamma "
        "V_{t+1} - V_t$，再用广义优势估计（GAE）加权求和，得到每个 token 各自的优势。代价是多一个网络："
        "显存、计算量，而且价值模型得真的拟合好。GRPO 对每道题采样 $G$ 个回答，用组内均值（和标准差）"
        "作为基线：每个回答一个优势，不需要价值模型，但生成量是原来的 $G$ 倍。",
        "**PPO gets a per-token advantage from a critic and GAE; GRPO gets one advantage per answer from its "
        "group's mean.** GRPO trades the critic's memory and training for $G$ samples per prompt.",
        "**PPO 用价值模型和 GAE 得到逐 token 的优势，GRPO 用组内均值为每个回答得到一个优势。** GRPO "
        "省掉了价值"
        "模型的显存和训练，代价是每道题要采样 $G$ 次。",
        (S(NB07, "Q9 — How does PPO get its advantages, and how does GRPO?"), GAE_SECTION)),
    Question(
        10, "A", "信用分配：一个回答只有一个奖励，每个 token 的优势从哪里来？",
        "Credit assignment: one reward, which tokens earned it?",
        "Outcome-reward methods give every token of an answer the same advantage. So a right step in a "
        "wrong answer is pushed down with the rest. Only averaging over many samples separates them. A "
        "critic (GAE) can tell tokens apart, but only if it learns to. Process rewards or token-level "
        "rewards score the steps directly.",
        "只看结果奖励的方法，给一个回答的所有 token 相同的优势。于是错误答案里正确的步骤也会一起被压低，"
        "只有在大量样本上取平均，才能把它们区分开。价值模型加 GAE 原则上能区分不同的 token，"
        "前提是它真的学会了。过程奖励或 token 级奖励则直接给每一步打分。",
        "**Outcome rewards blame every token of a wrong answer, right steps included.** Only many samples "
        "average it out. Process rewards, or a critic that has learned, assign credit per step.",
        "**结果奖励会让错误答案里的每个 token 一起受罚，正确的步骤也不例外。** 只有大量采样才能把它平均掉。"
        "过程奖励，或者真正学好了的价值模型，才能按步骤分配信用。",
        (CREDIT_SECTION,)),
    Question(
        11, "A", "多轮智能体和单轮有什么不同？误差累积、上下文增长、停止条件、跨轮信用分配",
        "Multi-turn agents vs single turn",
        "Each turn's output becomes the next turn's input, so errors compound: episode success is roughly "
        "the product of the turns' success. The context grows with every tool result. The episode needs a "
        "stop rule; for example, a turn the environment cannot parse ends it. One episode reward must be "
        "shared across turns. Given to every turn, it punishes a correct early turn for a later mistake. "
        "Per-turn (process) rewards or turn-level critics fix the credit, at the cost of judging each turn.",
        "每一轮的输出都是下一轮的输入，所以误差会累积：整个回合的成功率大致是各轮成功率的乘积。"
        "每次工具返回结果，上下文都会变长。回合需要一个停止规则，例如环境无法解析某一轮的输出时就结束。"
        "整个回合只有一个奖励，却要分给各轮：如果每一轮都拿同一个奖励，前面做对的轮次会因为后面的错误而受罚"
        "。按轮给奖励（过程奖励）或按轮估计价值可以修正信用分配，代价是每一轮都要评判。",
        "**Errors compound over turns, the context grows, and one episode reward punishes good early turns "
        "for later mistakes.** Per-turn rewards or a turn-level critic fix the credit. Give the episode a "
        "clear stop rule.",
        "**多轮时误差逐轮累积、上下文不断变长，而整个回合只有一个奖励，会让前面做对的轮次替后面的错误受罚。"
        "** "
        "按轮给奖励或按轮估计价值可以修正信用分配。回合还要有明确的停止规则。",
        (CREDIT_SECTION,)),
    Question(
        12, "A", "手撕代码：整数平方根（二分查找与牛顿迭代）",
        "Coding: integer square root by binary search and by Newton's method",
        "Binary search over $[0, n]$ for the largest $m$ with $m^2 \\le n$. Take the midpoint as $lo + (hi "
        "- lo) // 2$, so that it cannot overflow in fixed-width integers. Test $m \\le n // m$ instead of "
        "$m^2 \\le n$. That is $O(\\log n)$ steps. Newton's method on $f(x) = x^2 - n$ iterates $x "
        "\\leftarrow (x + n // x) // 2$ from $x = n$ and stops when $x$ stops decreasing; it converges "
        "quadratically. Test $0, 1, 2, 3, 4$, perfect squares, and the largest input.",
        "二分查找：在 $[0, n]$ 中找满足 $m^2 \\le n$ 的最大 $m$。中点写成 $lo + (hi - lo) // 2$，"
        "在定长整数下不会溢出；判断条件用 $m \\le n // m$ 代替 $m^2 \\le n$。总共 $O(\\log n)$ 步。"
        "牛顿迭代：对 $f(x) = x^2 - n$，从 $x = n$ 开始迭代 $x \\leftarrow (x + n // x) // 2$，直到 $x$ "
        "不再下降为止，二次收敛。测试用例要包括 $0, 1, 2, 3, 4$、完全平方数和最大输入。",
        "**Binary search with an overflow-safe midpoint and the test $m \\le n // m$; Newton's method $x "
        "\\leftarrow (x + n // x) // 2$ until it stops decreasing.** Then test the edge cases out loud: $0$, "
        "$1$, perfect squares, the largest input.",
        "**二分查找用防溢出的中点和 $m \\le n // m$ 的判断；牛顿迭代 $x \\leftarrow (x + n // x) // 2$，"
        "直到不再"
        "下降。** 写完要主动讲边界用例：$0$、$1$、完全平方数、最大输入。",
        (S(EXERCISES2),)),
    Question(
        13, "A", "GRPO 相比 PPO 去掉了价值模型（critic），省下了什么？",
        "GRPO vs PPO: what does removing the critic save?",
        "It saves the critic's parameters, its optimiser states, its gradients and activations, and its "
        "forward and backward passes. How much depends on the critic. A value head on the shared trunk costs "
        "almost nothing. A separate critic the size of the policy adds one more model plus its Adam states. "
        "Measure it rather than quote a percentage.",
        "省下的是价值模型的参数、优化器状态、梯度和激活值，以及它的前向和反向计算。"
        "省多少取决于价值模型的形式："
        "如果只是共享主干上的一个价值头，几乎不占资源；如果是和策略一样大的独立模型，就多出一整个模型，"
        "外加它的 "
        "Adam 状态。与其引用一个百分比，不如实际测一下。",
        "**It depends on the critic: a value head on the shared trunk costs almost nothing, while "
        "a separate critic adds a whole model and its Adam states.** Count the weights, gradients "
        "and optimiser states of every model held.",
        "**取决于价值模型的形式：共享主干上的价值头几乎不占资源，独立的价值模型则要多出整个模型和它"
        "的 Adam 状态。"
        "** 要把每个模型的参数、梯度和优化器状态都算上。",
        (S(NB06, "8. Q13 — What does dropping the critic save? Memory measured"), S("14_scale_up.ipynb"))),
    Question(
        14, "A", "GSPO（组序列策略优化）：为什么要用序列级重要性比率？",
        "GSPO: why sequence-level importance ratios?",
        "GSPO's ratio is the length-normalised sequence likelihood ratio $s_i = (\\pi/\\pi_{old})^{1/|y_i|}$"
        ". There is one per answer, matching the sequence-level reward, and clipping keeps or drops whole "
        "answers. Token ratios are noisy, and in MoE models routing changes make them noisier still. GSPO's "
        "clip range is smaller ($3 \\times 10^{-4}$ and $4 \\times 10^{-4}$ against $0.2$), not larger; the "
        "share of clipped tokens is what is larger.",
        "GSPO 的比率是按长度归一化的序列似然比 $s_i = (\\pi/\\pi_{old})^{1/|y_i|}$，每个回答一个，"
        "与序列级奖励"
        "相对应；裁剪时，整条回答要么保留、要么丢弃。逐 token 的比率噪声大，在混合专家（MoE）模型里，"
        "路由变化让"
        "噪声更大。GSPO 的裁剪范围更小（$3 \\times 10^{-4}$ 和 $4 \\times 10^{-4}$，而 GRPO 是 $0.2$），"
        "而不是"
        "更大；更大的是被裁剪的 token 所占的比例。",
        "**GSPO uses one length-normalised ratio per answer, so the ratio and the clip work on the same unit "
        "as the reward.** Its clip range is far smaller than GRPO's, not larger. It helps MoE models, whose "
        "token ratios also carry routing noise.",
        "**GSPO 每个回答只用一个按长度归一化的比率，比率和裁剪的单位与奖励一致。** 它的裁剪范围比 GRPO "
        "小得多，"
        "而不是更大。它对 MoE 模型有帮助，因为那里逐 token 的比率还夹杂着路由变化带来的噪声。",
        (S(NB08, "4. Q14 — The clipped fraction: GSPO vs GRPO, and the \"larger clip range\" myth"),
         GSPO_MOE_SECTION,
         S(NB15, "6. Q14 (MoE part) in an interview, and the \"load imbalance\" folklore"))),
    Question(
        15, "B", "SFT 数据格式：先推理后答案，还是先答案后解释？", "SFT data: reasoning first or answer "
                                              "first?",
        "Reasoning first. The answer tokens are then conditioned on the worked steps, so the model can use "
        "them as computation. An explanation written after the answer cannot help produce it. Measure "
        "held-out and out-of-distribution accuracy of both formats on the same budget.",
        "先推理后答案。这样答案的 token 以推理步骤为条件，模型可以把这些步骤当作计算过程来用。"
        "写在答案之后的解释，对生成答案本身没有帮助。要在相同的训练预算下，比较两种格式在验证集和分布外数据"
        "上的准确率。",
        "**Reasoning first, so that the answer can be computed from the steps.** An explanation after the "
        "answer cannot help produce it. Compare both formats on held-out and out-of-distribution data at the "
        "same budget.",
        "**先推理后答案，答案才能由推理步骤算出来。** 写在答案后面的解释帮不上生成答案的忙。要在相同预算下，"
        "比较两种格式在验证集和分布外数据上的表现。",
        (S(NB04, Q15_HEADING),)),
    Question(
        16, "B", "为什么越靠后的 token 概率越高？温度、核采样（top-p）和重复惩罚怎么改变分布？",
        "Why are later tokens more probable? Temperature, top-p, repetition penalty",
        "The textbook reason: a later token is conditioned on more context, and more conditioning can only "
        "lower the expected entropy. For a stationary source, $H(X_t \\mid X_{<t})$ does not grow with $t$. "
        "It is a tendency, not a law: a token's probability depends on how much the task has already "
        "decided it. Temperature divides the logits: sharper below $1$, flatter above. Top-p keeps the "
        "smallest set of tokens whose probability reaches $p$. The repetition penalty lowers the logits of "
        "tokens already present, and it is sign-aware.",
        "教科书式的解释：越靠后的 token 依赖的上下文越多，而条件越多，期望熵只会越低；对平稳信源，$H(X_t "
        "\\mid X_{<t})$ 不随 $t$ 增大。但这只是趋势，不是定律：一个 token 的概率取决于任务在这一步已经把它确"
        "定了多少。温度把 logits 除以 $T$：小于 $1$ 时分布更尖锐，大于 $1$ 时更平坦。核采样（top-p）"
        "保留累计概率达到 $p$ 的最小 token 集合。重复惩罚压低已出现 token 的 logit，并且区分 logit 的正负。",
        "**Later tokens see more context, and more context means lower entropy on average: a tendency, "
        "not a law.** A token the task pins down is probable at any position. Temperature rescales "
        "the logits, top-p cuts the tail.",
        "**越靠后的 token 看到的上下文越多，平均而言熵越低，但这只是趋势，不是定律。** 任务已经确定的 token，"
        "在哪个位置概率都高。温度缩放 logits，核采样截掉长尾。",
        (S("01_sampling.ipynb", "Q16 — Why are later tokens of a sequence more confident?"),
         S("01_sampling.ipynb",
           "Q16, second half — temperature, top-p and the repetition penalty: the folklore checked"))),
    Question(
        17, "B", "旋转位置编码（RoPE）：手写实现", "RoPE: write it",
        "Rotate each pair of query and key dimensions by the angle $m\\theta_i$, with $\\theta_i = "
        "10000^{-2i/d}$. Then $\\langle R_m q, R_n k\\rangle$ depends on $m - n$ only. In complex form, "
        "multiply by $e^{im\\theta_i}$. Two pairings exist, interleaved and rotate-half; they agree after "
        "permuting the projection rows. Compute the angles in fp32: fp16 positions and angles lose "
        "precision.",
        "把 q、k 的每一对维度旋转角度 $m\\theta_i$，其中 $\\theta_i = 10000^{-2i/d}$。这样 $\\langle R_m q, "
        "R_n k\\rangle$ 只依赖于 $m - n$。写成复数形式，就是乘以 $e^{im\\theta_i}$。维度的配对有两种约定："
        "相邻两维配对，或前后两半配对；对投影矩阵的行做一次置换后，两者等价。角度要用 fp32 计算：fp16 "
        "下的位置和角度会丢失精度。",
        "**RoPE rotates each pair of query and key dimensions by an angle proportional to the position, so "
        "their dot product depends only on the offset.** The two pairing conventions agree after a "
        "permutation. Compute the angles in fp32.",
        "**RoPE 按位置把 q、k 的每一对维度旋转相应的角度，所以两者的点积只取决于相对位置。** "
        "两种配对约定经过一次置换即可互换。角度要用 fp32 计算。",
        (S("02_rope.ipynb", "Q17 — The two pairing conventions, and the permutation between them"),
         S("02_rope.ipynb", "Q17 — fp16 and bf16 pitfalls"))),
    Question(
        18, "B", "KV cache：占多少显存？分页存储、前缀共享和量化",
        "KV cache: memory, paging, prefix sharing, quantization",
        "Bytes $= 2 \\cdot L \\cdot n_{kv} \\cdot d_{head} \\cdot T \\cdot B \\cdot$ bytes per element. "
        "Paged storage allocates fixed-size blocks through a block table. Memory is then not reserved for "
        "the maximum length, and the samples of one prompt can share the prompt's blocks. An int8 cache "
        "halves memory again for a small error. Decoding with a cache does one token of work per step "
        "instead of the whole prefix.",
        "字节数 $= 2 \\cdot L \\cdot n_{kv} \\cdot d_{head} \\cdot T \\cdot B \\cdot$ 每个元素的字节数。"
        "分页存储通过"
        "块表分配固定大小的块，不必按最大长度预留显存，同一提示词的多个采样还能共享提示词所在的块。int8 "
        "量化的缓存"
        "再省一半显存，误差很小。有了缓存，解码每一步只需计算一个新 token，而不必重新计算整个前缀。",
        "**A KV cache stores $2 L n_{kv} d_{head}$ values per token, so decoding does one token of work per "
        "step.** Paging avoids reserving the maximum length and lets samples share the prompt. Quantizing to "
        "int8 halves the memory again.",
        "**KV cache 每个 token 存 $2 L n_{kv} d_{head}$ 个数，解码每步只需计算一个新 token。** "
        "分页存储不必按最大长度预留，还能让多个采样共享提示词。int8 量化再省一半。",
        (S(NB03, "Q18 — How much memory does the KV cache take?"),
         S(NB03, "Q18 — Paged storage and prefix sharing"))),
    Question(
        19, "C", "RLHF 的三个阶段；大模型的状态、动作和奖励分别是什么？",
        "The three RLHF stages; state, action, reward",
        "SFT on demonstrations, then a reward model trained on human preference pairs, then RL against it "
        "with a KL to the SFT model. State: the prompt plus the tokens so far. Action: the next token, one "
        "of the vocabulary, a discrete choice. Reward: usually one score for the finished answer, plus the "
        "per-token KL penalty.",
        "先在示范数据上做 SFT，再用人类偏好对训练奖励模型，最后以奖励模型为目标做强化学习，同时用 KL "
        "约束策略不要偏离 SFT 模型。状态：提示词加上已经生成的 token。动作：下一个 token，从词表中选一个，"
        "是离散的。奖励：通常是整个回答结束后的一个分数，外加逐 token 的 KL 惩罚。",
        "**SFT, then a reward model from preference pairs, then RL with a KL leash to the SFT model.** The "
        "state is the prompt plus the tokens so far, the action is the next token, and the reward usually "
        "comes once at the end.",
        "**先 SFT，再用偏好对训练奖励模型，最后在 KL 约束下做强化学习。** 状态是提示词加已生成的 token，"
        "动作是"
        "下一个 token，奖励通常只在回答结束时给一次。",
        (S(NB05, "1. Q19 — The RLHF pipeline, and state, action, reward for an LLM"),
         S(NB10, "6. Q19 — The three stages, end to end"))),
    Question(
        20, "C", "REINFORCE → 基线 → 演员-评论家 → TRPO → PPO：每一步解决了什么问题？",
        "REINFORCE to PPO: what each step fixes",
        "REINFORCE is unbiased but noisy. A baseline cuts the variance. A critic makes the baseline "
        "state-dependent and allows bootstrapping. TRPO bounds each step with a hard KL constraint, a trust "
        "region solved with second-order methods. PPO gets most of that with a first-order clipped "
        "objective, which several minibatch passes can reuse.",
        "REINFORCE 无偏，但方差大。加入基线降低了方差。演员-评论家（Actor-Critic）用价值模型让基线随状态变化"
        "，还能用自举（bootstrapping）估计回报。TRPO 用严格的 KL 约束（信任域）限制每一步，"
        "需要二阶方法求解。PPO 用一阶的裁剪目标得到了大部分效果，而且同一批数据可以分成小批量更新多轮。",
        "**Each step reduces variance or bounds the step: baseline, critic, trust region, clip.** TRPO's "
        "trust region is a hard KL constraint; PPO approximates it with a first-order clip.",
        "**每一步要么降低方差，要么限制步长：基线、价值模型、信任域、裁剪。** TRPO 的信任域是硬性的 KL "
        "约束，PPO 用一阶的裁剪来近似它。",
        (Q20_SECTION,)),
    Question(
        21, "C", "PPO 细节：广义优势估计（GAE）、裁剪的比率、价值损失",
        "PPO in detail: GAE, the clipped ratio, the value loss",
        "Advantages come from GAE over per-token rewards: the score on the last token, the KL penalty on "
        "every token. They are whitened. The policy loss is $-\\min(rA, \\mathrm{clip}(r)A)$. The value "
        "loss is clipped too, and fits the returns $R_t = A_t + V_t$. The clip approximates a trust region: "
        "past $1 \\pm \\epsilon$ the objective is flat, so the gradient stops pulling the token further.",
        "优势由广义优势估计（GAE）在逐 token 奖励上计算：最后一个 token 拿到得分，每个 token 都有 KL 惩罚。"
        "优势还要做白化（减均值、除以标准差）。策略损失是 $-\\min(rA, \\mathrm{clip}(r)A)$。"
        "价值损失同样做裁剪，拟合回报 $R_t = A_t + V_t$。裁剪近似一个信任域：比率超出 $1 \\pm \\epsilon$ "
        "后目标函数变平，梯度不再把这个 token 往外推。",
        "**GAE turns per-token rewards and values into per-token advantages; the policy loss is the clipped "
        "surrogate; the value loss fits the returns, clipped as well.** Past $1 \\pm \\epsilon$ the "
        "objective is flat, which approximates a trust region.",
        "**GAE 把逐 token 的奖励和价值变成逐 token 的优势；策略损失是裁剪后的替代目标；价值损失拟合回报，"
        "同样做"
        "裁剪。** 比率超出 $1 \\pm \\epsilon$ 后目标变平，这近似一个信任域。",
        (PPO_SECTION, S(NB06, "4. Value clipping"))),
    Question(
        22, "C", "PPO 的典型超参数有哪些？为什么这么取？", "Typical PPO hyperparameters, and why",
        "Typical LLM values: clip $\\epsilon \\approx 0.2$, $\\gamma = 1$ and $\\lambda \\approx 0.95$ (or "
        "$1$). Episodes are short and the reward comes at the end, so nothing needs discounting. The "
        "learning rate is about $10^{-6}$ to $10^{-5}$, and the KL coefficient about $0.01$ to $0.1$, or "
        "adaptive. Use one to four epochs per batch, and clip gradients at norm $1$. The learning rate is "
        "orders of magnitude below pre-training, because the policy starts good and a large step destroys "
        "it. The lab's tiny model trains at $2 \\times 10^{-4}$. Sweep on your own setup.",
        "大模型上的常见取值：裁剪 $\\epsilon \\approx 0.2$，$\\gamma = 1$，$\\lambda$ 取 $0.95$ "
        "左右（也常用 $1$）。回合很短、奖励在最后，所以不需要折扣。学习率约为 $10^{-6}$ 到 $10^{-5}$，KL "
        "系数约为 $0.01$ 到 $0.1$，或者用自适应 KL。每批数据训练一到四轮，梯度裁剪的范数上限取 $1$。"
        "学习率比预训练低几个数量级，因为策略一开始就不错，大步更新会把它毁掉。本项目的小模型用 $2 \\times "
        "10^{-4}$。具体数值要在自己的设置上调。",
        "**Clip $0.2$, $\\gamma = 1$, $\\lambda$ near $1$, a learning rate of $10^{-6}$ to $10^{-5}$, a KL "
        "coefficient of $0.01$ to $0.1$, a few epochs, gradient clipping.** The learning rate is tiny "
        "because the policy starts good. Sweep on your own setup.",
        "**裁剪取 $0.2$，$\\gamma = 1$，$\\lambda$ 接近 $1$，学习率 $10^{-6}$ 到 $10^{-5}$，KL 系数 $0.01$ "
        "到 "
        "$0.1$，每批训几轮，再加梯度裁剪。** 学习率很小，是因为策略一开始就不错。"
        "具体数值要在自己的设置上调。",
        (PPO_SECTION,)),
    Question(
        23, "C", "裁剪范围太大或太小会怎样？", "Clip range too large or too small",
        "Too small: most tokens are clipped after the first minibatch and give no gradient, so learning "
        "slows. Too large: nothing bounds a step, so a few noisy ratios dominate and training can become "
        "unstable. Read it on the clip fraction and the KL.",
        "太小：第一个小批量之后，大多数 token 都被裁剪，不再产生梯度，学习变慢。太大："
        "没有什么能约束每一步的幅度，"
        "少数噪声很大的比率主导更新，训练可能变得不稳定。看裁剪比例和 KL 就能判断。",
        "**Too small and most tokens give no gradient; too large and nothing bounds the step.** Read it on "
        "the clip fraction and the KL, over several seeds.",
        "**太小，大多数 token 没有梯度；太大，每一步的幅度没有约束。** 要看裁剪比例和 KL，"
        "并且跑多个随机种子。",
        (EPSILON_SECTION, PPO_SECTION)),
    Question(
        24, "C", "RLHF 的奖励怎么设计？", "Designing an RLHF reward",
        "A preference score from the reward model, plus auxiliary rule-based terms (format, length, "
        "correctness checks), minus a KL to the reference. The KL keeps the policy where the reward model is "
        "trustworthy. Every term is something the policy will exploit, so test each for the cheapest way to "
        "game it.",
        "奖励模型给出的偏好分数，加上基于规则的辅助项（格式、长度、正确性检查），再减去与参考模型的 KL。KL "
        "让策略"
        "留在奖励模型可信的范围内。每一项都会被策略钻空子，所以要逐项检查，找出最容易的作弊方式。",
        "**Reward = preference score + rule-based terms − a KL to the reference.** Every term is something "
        "the policy will game, so test each for its cheapest exploit.",
        "**奖励 = 偏好分数 + 规则项 − 与参考模型的 KL。** 每一项都会被策略钻空子，"
        "要逐项找出最容易被利用的漏洞。",
        (S(NB11, "6. Q24 — Designing an RLHF reward"), KL_SECTION)),
    Question(
        25, "C", "PPO 与 DQN、SAC、A3C 有什么区别？为什么大模型不用 DQN？", "PPO vs DQN vs SAC vs A3C",
        "DQN learns $Q(s, a)$ and acts by argmax or $\\epsilon$-greedy. It trains off-policy, on "
        "bootstrapped targets from a replay buffer. SAC is an off-policy actor-critic with an entropy "
        "bonus, designed for continuous actions. A3C is an asynchronous on-policy actor-critic. PPO is "
        "on-policy with a clipped surrogate. DQN does not suit LLMs, for four reasons. A pretrained LLM is "
        "a policy, not a Q-function, and RL must start from it. Argmax and $\\epsilon$-greedy over about "
        "$10^5$ tokens explore badly. Bootstrapping a sparse final reward back through long sequences, with "
        "function approximation and off-policy data, is the deadly triad, and a max over many noisy "
        "estimates overestimates. And RLHF's KL-regularised optimum is a stochastic policy, $\\pi^* "
        "\\propto \\pi_{ref}\\, e^{r/\\beta}$, which an argmax cannot represent. The parameter count is not "
        "the reason.",
        "DQN 学习 $Q(s, a)$，用 argmax 或 $\\epsilon$-贪心选动作，在经验回放的数据上用自举目标训练，"
        "属于异策略。SAC 是带熵奖励的异策略演员-评论家方法，为连续动作设计。A3C 是异步的同策略演员-评论家。"
        "PPO 是带裁剪替代目标的同策略方法。大模型不用 DQN，原因有四。第一，预训练模型本身是一个策略，不是 Q "
        "函数，而强化学习必须从它出发。第二，在约 $10^5$ 个 token 的词表上做 argmax 或 $\\epsilon$-贪心，"
        "探索效率极低。第三，稀疏的终局奖励要靠自举沿着长序列往回传，再加上函数近似和异策略数据，"
        "正是“致命三要素”（deadly triad）；对大量带噪声的估计取最大值还会高估。第四，RLHF 带 KL "
        "正则的最优解是一个随机策略 $\\pi^* \\propto \\pi_{ref}\\, e^{r/\\beta}$，argmax 表达不了。"
        "参数量并不是原因。",
        "**PPO improves the pretrained policy directly; DQN would need a Q-function over about $10^5$ "
        "actions, learned by bootstrapping a sparse final reward.** That is the deadly triad, and argmax "
        "exploration over a vocabulary is hopeless. RLHF's KL-regularised optimum is also a stochastic "
        "policy.",
        "**PPO 直接改进预训练好的策略；DQN 却要在约 $10^5$ 个动作上学 Q 函数，还要靠自举传播稀疏的终局奖励。"
        "** "
        "这正是致命三要素，而在整个词表上做 argmax 探索毫无希望。RLHF 带 KL 正则的最优解也是一个随机策略。",
        (Q20_SECTION,)),
    Question(
        26, "C", "常见的实现错误有哪些？", "Common implementation mistakes",
        "No advantage normalisation: the step size follows the reward's scale. No gradient clipping: one "
        "bad batch takes a huge step. Mixing on- and off-policy data without ratios. A wrong GAE recursion: "
        "the wrong direction, or the wrong value added. Log-probs in low precision: ratios that are not $1$ "
        "when they should be. And the puzzle 'my GRPO loss is 0 at the first step': the ratio is $1$ and "
        "the group advantages sum to zero, yet the gradient is not zero.",
        "不做优势归一化：步长随奖励的尺度变化。不做梯度裁剪：一批坏数据就能迈出一大步。"
        "混用同策略和异策略数据，却不乘重要性采样比率。GAE 递推写错：方向反了，或者加错了价值。"
        "对数概率用低精度：本应等于 $1$ 的比率不等于 $1$。还有一个常见的疑问：“GRPO 第一步的损失为什么是 "
        "0？”答案是比率为 $1$，组内优势之和为零，但梯度并不为零。",
        "**Check GAE against a hand-computed vector, whiten advantages, clip gradients, and keep log-probs "
        "in fp32.** A zero loss at the first GRPO step is expected, and its gradient is not zero.",
        "**用手算的向量核对 GAE，做优势白化，做梯度裁剪，对数概率保持 fp32。** GRPO 第一步损失为零是正常的，"
        "梯度并不为零。",
        (S(NB05, "7. Q26 — \"Why is my GRPO loss 0 at the first step?\""), GAE_SECTION)),
    Question(
        27, "D", "传统强化学习与 RLHF 有什么区别？“大模型场景下无法进行环境重置”对吗？",
        "Traditional RL vs RLHF; can an LLM really not reset its environment?",
        "In classic RL an agent acts in an environment with its own dynamics. It gets rewards along the way "
        "and learns from scratch by trial and error. In RLHF the environment is a prompt distribution plus "
        "a reward model or checker. The dynamics are trivial: the next state is the text with the new token "
        "appended. The policy starts from a pretrained model, the reward usually comes once per answer, and "
        "a KL keeps the policy near the reference. The premise about resets is dubious. Every prompt is a "
        "fresh episode, and the state is just text, so you can restart from any prompt, or any prefix, as "
        "often as you like. GRPO samples each prompt $G$ times, which is a reset. Resets are hard only for "
        "agents whose tools have side effects, such as a live website or a real user; those need sandboxes "
        "or snapshots.",
        "传统强化学习里，智能体在一个有自己状态转移规律的环境中行动，过程中不断获得奖励，"
        "从零开始靠试错学习。RLHF 的"
        "“环境”是提示词分布加上奖励模型或判分程序，状态转移极其简单：新状态就是在文本后面接上新 token。"
        "策略从预训练"
        "模型出发，奖励通常每个回答只给一次，还要用 KL 让策略靠近参考模型。"
        "“大模型场景下无法进行环境重置”这个前提"
        "站不住：每个提示词都是一个全新的回合，而状态就是文本，想从哪个提示词、甚至哪个前缀重新开始都可以，"
        "次数不限。"
        "GRPO 对同一个提示词采样 $G$ 次，本身就是在重置。只有当智能体调用的工具有副作用时（比如线上网站、"
        "真实用户），"
        "重置才困难，这时需要沙箱或快照。",
        "**RLHF is RL with trivial dynamics: the state is the text, the action is the next token, "
        "and a reward model scores the end.** Resetting is easy: every prompt is a fresh episode. "
        "Only agents with side-effecting tools need sandboxes.",
        "**RLHF 是状态转移极其简单的强化学习：状态是文本，动作是下一个 token，奖励模型在结尾打分。"
        "** 重置很容易：每个提示词都是新回合。只有工具有副作用的智能体才需要沙箱。",
        (S(NB05, "1. Q19 — The RLHF pipeline, and state, action, reward for an LLM"),)),
    Question(
        28, "D", "断点续训时，如何保证策略一致性？", "Resuming from a checkpoint: how do you keep the "
                                     "policy consistent?",
        "Save everything the next step reads, and a resumed run repeats the uninterrupted one exactly. That "
        "is the policy's weights (and a separate critic's), the optimiser's moments and step counts, and "
        "every random number generator (sampling and data order). It is also the algorithm's state, such as "
        "the adaptive KL coefficient, the data position and step counter, and which reference model the KL "
        "is measured against. Write the state atomically, so that a kill during the save leaves the "
        "previous one. Then test it: stop a run, resume it, and diff the histories.",
        "把下一步要读取的东西全部保存下来，续训就能与不中断的训练逐步一致。要保存的包括："
        "策略的权重（以及独立价值"
        "模型的权重）、优化器的动量和步数、所有随机数生成器的状态（采样和数据顺序）。"
        "还包括算法自身的状态（例如自适应 KL "
        "系数）、数据读到的位置和当前步数，以及 KL 所对照的参考模型是哪个版本。保存要原子化："
        "即使保存时进程被杀，"
        "留下的也是上一份完整的状态。最后要实际测一次：中途停下，续训，再逐行比对训练历史。",
        "**Save the weights, optimiser moments, every RNG state, the KL controller, the data position and "
        "the reference version, and a resumed run repeats the original exactly.** Save atomically. Prove it "
        "by diffing a stopped-and-resumed run against an uninterrupted one.",
        "**保存权重、优化器动量、所有随机数状态、KL 控制器、数据位置和参考模型版本，"
        "续训就能与原训练完全一致。** "
        "保存要原子化。用中断后续训的训练历史与不中断的逐行比对来证明这一点。",
        ()),
    Question(
        29, "D", "“GSPO 的收敛速度通常比 GRPO 快 2-3 倍”，对吗？",
        "Does GSPO converge two to three times faster than GRPO?",
        "No source supports a general factor. The GSPO paper (Zheng et al., 2025) reports better training "
        "efficiency and stability than GRPO on its own runs, mostly large MoE models, without a speed-up "
        "factor. A factor would need the steps or seconds to reach a target, at equal cost per step, over "
        "several seeds. GSPO's case is strongest for MoE models, where routing noise makes GRPO's token "
        "ratios unstable. On a small dense model, expect little difference.",
        "没有任何来源支持一个普遍的倍数。GSPO 论文（Zheng 等，2025）报告说，在它自己的训练上（主要是大型 "
        "MoE 模型），"
        "GSPO 的训练效率和稳定性都优于 GRPO，但没有给出加速倍数。要说“快几倍”，需要在每步成本相同的条件下，"
        "用多个"
        "随机种子比较达到同一目标所需的步数或时间。GSPO 的优势在 MoE 模型上最明显，因为路由变化让 GRPO 的逐 "
        "token "
        "比率不稳定；在小型稠密模型上，差别应该不大。",
        "**No: the paper reports better efficiency and stability on its large MoE runs, not a factor of two "
        "to three.** A speed-up claim needs the steps to a target, at equal cost, over several seeds. On "
        "dense models expect little difference.",
        "**不对：论文报告的是 GSPO 在大型 MoE 训练上效率更高、更稳定，并没有给出两到三倍的数字。** "
        "要说加速多少，"
        "得在同等成本下，用多个种子比较达到目标所需的步数。在稠密模型上差别应该不大。",
        (S(NB09, "3. The summary table"), GSPO_MOE_SECTION,
         S(NB15, "4. GRPO, GRPO + Routing Replay and GSPO at equal CPU cost"))),
    Question(
        30, "D", "离线强化学习与在线强化学习有什么区别？", "Offline RL vs online RL",
        "Offline RL learns from a fixed dataset collected by another policy, with no new samples. Its "
        "central problem is distribution shift. The learned policy moves to answers the data never covered, "
        "where value or reward estimates are unchecked extrapolations. Offline methods therefore stay close "
        "to the data: behaviour cloning of the good samples (rejection-sampling fine-tuning), "
        "advantage-weighted regression, conservative Q-learning (CQL), implicit Q-learning (IQL). For LLMs, "
        "DPO on a fixed preference set is offline. Online RL samples from the current policy, so its "
        "mistakes are scored and corrected. Many passes of a policy-gradient loss over one old batch are "
        "offline RL in disguise.",
        "离线强化学习只用一份由其他策略收集的固定数据集，不再采样新数据。它的核心问题是分布偏移："
        "学到的策略会走向数据没有覆盖的回答，而在那里，价值或奖励的估计只是无法验证的外推。"
        "所以离线方法都要贴近数据：只对好样本做行为克隆（拒绝采样微调）、优势加权回归（AWR）、保守 Q "
        "学习（CQL）、隐式 Q 学习（IQL）。在大模型上，用固定的偏好数据做 DPO 就是离线的。"
        "在线强化学习从当前策略采样，策略犯的错会被打分、被纠正。在同一批旧数据上反复做策略梯度，"
        "本质上就是离线强化学习。",
        "**Offline RL learns from a fixed dataset, so the policy drifts where the data cannot check "
        "it.** Offline methods therefore stay close to the data. DPO on a fixed preference set is "
        "offline; GRPO and PPO are online.",
        "**离线强化学习只用固定数据，策略会漂到数据无法校验的地方。** 所以离线方法都要贴近数据。"
        "用固定偏好数据做 DPO 是离线的，GRPO 和 PPO 是在线的。",
        (OFFLINE_DPO_SECTION, PASSES_SECTION)),
    Question(
        31, "D", "KV cache 的内存布局如何影响解码速度？", "KV-cache memory layout and decoding speed",
        "Decoding is memory-bound: each new token reads all the weights and the whole KV cache. On a GPU, "
        "the time per token is roughly the bytes read divided by the memory bandwidth. So at long contexts "
        "the cache's size and layout set the speed. A contiguous, preallocated cache is read in one sweep "
        "and never copied. A cache that grows by concatenation reallocates and copies itself every step. A "
        "paged cache adds a block-table lookup but wastes almost no memory, so more sequences fit in a "
        "batch; that is where vLLM's throughput comes from. An int8 cache halves the bytes read, at the "
        "cost of dequantising them.",
        "解码是访存受限（memory-bound）的：每生成一个 token，都要读一遍全部权重和整个 KV cache。在 GPU 上，"
        "每个 token 的耗时大约是读取的字节数除以显存带宽，所以上下文一长，缓存的大小和布局就决定了速度。"
        "连续、预分配的缓存一次顺序读完，从不复制。靠拼接增长的缓存每一步都要重新分配内存并复制自己。"
        "分页缓存多一次块表查找，但几乎不浪费显存，一个批次能放下更多序列，vLLM 的吞吐量正是由此而来。int8 "
        "缓存把读取的字节数减半，代价是要反量化。",
        "**Decoding is memory-bound, so the KV cache's bytes and layout set the speed.** A preallocated "
        "contiguous cache never copies, concatenation copies every step, and paging trades a lookup for "
        "batch size. An int8 cache halves the bytes read.",
        "**解码是访存受限的，所以 KV cache 的字节数和布局决定速度。** 预分配的连续缓存从不复制，"
        "拼接式缓存每步都要复制，分页缓存用一次查表换来更大的批次。int8 缓存把读取量减半。",
        (S(NB03, "Q18 — How much faster is decoding with a KV cache?"),
         S(NB03, "Q18 — Paged storage and prefix sharing"),
         S(NB03, "Q18 — An int8 KV cache: memory and error"))),
    Question(
        32, "D", "贝尔曼方程与价值函数近似", "The Bellman equation and value-function approximation",
        "The value of a state is the expected return from it: $V^\\pi(s) = \\mathbb{E}_{a \\sim \\pi}[r(s, "
        "a) + \\gamma V^\\pi(s')]$. This recursion is the Bellman equation; the optimality version takes a "
        "max over actions instead. For an LLM with $\\gamma = 1$ and one reward at the end, "
        "$V(\\text{prefix})$ is the probability that the policy finishes it correctly. No table can hold a "
        "value for every prefix, so a network $V_\\phi$ approximates it. It is trained by regression on "
        "Monte Carlo returns, or on bootstrapped TD targets $r + \\gamma V_\\phi(s')$, which have less "
        "variance but inherit $V_\\phi$'s errors. PPO's critic is that network, and GAE's $\\lambda$ blends "
        "the two targets.",
        "状态的价值是从该状态出发的期望回报：$V^\\pi(s) = \\mathbb{E}_{a \\sim \\pi}[r(s, a) + \\gamma "
        "V^\\pi(s')]$。"
        "这个递推式就是贝尔曼方程；贝尔曼最优方程把对动作的期望换成取最大值。对大模型而言，$\\gamma = 1$、"
        "奖励只在"
        "结尾给出时，$V(\\text{前缀})$ 就是策略从这个前缀出发最终答对的概率。不可能为每个前缀存一个值，"
        "所以用神经"
        "网络 $V_\\phi$ 来近似。训练目标可以是蒙特卡洛回报，也可以是自举的时序差分目标 $r + \\gamma "
        "V_\\phi(s')$："
        "后者方差更小，但会继承 $V_\\phi$ 自身的误差。PPO 的价值模型就是这个网络，GAE 的 $\\lambda$ "
        "在两种目标之间"
        "折中。",
        "**A state's value is the expected reward plus the discounted value of the next state: the "
        "Bellman equation.** With one final reward, $V(\\text{prefix})$ is the chance of finishing "
        "correctly. A critic learns it from Monte Carlo or bootstrapped targets.",
        "**贝尔曼方程：状态的价值等于期望奖励加上下一状态的折扣价值。"
        "** 只有最终奖励时，$V(\\text{前缀})$ 就是从该前缀出发答对的概率。"
        "价值模型用蒙特卡洛回报或自举目标来学习它。",
        (S(NB06, "1. The critic: a value for every prefix"), GAE_SECTION)),
    Question(
        33, "D", "手推注意力的反向传播（梯度推导）", "Derive the gradient of attention by hand",
        "Forward: $S = QK^\\top/\\sqrt{d}$, $P = \\mathrm{softmax}(S)$ row by row, $O = PV$. Backward, "
        "given $dO$: $dV = P^\\top dO$ and $dP = dO\\,V^\\top$. The softmax Jacobian gives $dS = P \\odot "
        "(dP - \\mathrm{rowsum}(dP \\odot P))$. Then $dQ = dS\\,K/\\sqrt{d}$ and $dK = dS^\\top "
        "Q/\\sqrt{d}$. The row sum is the term people forget. FlashAttention recomputes $P$ in the backward "
        "pass instead of storing it, and uses $\\mathrm{rowsum}(dP \\odot P) = \\mathrm{rowsum}(dO \\odot "
        "O)$.",
        "前向：$S = QK^\\top/\\sqrt{d}$，对 $S$ 逐行做 softmax 得到 $P$，$O = PV$。反向，已知 $dO$："
        "$dV = P^\\top dO$，$dP = dO\\,V^\\top$。由 softmax 的雅可比矩阵得到 $dS = P \\odot (dP - "
        "\\mathrm{rowsum}(dP \\odot P))$。于是 $dQ = dS\\,K/\\sqrt{d}$，$dK = dS^\\top Q/\\sqrt{d}$。"
        "最容易漏掉的"
        "就是按行求和的那一项。FlashAttention 在反向时重新计算 $P$ 而不存储它，并利用 "
        "$\\mathrm{rowsum}(dP \\odot P) = \\mathrm{rowsum}(dO \\odot O)$。",
        "**Softmax couples each row, so $dS = P \\odot (dP - \\mathrm{rowsum}(dP \\odot P))$; the rest is "
        "the matrix-product rule.** Then $dV = P^\\top dO$, $dQ = dS K/\\sqrt{d}$ and $dK = dS^\\top "
        "Q/\\sqrt{d}$. Check it against autograd.",
        "**softmax 让每一行内部相互耦合，所以 $dS = P \\odot (dP - \\mathrm{rowsum}(dP \\odot P))$；"
        "其余都是矩阵"
        "乘法的求导规则。** 于是 $dV = P^\\top dO$，$dQ = dS K/\\sqrt{d}$，$dK = dS^\\top Q/\\sqrt{d}$。"
        "最后用自动"
        "求导核对。",
        (S(EXERCISES2),)),
    Question(
        34, "E", "同步 RLHF 和异步 RLHF 有什么区别？为什么要把生成（rollout）和训练拆开？",
        "Synchronous or asynchronous RLHF: why split generation from training?",
        "Synchronous RLHF alternates. It samples a batch with the current weights, then trains on it. "
        "Generation is memory-bound decoding with a KV cache. Training is compute-bound forward and backward "
        "passes. So they want different engines (vLLM or SGLang against FSDP or Megatron) and different "
        "parallelism. Asynchronous RLHF runs the two at the same time, on separate workers. The speed-up is "
        "at most $(t_{rollout} + t_{update}) / \\max(t_{rollout}, t_{update})$: at most 2x, and only when "
        "both sides take equal time. The price is staleness: a rollout comes from weights a few versions "
        "old.",
        "同步 RLHF 是交替进行的：先用当前权重采样一批数据，再在这批数据上训练。生成是受显存带宽限制的解码，"
        "要维护 KV cache；训练是受算力限制的前向和反向传播。所以两者适合不同的引擎（vLLM、SGLang 对 FSDP、"
        "Megatron），并行方式也不同。异步 RLHF 让两者在不同的进程上同时运行。加速比的上限是 "
        "$(t_{rollout} + t_{update}) / \\max(t_{rollout}, t_{update})$，最多 2 倍，而且只有两边耗时相等时"
        "才能达到。代价是数据陈旧：rollout 来自落后几个版本的权重。",
        "**Split them because generation and training want different engines, and overlap them to hide the "
        "shorter one.** The speed-up is at most (t_rollout + t_update) / max of the two, so balance the "
        "sides. The price is staleness, which must be bounded and corrected.",
        "**生成和训练需要不同的引擎，所以要拆开；让两者重叠运行，就能把耗时短的一方藏起来。** 加速比的上限是 "
        "(t_rollout + t_update) / max(t_rollout, t_update)，所以两边耗时要平衡。代价是数据陈旧，必须限制并"
        "修正。",
        (SPLIT_SECTION,)),
    Question(
        35, "E", "分布式 RLHF 如何保证数据一致性？权重同步、版本号与陈旧度",
        "Distributed RLHF: how do you keep the data consistent? Weight sync, versions and staleness",
        "Version everything. The learner broadcasts its weights to the rollout engines on a process group "
        "of their own, as one flat bucket, and bumps a version number. Each rollout carries its tokens, the "
        "behaviour policy's log-probs $\\mu$ and the version that sampled it. Staleness is the learner's "
        "version minus the rollout's. Bound it twice: admission lets at most $K + 1$ rollouts run ahead of "
        "the learner, and the queue drops anything staler than $K$. Then correct the loss. AReaL's "
        "decoupled PPO clips against the proximal policy and reweights by $\\pi_{prox}/\\mu$. Data-parallel "
        "learners all-reduce their gradients, with the loss normalised by the global token count.",
        "核心是给一切打上版本号。训练端在专用的通信组上把权重广播给推理引擎，打包成一个扁平的缓冲区"
        "（bucket），并把版本号加一。每条 rollout 都带着它的 token、行为策略的对数概率 $\\mu$，以及采样它的"
        "权重版本。陈旧度等于训练端的当前版本减去 rollout 的版本。陈旧度要限制两次：准入规则最多允许 "
        "$K + 1$ 条 rollout 领先于训练端，队列再丢弃陈旧度超过 $K$ 的数据。然后修正损失：AReaL 的解耦 PPO "
        "相对近端策略 $\\pi_{prox}$ 做裁剪，再乘以权重 $\\pi_{prox}/\\mu$。数据并行的训练进程用 all-reduce "
        "聚合梯度，损失按全局 token 数归一化。",
        "**Every weight sync bumps a version, and every rollout carries the version and the log-probs that "
        "sampled it.** Admission and the queue keep staleness at most K. The loss corrects what remains, "
        "for example decoupled PPO's weight pi_prox / mu.",
        "**每次权重同步都更新版本号，每条 rollout 都带着采样它的版本号和对数概率。** 准入规则和队列把陈旧度"
        "限制在 K 以内。剩下的偏差由损失函数修正，例如解耦 PPO 乘上的权重 pi_prox / mu。",
        (SYNC_SECTION, STALENESS_SECTION, ALLREDUCE_SECTION)),
    Question(
        36, "E", "训推不一致：推理引擎和训练引擎算出的概率为什么不一样？怎么修正？",
        "The rollout/trainer mismatch: why do the engine's probabilities differ from the trainer's, and how "
        "do you correct it?",
        "The rollout engine is another policy, even with the same weights. It runs in bf16 or fp16, with "
        "fused kernels and sometimes a quantized KV cache. The trainer runs in fp32 or with fp32 master "
        "weights. So the sampled tokens' log-probs differ, and the update is silently off-policy. Measure "
        "the gap per token first. Then correct with an importance weight $\\pi_{old}/\\mu$. Truncated "
        "importance sampling caps it at $C$; masked importance sampling drops tokens whose weight leaves "
        "$[1/C, C]$. fp16 rollouts keep more mantissa bits than bf16, so the gap shrinks.",
        "即使权重相同，推理引擎也是另一个策略。它用 bf16 或 fp16 计算，用融合算子，有时还用量化的 KV cache；"
        "训练端则用 fp32，或者保留 fp32 的主权重。于是采样 token 的对数概率对不上，更新在不知不觉中变成了"
        "异策略。先逐 token 测量差距，再用重要性权重 $\\pi_{old}/\\mu$ 修正。截断重要性采样（TIS）把权重截断"
        "在 $C$ 以内；掩码重要性采样（MIS）直接屏蔽权重落在 $[1/C, C]$ 之外的 token。"
        "fp16 的尾数位比 bf16 多，"
        "用它做 rollout，差距会小很多。",
        "**The rollout engine is another policy, even with the same weights.** Precision, fused kernels and "
        "quantized KV caches change the probabilities. Measure the gap, then truncate or mask the "
        "importance weight pi_old / mu.",
        "**即使权重相同，推理引擎也是另一个策略。** 精度、融合算子和量化的 KV cache 都会改变概率。"
        "先测量差距，"
        "再对重要性权重 pi_old / mu 做截断或掩码。",
        (MISMATCH_SECTION,)),
    Question(
        37, "E", "设计一个支持千卡并行的 PPO 训练框架：模型怎么放、何时同步、怎么容错？",
        "Design a PPO framework on 1,000 GPUs: where each model goes, what synchronises when, and how it "
        "survives faults",
        "Separate three kinds of work. The trained models (policy and critic) need about 16 bytes per "
        "parameter for weights, gradients and Adam, so they are sharded with FSDP or ZeRO-3. The frozen "
        "models (reference and reward model) need only bf16 weights and serve in batches. The rollout "
        "engines hold a bf16 copy of the policy plus a KV cache. Gradients all-reduce inside every backward "
        "pass. Weights go to the engines once per step, bucketed and versioned. A checkpoint holds weights, "
        "optimiser and RNG states, the data position and the policy version. A dead worker is restarted "
        "and its rollouts are sampled again.",
        "把三类工作分开。要训练的模型（策略和价值模型）每个参数要约 16 字节，存权重、梯度和 Adam 状态，"
        "所以用 FSDP 或 ZeRO-3 切分。冻结的模型（参考模型和奖励模型）只需要 bf16 权重，按批提供推理服务。"
        "生成引擎持有一份 bf16 的策略权重和 KV cache。梯度在每次反向传播中做 all-reduce；权重每步同步一次"
        "给生成引擎，分桶打包并带版本号。检查点要保存权重、优化器和随机数状态、数据位置和策略版本号。某个"
        "进程挂了就重启它，它没完成的 rollout 重新采样。",
        "**Separate the trained models, the frozen ones and generation, and synchronise only weights "
        "and rollouts.** Shard policy and critic at about 16 bytes per parameter; serve reference "
        "and reward model in bf16. Sync versioned weights each step and checkpoint the versions.",
        "**把要训练的模型、冻结的模型和生成引擎分开部署，彼此只同步权重和 "
        "rollout。** 策略和价值模型每个参数约 16 字节，"
        "要切分；参考模型和奖励模型用 bf16 提供推理服务。"
        "每步同步带版本号的权重，检查点里记下版本号。",
        (SCALE_SECTION, FAULTS_SECTION)),
)


def question(number: int) -> Question:
    """The question numbered `number` (1..len(QUESTIONS))."""
    check_number("number", number, low=1, high=len(QUESTIONS), integer=True)
    return QUESTIONS[number - 1]


def question_markdown(number: int, with_answer: bool = True, lang: str = "both") -> str:
    """The drill's text for one question: the model answer (English, Chinese or both) and the links.
    The question itself is the notebook heading (`Question.heading`)."""
    check_choice("lang", lang, LANGUAGES)
    q = question(number)
    parts = []
    if with_answer and lang in ("both", "en"):
        parts.append(f"**{ANSWER_EN}.** {q.answer_en}")
    if with_answer and lang in ("both", "zh"):
        parts.append(f"**{ANSWER_ZH}：** {q.answer_zh}")
    if q.deep:
        parts.append("**Go deep · 深入：** " + "; ".join(s.link for s in q.deep) + ".")
    else:
        parts.append("**Go deep · 深入：** the cells below run the whole answer · "
                     "下面的代码单元完整地演示了这个答案。")
    return "\n\n".join(parts)


def box_markdown(number: int) -> str:
    """The interview box of one question, English then Chinese, as a markdown blockquote."""
    q = question(number)
    return f"> **{BOX_EN}.** {q.say_en}\n>\n> **{BOX_ZH}：** {q.say_zh}"


# ------------------------------------------------------------------------------------------------
# The myth table: claims from interview write-ups (in the original Chinese where they come from one),
# each with its verdict. Notebook 13 adds what the lab measured for each.


@dataclass(frozen=True)
class Myth:
    key: str
    claim_zh: str
    claim_en: str
    quoted: bool  # True: the Chinese is the write-up's own words; False: the lab's rendering of a claim
    verdict_en: str
    verdict_zh: str
    where: str  # the drill question and notebook section that measure it


MYTHS: tuple[Myth, ...] = (
    Myth("continuous", "大模型输出本质是高维连续分布",
         "an LLM's output is a high-dimensional continuous distribution",
         True, "wrong: a discrete choice among the vocabulary's "
               "tokens", "错误：输出是在词表上做离散选择", "Q25, Q19"),
    Myth("moe_imbalance", "天然适配MoE架构的负载不均衡特性", "GSPO naturally fits MoE's load imbalance", True,
         "wrong mechanism: GSPO is about routing volatility; load balance is the router's auxiliary loss",
         "机制说错了：GSPO 针对的是路由波动，负载均衡靠路由器的辅助损失", "Q14; 15 §6"),
    Myth("clip_range", "使用更大的裁剪比例（通常比GRPO高10-100倍）",
         "GSPO uses a clip range 10-100x larger than GRPO's",
         True, "wrong way round: the range is far smaller; the clipped share of tokens is larger",
         "说反了：GSPO 的裁剪范围小得多，更大的是被裁剪 token 的比例", "Q14; 08 §4"),
    Myth("memory_40", "显存占用降低约40%", "GRPO cuts memory by about 40% by dropping the critic", True,
         "only with a separate critic; with a value head on the shared trunk the saving is negligible",
         "只在使用独立价值模型时成立；共享主干上的价值头几乎不省显存", "Q13; 06 §8"),
    Myth("gspo_faster", "GSPO的收敛速度通常比GRPO快2-3倍", "GSPO usually converges 2-3x faster than GRPO",
         True,
         "unsupported: the paper gives no such factor; measure steps to a target over seeds",
         "没有依据：论文没有给出这个倍数，要用多个种子比较达到目标所需的步数", "Q29; 09 §3, 15 §4"),
    Myth("grpo_fabricated",
         "“GRPO（Generalized Reinforcement Learning with Policy Optimization）是2023年提出的”，"
         "并称它使用“adaptive trust region, Fisher preconditioning, ε-greedy”",
         "GRPO is 'Generalized Reinforcement Learning with Policy Optimization' (2023), with an adaptive "
         "trust "
         "region, Fisher preconditioning and epsilon-greedy exploration", True,
         "fabricated: GRPO is Group Relative Policy Optimization (DeepSeekMath, arXiv 2402.03300, February "
         "2024): PPO's clipped loss with a group-mean baseline and no critic; none of the three techniques "
         "is in it",
         "纯属编造：GRPO 是组相对策略优化（DeepSeekMath，arXiv 2402.03300，2024 年 2 月），即 PPO "
         "的裁剪损失加组内"
         "均值基线、不用价值模型；所说的三种技术都不在其中", "Q4; 07"),
    Myth("epochs", "在同一批数据上训练超过五轮就会崩溃",
         "more than about five PPO epochs on one batch collapses", False,
         "a rule of thumb: measure the clip fraction and held-out accuracy against passes",
         "只是经验法则：要实测裁剪比例和验证集准确率随轮数的变化", "Q8; 05 §8"),
    Myth("reference", "GRPO 的 KL 参考模型是 SFT 模型，PPO 的是初始模型",
         "GRPO's KL reference is the SFT model, PPO's the initial model", False,
         "both use the starting policy (usually the SFT "
         "model)", "两者都用训练起点的策略（通常就是 SFT 模型）",
         "Q7; 07"),
    Myth("zero_loss", "GRPO 第一步损失为 0，说明什么都没学到",
         "a GRPO loss of 0 at step 1 means nothing is learned",
         False, "wrong: the loss is 0 but the gradient is not", "错误：损失为零，梯度并不为零", "Q26; 05 §7"),
    Myth("later_tokens", "越靠后的 token 概率越高", "later tokens of a sequence are more probable", False,
         "a tendency, not a law: here the task's structure decides which positions are sure",
         "只是趋势，不是定律：这里由任务结构决定哪些位置更确定", "Q16; 01"),
)


# ------------------------------------------------------------------------------------------------
# Glossary: the Chinese terms learners search for, mapped to the lab's names and sections.


@dataclass(frozen=True)
class Term:
    zh: str
    en: str
    lab: tuple[str, ...]  # importable dotted names in rlhf_lab, or config fields written "Config.field"
    where: tuple[Section, ...]


def _drill(number: int) -> Section:
    return S(DRILL_NOTEBOOK, question(number).heading)


GLOSSARY: tuple[Term, ...] = (
    Term("优势函数", "advantage", ("rlhf_lab.rl.advantages.group_advantages", "rlhf_lab.rl.advantages.gae"),
         (S(NB05, "3. Q5 — Why advantages and not raw rewards? Baselines"),)),
    Term("基线", "baseline",
         ("rlhf_lab.rl.advantages.rloo_advantages", "rlhf_lab.rl.advantages.remax_advantages"),
         (S(NB05, "3. Q5 — Why advantages and not raw rewards? Baselines"),)),
    Term("广义优势估计", "GAE (generalised advantage estimation)",
         ("rlhf_lab.rl.advantages.gae", "PPOConfig.lam"),
         (GAE_SECTION,)),
    Term("优势归一化 / 白化", "advantage whitening",
         ("rlhf_lab.rl.advantages.whiten", "PPOConfig.whiten_advantages"),
         (S(NB06, "3. Advantage whitening"),)),
    Term("重要性采样 / 重要性采样比率", "importance sampling, the importance ratio",
         ("rlhf_lab.rl.losses.token_log_ratio",), (S(NB05, "4. Q6 — Importance sampling: reusing a batch"),)),
    Term("裁剪", "clipping (clip range epsilon)", ("rlhf_lab.rl.losses.clipped_surrogate",
                                                 "RLConfig.epsilon"),
         (S(NB05, "5. Clipping: the PPO surrogate (what GRPO uses too)"),)),
    Term("信任域 / TRPO", "trust region, TRPO", ("rlhf_lab.rl.losses.clipped_surrogate", "RLConfig.epsilon"),
         (Q20_SECTION,)),
    Term("策略梯度", "policy gradient, REINFORCE", ("rlhf_lab.rl.PolicyGradient", "rlhf_lab.rl.Reinforce"),
         (S(NB05, "2. REINFORCE: push up the log-probability of what was rewarded"),)),
    Term("演员-评论家 / Actor-Critic", "actor-critic", ("rlhf_lab.rl.PPO", "PPOConfig.critic"),
         (Q20_SECTION,)),
    Term("价值函数 / 价值模型 / 评论家", "value function, critic",
         ("rlhf_lab.rl.losses.clipped_value_loss", "PPOConfig.critic"),
         (S(NB06, "1. The critic: a value for every prefix"),)),
    Term("贝尔曼方程", "Bellman equation", ("rlhf_lab.rl.advantages.gae",), (_drill(32),)),
    Term("信用分配", "credit assignment", ("rlhf_lab.tasks.tool_use.turn_advantages",), (CREDIT_SECTION,)),
    Term("奖励模型", "reward model", ("rlhf_lab.preferences.RewardModel",
                                  "rlhf_lab.preferences.RewardTrainer"),
         (S(NB10, "3. The Bradley-Terry reward model"),)),
    Term("偏好对 / Bradley-Terry 模型", "preference pair, Bradley-Terry model",
         ("rlhf_lab.preferences.PreferencePair", "rlhf_lab.preferences.bradley_terry_loss"),
         (S(NB10, "1. Preference data: who prefers what?"), S(NB10, "3. The Bradley-Terry reward model"))),
    Term("标注一致性", "annotator agreement (Cohen's kappa)",
         ("rlhf_lab.preferences.cohen_kappa", "rlhf_lab.preferences.fleiss_kappa"),
         (S(NB10, "2. Q1 — How do you measure annotator agreement?"), _drill(1))),
    Term("过拟合", "overfitting (reward model)", ("rlhf_lab.preferences.RewardTrainer",
                                                 "rlhf_lab.preferences.pairwise_accuracy"),
         (S(NB10, "4. Q1 — What does the accuracy curve look like, and did it overfit?"),)),
    Term("奖励黑客 / 奖励过优化", "reward hacking, reward over-optimisation",
         ("rlhf_lab.preferences.RewardTracker", "rlhf_lab.preferences.GoldEarlyStopping"),
         (METRICS_SECTION, S(NB11, "2. Q3 — Why does the reward go up while quality goes down?"))),
    Term("过度优化", "over-optimisation (Goodhart's law)",
         ("rlhf_lab.preferences.best_of_n_curve", "rlhf_lab.preferences.fit_gao"),
         (S(NB11, "3. Best-of-n: the other way to optimise a reward model"),)),
    Term("拒绝采样 / Best-of-N", "rejection sampling, best-of-n", ("rlhf_lab.preferences.best_of_n",),
         (S(NB11, "3. Best-of-n: the other way to optimise a reward model"),)),
    Term("直接偏好优化", "DPO (direct preference optimisation)",
         ("rlhf_lab.preferences.dpo_loss", "rlhf_lab.preferences.DPOTrainer"),
         (S(NB12, "1. What does DPO optimise?"),)),
    Term("离线强化学习", "offline RL", (
        "rlhf_lab.preferences.DPOTrainer",), (OFFLINE_DPO_SECTION, _drill(30))),
    Term("KL 散度惩罚", "KL penalty", ("rlhf_lab.rl.kl.kl_estimate", "PPOConfig.kl_coef", "GRPOConfig.beta"),
         (KL_SECTION,)),
    Term("自适应 KL 控制器", "adaptive KL controller",
         ("rlhf_lab.rl.kl.AdaptiveKLController", "PPOConfig.adaptive_kl"),
         (S(NB06, "6. Adaptive KL"),)),
    Term("参考模型", "reference model (pi_ref)", ("RLConfig.init_checkpoint", "RLConfig.offload_reference"),
         (S(NB07, "Q7 — Is GRPO's KL the same as PPO's?"),)),
    Term("同策略 / 异策略", "on-policy / off-policy", ("RLConfig.num_iterations", "RLConfig.num_minibatches"),
         (PASSES_SECTION,)),
    Term("组相对策略优化", "GRPO (group relative policy optimization)", ("rlhf_lab.rl.GRPO",),
         (S(NB07, "Q4 — The GRPO loss, term by term"),)),
    Term("近端策略优化", "PPO (proximal policy optimization)", ("rlhf_lab.rl.PPO",), (PPO_SECTION,)),
    Term("组序列策略优化 / 序列级重要性比率",
         "GSPO (group sequence policy optimization), sequence-level ratio",
         ("rlhf_lab.rl.GSPO", "rlhf_lab.rl.losses.gspo_ratio"), (S(NB08, "1. One ratio per completion"),)),
    Term("熵", "entropy", ("rlhf_lab.rl.losses.entropy_from_logits",), (METRICS_SECTION,)),
    Term("熵坍缩", "entropy collapse", ("RLConfig.epsilon_high",),
         (S(NB07B, "Clip-higher: why make the clip range asymmetric?"),)),
    Term("梯度裁剪", "gradient clipping", ("RLConfig.max_grad_norm",), (_drill(26),)),
    Term("断点续训", "resuming from a checkpoint",
         ("rlhf_lab.train.run_state.save_state", "rlhf_lab.train.run_state.load_state",
          "rlhf_lab.train.run_state.Checkpointer"), (_drill(28),)),
    Term("分布式训练", "distributed training (what it must fit: memory per model)",
         ("rlhf_lab.runs.scale_up.estimate_training_memory", "RLConfig.gradient_checkpointing",
          "RLConfig.offload_reference"),
         (S("14_scale_up.ipynb", "2. Q: How much GPU memory does GRPO on Qwen3-0.6B need?"), SCALE_SECTION)),
    Term("异步 RLHF / 训推分离", "asynchronous RLHF, the rollout/learner split",
         ("rlhf_lab.distributed.AsyncTrainer", "rlhf_lab.distributed.SplitConfig"),
         (SPLIT_SECTION, _drill(34))),
    Term("权重同步", "weight sync (broadcast, one bucket or tensor by tensor)",
         ("rlhf_lab.distributed.weight_payload", "rlhf_lab.distributed.flatten"), (SYNC_SECTION,)),
    Term("数据陈旧度 / 陈旧度", "staleness (policy-version lag)",
         ("rlhf_lab.distributed.Admission", "rlhf_lab.distributed.RolloutQueue", "SplitConfig.max_staleness"),
         (STALENESS_SECTION, _drill(35))),
    Term("训推不一致", "rollout/trainer mismatch",
         ("rlhf_lab.distributed.mismatch.mismatch_metrics", "SplitConfig.rollout_dtype"),
         (MISMATCH_SECTION, _drill(36))),
    Term("截断重要性采样 / 掩码重要性采样", "truncated / masked importance sampling (TIS, MIS)",
         ("rlhf_lab.rl.off_policy.importance_weights", "RLConfig.off_policy"), (MISMATCH_SECTION,)),
    Term("梯度聚合 / Ring-AllReduce", "gradient all-reduce, Ring-AllReduce",
         ("rlhf_lab.distributed.ddp.run_data_parallel", "rlhf_lab.distributed.ddp.allreduce_seconds"),
         (ALLREDUCE_SECTION,)),
    Term("容错 / 回滚", "fault tolerance, rollback", ("rlhf_lab.train.run_state.Checkpointer",),
         (FAULTS_SECTION, _drill(37))),
    Term("蒸馏", "distillation", (
        "rlhf_lab.sft.SFTTrainer",), (S(NB09, "5. Q2 — SFT, distillation or RL?"), )),
    Term("监督微调", "SFT (supervised fine-tuning)", ("rlhf_lab.sft.SFTTrainer",),
         (S("04_sft_and_data_format.ipynb", "1. The SFT loss: cross-entropy on the completion only"),)),
    Term("思维链", "chain of thought (reasoning first)", ("rlhf_lab.tasks.get_task",),
         (S(NB04, Q15_HEADING),)),
    Term("多轮智能体", "multi-turn agent, tool use", ("rlhf_lab.tasks.tool_use.run_episodes",),
         (_drill(11),)),
    Term("温度采样", "temperature sampling", ("rlhf_lab.sampling.SamplingConfig",),
         (S("01_sampling.ipynb", "3. Temperature"),)),
    Term("核采样", "top-p (nucleus) sampling", ("rlhf_lab.sampling.SamplingConfig",),
         (S("01_sampling.ipynb", "4. Truncation: top-k, top-p (nucleus) and min-p"),)),
    Term("重复惩罚", "repetition penalty", ("rlhf_lab.sampling.SamplingConfig",),
         (S("01_sampling.ipynb", "5. Repetition penalty and no-repeat-n-gram"),)),
    Term("束搜索", "beam search", ("rlhf_lab.sampling.beam_search", "BeamSearchConfig.num_beams",
                               "BeamSearchConfig.length_penalty"),
         (S(NB03, "Q18 — Beam search: why should beams share the KV cache?"),)),
    Term("旋转位置编码", "RoPE (rotary position embedding)", ("rlhf_lab.model.rope.apply_rope",),
         (S("02_rope.ipynb", "Q17 — Write RoPE, part 1: a rotation in two dimensions"),)),
    Term("KV cache / KV 缓存", "KV cache",
         ("rlhf_lab.model.kv_cache.StaticCache", "rlhf_lab.model.kv_cache.kv_cache_bytes"),
         (S(NB03, "1. What is cached, and why it is exact"), _drill(31))),
    Term("写时复制 / 引用计数", "copy-on-write, reference count",
         ("rlhf_lab.model.paged_cache.PagedKVCache",),
         (S(NB03, "Q18 — Beam search: why should beams share the KV cache?"),)),
    Term("注意力梯度推导", "the attention gradient by hand",
         ("rlhf_lab.exercises.mechanisms.attention_backward",),
         (S(EXERCISES2), _drill(33))),
    Term("手撕代码 / 二分 / 牛顿迭代", "coding by hand: binary search, Newton's method",
         ("rlhf_lab.exercises.coding.isqrt_binary_search", "rlhf_lab.exercises.coding.isqrt_newton"),
         (S(EXERCISES2), _drill(12))),
    Term("混合专家", "mixture of experts (MoE)",
         ("rlhf_lab.model.moe.SparseMoeBlock", "ModelConfig.num_local_experts"),
         (S(NB15, "1. An MoE layer, and what RL has to watch"),)),
    Term("负载均衡损失", "load-balancing loss",
         ("rlhf_lab.model.load_balancing_loss", "ModelConfig.router_aux_loss_coef"),
         (S(NB15, "6. Q14 (MoE part) in an interview, and the \"load imbalance\" folklore"),)),
    Term("路由重放", "routing replay", ("RLConfig.routing_replay",), (S(NB15, "3. Routing Replay"),)),
    Term("路由变化率", "routing-change rate (share of tokens whose experts change after an update)",
         ("rlhf_lab.rl.routing",), (S(NB15, "2. How much does one update move the routing?"),)),
)

# The modules whose config classes the glossary names as "Class.field".
CONFIG_MODULES = ("rlhf_lab.rl", "rlhf_lab.model", "rlhf_lab.sampling", "rlhf_lab.preferences",
                  "rlhf_lab.sft", "rlhf_lab.distributed")


def glossary_markdown(base: str = "") -> str:
    """The glossary as a markdown table; `base` is prefixed to notebook links (e.g. "notebooks/")."""
    rows = ["| 中文 | English | in the lab | where |", "| --- | --- | --- | --- |"]
    for term in GLOSSARY:
        names = ", ".join(f"`{name}`" for name in term.lab) or "—"
        where = "; ".join(_rebase(s.link, base) for s in term.where)
        rows.append(f"| {term.zh} | {term.en} | {names} | {where} |")
    return "\n".join(rows)


def glossary_file() -> str:
    """The whole of notebooks/GLOSSARY.md (the table, with its introduction and notes)."""
    return (
        "# Glossary · 术语表\n\nThe Chinese terms that learners preparing for LLM-RL interviews search for, "
        "the lab's name for each\n(a function, class or config field you can import or set), and the "
        "notebook section where it runs.\n"
        f"The drill, [{DRILL_NOTEBOOK}]({DRILL_NOTEBOOK}), shows the same table and answers every interview\n"
        "question in English and in Chinese.\n\n"
        "面试中常见的中文术语，它在本项目中对应的函数、类或配置项，以及演示它的笔记本章节。\n\n"
        f"{glossary_markdown()}\n\n"
        "Config fields are written `Class.field` (e.g. `PPOConfig.lam` is `make_config(\"ppo\", lam=0.9)`).\n"
        "This file is generated by `rlhf_lab.teach.drill.glossary_file()`; edit the glossary there.\n"
    )


def _rebase(link: str, base: str) -> str:
    return re.sub(r"\]\(", f"]({base}", link, count=1) if base else link


# ------------------------------------------------------------------------------------------------
# Mock interview


def mock_interview(seed: int | None = None, use_widgets: bool | None = None, lang: str = "both"):
    """A random question with its answer hidden until you ask for it.

    In Jupyter with ipywidgets: "Next question" and "Reveal answer" buttons. Anywhere else (a script,
    a headless run, `use_widgets=False`): an HTML card with the answer in a collapsed <details>
    block, which GitHub renders collapsed too. `lang`: "both", "en" or "zh" for the answer."""
    from ..viz.widgets import widgets_available

    check_optional(check_number, "seed", seed, integer=True)
    check_choice("lang", lang, LANGUAGES)
    rng = random.Random(seed)
    if use_widgets is None:
        use_widgets = widgets_available()
    if not use_widgets:
        from IPython.display import HTML

        return HTML(question_card(rng.choice(QUESTIONS).number, lang))

    import ipywidgets as widgets
    from IPython.display import Markdown, display

    output = widgets.Output()
    state = {"number": rng.choice(QUESTIONS).number, "revealed": False}

    def draw() -> None:
        output.clear_output()
        q = question(state["number"])
        text = f"**Q{q.number}. {q.title_en}**\n\n**{q.title_zh}**"
        if state["revealed"]:
            text += "\n\n" + question_markdown(q.number, lang=lang) + "\n\n" + box_markdown(q.number)
        with output:
            display(Markdown(text))

    def next_question(_button) -> None:
        state["number"], state["revealed"] = rng.choice(QUESTIONS).number, False
        draw()

    def reveal(_button) -> None:
        state["revealed"] = True
        draw()

    next_button = widgets.Button(description="Next question")
    reveal_button = widgets.Button(description="Reveal answer")
    next_button.on_click(next_question)
    reveal_button.on_click(reveal)
    draw()
    return widgets.VBox([widgets.HBox([next_button, reveal_button]), output])


def question_card(number: int, lang: str = "both") -> str:
    """One question as static HTML, the answer inside a collapsed <details> (the headless mock interview)."""
    check_choice("lang", lang, LANGUAGES)
    q = question(number)
    answers = []
    if lang in ("both", "en"):
        answers.append(f"<p><b>{ANSWER_EN}.</b> {html.escape(q.answer_en)}</p>")
    if lang in ("both", "zh"):
        answers.append(f"<p><b>{ANSWER_ZH}：</b>{html.escape(q.answer_zh)}</p>")
    return (f"<div><b>Q{q.number}. {html.escape(q.title_en)}</b><br><b>{html.escape(q.title_zh)}</b>"
            "<details><summary>Reveal the model answer · "
            f"显示参考答案</summary>{''.join(answers)}</details></div>")
