"""The interview drill: the 26 questions of LLM-RL interviews, a model answer each, where the lab goes
deep, a mock-interview widget, and a Chinese-English glossary (notebook 13, notebooks/GLOSSARY.md).

    from rlhf_lab.teach.drill import QUESTIONS, question_markdown, mock_interview, glossary_markdown
    QUESTIONS[10].title_zh, QUESTIONS[10].title_en    # Q11: 多轮智能体 / multi-turn agents
    mock_interview(seed=0)                            # a random question, the answer behind a button

The answers are short on purpose: what a candidate can say in a minute. Each notebook section in
`deep` holds the measurement behind it. `PLANNED_NOTEBOOKS` are notebooks being written alongside this
one; links to them point at the file only.
"""

from __future__ import annotations

import html
import random
import re
from dataclasses import dataclass, field

from ..util.validation import check_number, check_optional

# Notebooks linked by file name before they existed (their links are then not checked). All have landed.
PLANNED_NOTEBOOKS: tuple[str, ...] = ()


@dataclass(frozen=True)
class Section:
    """A place in the lab: a notebook file and, unless the notebook is planned, one of its headings
    (the text after the #'s, exactly)."""

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
    number: int
    part: str  # A, B or C of the question list
    title_zh: str
    title_en: str
    answer: str  # markdown, two to five sentences
    deep: tuple[Section, ...] = field(default_factory=tuple)

    @property
    def heading(self) -> str:
        return f"Q{self.number} · {self.title_zh} — {self.title_en}"


def _url(target: str) -> str:
    """A link target markdown cannot cut short: spaces and parentheses %-encoded, the rest (the
    anchors' dashes and Chinese characters included) as it is, which Jupyter and GitHub both follow."""
    return target.replace("%", "%25").replace(" ", "%20").replace("(", "%28").replace(")", "%29")



def _escape_md(text: str) -> str:
    return text.replace("[", "\\[").replace("]", "\\]")


S = Section  # short name for the table below
NB05, NB06, NB07, NB08, NB09 = ("05_policy_gradients.ipynb", "06_ppo.ipynb", "07_grpo.ipynb", "08_gspo.ipynb",
                                "09_showdown.ipynb")

QUESTIONS: tuple[Question, ...] = (
    Question(1, "A", "GRPO 偏好对齐项目复盘：标注一致性、奖励模型、KL 系数", "Walk through a GRPO preference-alignment project",
             "Agreement first: Cohen's $\\kappa = (p_o - p_e)/(1 - p_e)$ corrects raw agreement for chance, and it "
             "bounds what a reward model can learn from those labels. Then the reward model's held-out pairwise "
             "accuracy per epoch (train rising while held-out stalls = overfitting), a KL coefficient chosen by "
             "watching the gold or held-out metric against KL, and automatic metrics beside human review: "
             "held-out accuracy, length, diversity, win rate against the starting policy.",
             (S("10_reward_models.ipynb"), S("11_reward_hacking.ipynb"), S(NB07, "Q7 — Is GRPO's KL the same as PPO's?"))),
    Question(2, "A", "SFT、蒸馏还是强化学习？", "When is SFT enough, when distillation, when RL?",
             "SFT copies demonstrations: enough when good answers exist and you can write them down. Distillation "
             "copies a stronger model's outputs (or distributions): cheaper than RL when such a teacher exists. RL "
             "needs only a way to score answers, and improves on what the model already samples; it cannot "
             "reward what the model never produces, so it comes after SFT. They chain: SFT -> distillation -> RL.",
             (S(NB09, "5. Q2 — SFT, distillation or RL?"),
              S("04_sft_and_data_format.ipynb", "4. How the shipped RL starting checkpoint was made, and why RL wants a half-right model"))),
    Question(3, "A", "GRPO 训练监控哪些指标？奖励黑客", "Which metrics do you watch in GRPO training? Reward hacking",
             "Reward mean and std (std collapsing to zero, or every group scoring the same, means no signal), "
             "the share of groups with zero std, KL to the reference, clip fraction, entropy, completion length "
             "and truncation rate, gradient norm, and a held-out metric the optimiser does not see. Reward "
             "rising while the held-out metric falls is reward hacking: the policy found what the reward "
             "model over-values; fix the reward, add a KL or ensemble penalty, or stop early.",
             (S(NB07, "Q3 — Which metrics to watch during GRPO training, and what does failure look like?"),
              S("11_reward_hacking.ipynb"))),
    Question(4, "A", "写出 GRPO 损失并解释每一项", "Write the GRPO loss and explain every term",
             "$L = -\\frac{1}{G}\\sum_i \\frac{1}{|o_i|}\\sum_t \\min(r_{it} A_i,\\ \\mathrm{clip}(r_{it}, 1-\\epsilon, "
             "1+\\epsilon) A_i) + \\beta\\, k_3$: $r_{it}$ the token's importance ratio to the sampling policy, $A_i$ "
             "the group-normalised reward, the min with the clip a pessimistic bound that stops pushing once the "
             "ratio has moved by $\\epsilon$, $\\beta k_3$ the KL to the reference. $\\epsilon = 0.2$ comes from PPO's "
             "paper (a sweep on control tasks); smaller clips more and learns slower, larger lets noisy steps through.",
             (S(NB07, "Q4 — The GRPO loss, term by term"),
              S(NB07, "Where does $\\epsilon = 0.2$ come from, and what do $\\epsilon = 0.05$ or $0.5$ do?"))),
    Question(5, "A", "为什么用优势函数而不是原始奖励？", "Why advantages and not raw rewards?",
             "Subtracting a baseline does not change the expected gradient but removes much of its variance; a "
             "per-prompt baseline also removes prompt difficulty (an easy prompt's correct answer is no news). "
             "Dividing by a std fixes the scale. Raw rewards work when they are already centred (e.g. +1/-1 with "
             "balanced outcomes) or with huge batches, just more slowly.",
             (S(NB05, "3. Q5 — Why advantages and not raw rewards? Baselines"),
              S(NB07, "Q5 — Why advantages and not raw rewards?"))),
    Question(6, "A", "重要性采样：为什么需要，为什么要裁剪", "Importance sampling: why, and why clip",
             "After the first optimiser step the batch was sampled by an older policy; weighting each token by "
             "$\\pi_\\theta/\\pi_{old}$ keeps the gradient estimate unbiased. When the policies differ a lot the "
             "ratios get large and the estimate's variance explodes; the clip removes the incentive to move a "
             "token's probability further than $1 \\pm \\epsilon$ within one batch.",
             (S(NB05, "4. Q6 — Importance sampling: reusing a batch"),)),
    Question(7, "A", "GRPO 的 KL 和 PPO 的一样吗？", "Is GRPO's KL the same as PPO's?",
             "Same target, different place and estimator: PPO subtracts $\\beta k_1 = \\beta(\\log\\pi - "
             "\\log\\pi_{ref})$ from each token's reward, so it enters the advantages; GRPO adds $\\beta k_3$ to the "
             "loss. Both use the starting (usually SFT) policy as the reference.",
             (S(NB07, "Q7 — Is GRPO's KL the same as PPO's?"),
              S(NB06, "5. Q7 — The KL penalty: in the reward (PPO, $k_1$) or in the loss (GRPO, $k_3$)"))),
    Question(8, "A", "同策略还是异策略？为什么不多跑几轮？", "On-policy or off-policy? Why not many more epochs?",
             "PPO and GRPO are on-policy methods that tolerate a little off-policyness: a few passes over one "
             "batch, corrected by importance ratios and bounded by the clip. Each extra pass drifts further from "
             "the sampling policy: ratios spread, more tokens are clipped (and give no gradient), and the data "
             "goes stale. Measure the clip fraction against passes rather than trust a rule of thumb.",
             (S(NB05, "8. Q8 — On-policy or off-policy? How many passes over one batch?"),)),
    Question(9, "A", "PPO 和 GRPO 各自怎么得到优势？", "How do PPO and GRPO get their advantages?",
             "PPO: a learned critic $V$, TD errors $\\delta_t = r_t + \\gamma V_{t+1} - V_t$, and GAE over them: one "
             "advantage per token, at the cost of a second network (memory, compute, and a critic that must fit). "
             "GRPO: sample $G$ answers per prompt and use the group's mean (and std) as the baseline: one "
             "advantage per answer, no critic, $G$ times the generation.",
             (S(NB07, "Q9 — How does PPO get its advantages, and how does GRPO?"),
              S(NB06, "2. Q21 — GAE: from per-token rewards and values to per-token advantages"))),
    Question(10, "A", "信用分配：一个回答一个奖励，每个 token 的优势怎么来？", "Credit assignment: one reward, which tokens earned it?",
             "Outcome-reward methods give every token of an answer the same advantage, so a right step in a "
             "wrong answer is pushed down with the rest; only averaging over many samples separates them. A "
             "critic (GAE) can in principle tell tokens apart if it learns to; process rewards or token-level "
             "rewards score steps directly.",
             (S(NB07, "Q10 — Credit assignment: one reward per answer, one advantage per token?"),)),
    Question(11, "A", "多轮智能体与单轮：误差累积、上下文增长、何时停止、跨轮信用分配",
             "Multi-turn agents vs single turn",
             "Each turn's output becomes the next turn's input, so errors compound (episode success is roughly "
             "the product of the turns' success), the context grows with every tool result, the episode needs a "
             "stop rule (a turn the environment cannot parse ends it), and one episode reward must be shared "
             "across turns: given to every turn, a correct early turn is punished for a later mistake. Per-turn "
             "(process) rewards or turn-level critics fix the credit, at the cost of judging each turn.",
             (S(NB07, "Q10 — Credit assignment: one reward per answer, one advantage per token?"),)),
    Question(12, "A", "手写整数平方根：二分与牛顿法", "Integer square root: binary search and Newton",
             "Binary search over $[0, n]$ for the largest $m$ with $m^2 \\le n$, midpoint $lo + (hi - lo) // 2$ so "
             "it cannot overflow in fixed-width integers, $O(\\log n)$ steps. Newton on $f(x) = x^2 - n$: "
             "$x \\leftarrow (x + n // x) // 2$ from $x = n$, stop when it stops decreasing; quadratic convergence. "
             "Test $0, 1, 2, 3, 4$, perfect squares, and the largest input.",
             (S("exercises/"),)),
    Question(13, "A", "GRPO 相比 PPO 去掉 critic 省了什么？", "GRPO vs PPO: what does removing the critic save?",
             "The critic's parameters, its optimiser states, its gradients and activations, and its forward and "
             "backward passes. How much depends on the critic: a value head on the shared trunk costs almost "
             "nothing; a separate critic the size of the policy adds one more model plus its Adam states. "
             "Measure it rather than quote a percentage.",
             (S(NB06, "8. Q13 — What does dropping the critic save? Memory measured"), S("14_scale_up.ipynb"))),
    Question(14, "A", "GSPO（序列级策略优化）：为什么用序列级比率", "GSPO: why sequence-level ratios?",
             "GSPO's ratio is the length-normalised sequence likelihood ratio $s_i = (\\pi/\\pi_{old})^{1/|y_i|}$, "
             "one per answer, matching the sequence-level reward; clipping then keeps or drops whole answers. "
             "Token ratios are noisy, and in MoE models routing changes make them noisier still. Its clip range is "
             "SMALLER ($3e-4$ / $4e-4$ vs 0.2), not larger; the share of clipped tokens is what is larger.",
             (S(NB08, "4. Q14 — The clipped fraction: GSPO vs GRPO, and the \"larger clip range\" myth"),
              S(NB08, "6. Q14 — Why GSPO helps Mixture-of-Experts models (measured in notebook 15)"),
              S("15_moe_and_gspo.ipynb", "6. Q14 (MoE part) in an interview, and the \"load imbalance\" folklore"))),
    Question(15, "B", "SFT 数据格式：先推理后答案，还是先答案后解释？", "SFT data: reasoning first or answer first?",
             "Reasoning first: the answer tokens are then conditioned on the worked steps, so the model can use "
             "them as computation; written after the answer, the explanation cannot help produce it. Measure "
             "held-out and out-of-distribution accuracy for both formats on the same budget.",
             (S("04_sft_and_data_format.ipynb",
                "Q15 — Chain-of-thought then answer, or answer then explanation: which generalises better, and why?"),)),
    Question(16, "B", "为什么越靠后的 token 概率越高？温度采样、核采样、重复惩罚",
             "Why are later tokens more probable? Temperature, top-p, repetition penalty",
             "Later tokens are conditioned on more context that pins down what comes next (and the model's own "
             "earlier tokens make it consistent). Temperature divides the logits (sharper below 1, flatter above), "
             "top-p keeps the smallest set of tokens whose probability reaches $p$, and the repetition penalty "
             "lowers the logits of tokens already present, sign-aware.",
             (S("01_sampling.ipynb", "Q16 — Why are later tokens of a sequence more confident?"),
              S("01_sampling.ipynb", "Q16, second half — temperature, top-p and the repetition penalty: the folklore checked"))),
    Question(17, "B", "旋转位置编码 RoPE", "RoPE: write it",
             "Rotate each pair of query and key dimensions by the angle $m\\theta_i$, $\\theta_i = "
             "10000^{-2i/d}$; then $\\langle R_m q, R_n k\\rangle$ depends on $m - n$ only. Complex form: multiply "
             "by $e^{im\\theta_i}$. Two pairings exist (interleaved vs rotate-half), equal after permuting the "
             "projection rows. Compute the angles in fp32: fp16 positions and angles lose precision.",
             (S("02_rope.ipynb", "Q17 — The two pairing conventions, and the permutation between them"),
              S("02_rope.ipynb", "Q17 — fp16 and bf16 pitfalls"))),
    Question(18, "B", "KV 缓存：显存、分页、前缀共享、量化", "KV cache: memory, paging, prefix sharing, quantization",
             "Bytes $= 2 \\cdot L \\cdot n_{kv} \\cdot d_{head} \\cdot T \\cdot B \\cdot$ bytes per element. Paged "
             "storage allocates fixed-size blocks through a block table, so memory is not reserved for the maximum "
             "length and samples of one prompt can share the prompt's blocks. An int8 cache halves memory again "
             "for a small error. Decoding with a cache does one token of work per step instead of the whole prefix.",
             (S("03_kv_cache.ipynb", "Q18 — How much memory does the KV cache take?"),
              S("03_kv_cache.ipynb", "Q18 — Paged storage and prefix sharing"))),
    Question(19, "C", "RLHF 三阶段；LLM 的状态、动作、奖励", "The three RLHF stages; state, action, reward",
             "SFT on demonstrations, a reward model trained on human preference pairs, then RL against it with "
             "a KL to the SFT model. State: the prompt plus the tokens so far. Action: the next token, one of "
             "the vocabulary (discrete). Reward: usually one score for the finished answer, plus the per-token KL "
             "penalty.",
             (S(NB05, "1. Q19 — The RLHF pipeline, and state, action, reward for an LLM"), S("10_reward_models.ipynb"))),
    Question(20, "C", "REINFORCE → 基线 → Actor-Critic → TRPO → PPO", "REINFORCE to PPO: what each step fixes",
             "REINFORCE is unbiased but noisy; a baseline cuts the variance; a critic makes the baseline "
             "state-dependent and allows bootstrapping; TRPO bounds each step with a hard KL constraint (a "
             "second-order solve); PPO gets most of that with a first-order clipped objective that several "
             "minibatch passes can reuse.",
             (S(NB05, "6. Q20 — REINFORCE → baseline → actor-critic → TRPO → PPO: what each step fixes"),)),
    Question(21, "C", "PPO 细节：GAE、裁剪比率、价值损失", "PPO in detail: GAE, the clipped ratio, the value loss",
             "Advantages from GAE over per-token rewards (score on the last token, KL penalty on every token), "
             "whitened; the policy loss $-\\min(rA, \\mathrm{clip}(r)A)$; a clipped value loss against the returns "
             "$R_t = A_t + V_t$. The clip approximates a trust region: past $1 \\pm \\epsilon$ the objective is "
             "flat, so the gradient stops pulling the token further.",
             (S(NB06, "7. Q21, Q22, Q23 — PPO in detail, its hyperparameters, and the clip range"),
              S(NB06, "4. Value clipping"))),
    Question(22, "C", "PPO 典型超参数及原因", "Typical PPO hyperparameters, and why",
             "Clip around 0.2, $\\lambda$ a little below 1 with $\\gamma = 1$ (episodes are short and the "
             "reward is at the end), learning rates orders of magnitude below pre-training (the policy starts "
             "good and a large step destroys it), a few epochs, gradient clipping. Sweep them on your own setup: "
             "the lab's runs below show which ones matter here.",
             (S(NB06, "7. Q21, Q22, Q23 — PPO in detail, its hyperparameters, and the clip range"),)),
    Question(23, "C", "裁剪范围太大/太小会怎样", "Clip range too large or too small",
             "Too small: most tokens are clipped after the first minibatch and contribute no gradient, so "
             "learning slows. Too large: nothing bounds a step, so a few noisy ratios dominate and training can "
             "become unstable. Read it on the clip fraction and the KL.",
             (S(NB07, "Where does $\\epsilon = 0.2$ come from, and what do $\\epsilon = 0.05$ or $0.5$ do?"),
              S(NB06, "7. Q21, Q22, Q23 — PPO in detail, its hyperparameters, and the clip range"))),
    Question(24, "C", "RLHF 奖励设计", "Designing an RLHF reward",
             "A preference (reward-model) score, plus auxiliary rule-based terms (format, length, correctness "
             "checks), minus a KL to the reference that keeps the policy where the reward model is trustworthy. "
             "Every term is something the policy will exploit: test each for the cheapest way to game it.",
             (S("10_reward_models.ipynb"), S("11_reward_hacking.ipynb"),
              S(NB06, "5. Q7 — The KL penalty: in the reward (PPO, $k_1$) or in the loss (GRPO, $k_3$)"))),
    Question(25, "C", "PPO 与 DQN、SAC、A3C 的区别", "PPO vs DQN vs SAC vs A3C",
             "DQN learns $Q(s, a)$ for every action and acts greedily: for an LLM that is a head over the whole "
             "vocabulary trained by bootstrapped targets, off-policy from a replay buffer. SAC is an off-policy "
             "actor-critic with an entropy bonus, designed for continuous actions (an LLM's actions are discrete "
             "tokens). A3C is asynchronous on-policy actor-critic. PPO is on-policy with a clipped surrogate, "
             "stable and simple at scale, hence its use in RLHF.",
             (S(NB05, "6. Q20 — REINFORCE → baseline → actor-critic → TRPO → PPO: what each step fixes"),)),
    Question(26, "C", "常见实现错误", "Common implementation mistakes",
             "No advantage normalisation (the step size follows the reward's scale), no gradient clipping (one "
             "bad batch takes a huge step), mixing on- and off-policy data without ratios, a wrong GAE recursion "
             "(wrong direction or the wrong value added), log-probs in low precision (ratios that are not 1 when "
             "they should be), and the 'GRPO loss is 0 at the first step' puzzle: the ratio is 1 and the group "
             "advantages sum to zero, yet the gradient is not zero.",
             (S(NB05, "7. Q26 — \"Why is my GRPO loss 0 at the first step?\""),
              S(NB06, "2. Q21 — GAE: from per-token rewards and values to per-token advantages"))),
)


def question(number: int) -> Question:
    """The question numbered `number` (1..26)."""
    check_number("number", number, low=1, high=len(QUESTIONS), integer=True)
    return QUESTIONS[number - 1]


def question_markdown(number: int, with_answer: bool = True) -> str:
    """The drill's text for one question: the question, the model answer, the links."""
    q = question(number)
    text = f"**{q.title_en}** ({q.title_zh})"
    if with_answer:
        text += f"\n\n**Model answer.** {q.answer}"
    if q.deep:
        text += "\n\n**Go deep:** " + "; ".join(s.link for s in q.deep) + "."
    return text


# ------------------------------------------------------------------------------------------------
# Glossary: the Chinese terms learners search for, mapped to the lab's names and sections.


@dataclass(frozen=True)
class Term:
    zh: str
    en: str
    lab: tuple[str, ...]  # importable dotted names in rlhf_lab, or config fields written "Config.field"
    where: tuple[Section, ...]


GLOSSARY: tuple[Term, ...] = (
    Term("优势函数", "advantage", ("rlhf_lab.rl.advantages.group_advantages", "rlhf_lab.rl.advantages.gae"),
         (S(NB05, "3. Q5 — Why advantages and not raw rewards? Baselines"),)),
    Term("基线", "baseline", ("rlhf_lab.rl.advantages.rloo_advantages", "rlhf_lab.rl.advantages.remax_advantages"),
         (S(NB05, "3. Q5 — Why advantages and not raw rewards? Baselines"),)),
    Term("广义优势估计", "GAE (generalised advantage estimation)", ("rlhf_lab.rl.advantages.gae", "PPOConfig.lam"),
         (S(NB06, "2. Q21 — GAE: from per-token rewards and values to per-token advantages"),)),
    Term("优势归一化 / 白化", "advantage whitening", ("rlhf_lab.rl.advantages.whiten", "PPOConfig.whiten_advantages"),
         (S(NB06, "3. Advantage whitening"),)),
    Term("重要性采样", "importance sampling (ratio)", ("rlhf_lab.rl.losses.token_log_ratio",),
         (S(NB05, "4. Q6 — Importance sampling: reusing a batch"),)),
    Term("裁剪", "clipping (clip range epsilon)", ("rlhf_lab.rl.losses.clipped_surrogate", "RLConfig.epsilon"),
         (S(NB05, "5. Clipping: the PPO surrogate (what GRPO uses too)"),)),
    Term("信用分配", "credit assignment", ("rlhf_lab.tasks.tool_use.turn_advantages",),
         (S(NB07, "Q10 — Credit assignment: one reward per answer, one advantage per token?"),)),
    Term("奖励黑客", "reward hacking", ("rlhf_lab.rl.Trainer",),
         (S(NB07, "Q3 — Which metrics to watch during GRPO training, and what does failure look like?"),
          S("11_reward_hacking.ipynb"))),
    Term("奖励模型", "reward model", ("rlhf_lab.tasks.rewards.WeightedReward",), (S("10_reward_models.ipynb"),)),
    Term("标注一致性", "annotator agreement (Cohen's kappa)", (), (S("10_reward_models.ipynb"),)),
    Term("直接偏好优化", "DPO (direct preference optimisation)", (), (S("12_dpo.ipynb"),)),
    Term("KL 散度惩罚", "KL penalty", ("rlhf_lab.rl.kl.kl_estimate", "PPOConfig.kl_coef", "GRPOConfig.beta"),
         (S(NB06, "5. Q7 — The KL penalty: in the reward (PPO, $k_1$) or in the loss (GRPO, $k_3$)"),)),
    Term("参考模型", "reference model (pi_ref)", ("rlhf_lab.rl.Trainer",),
         (S(NB07, "Q7 — Is GRPO's KL the same as PPO's?"),)),
    Term("价值函数 / 评论家", "value function, critic", ("rlhf_lab.rl.PPO", "PPOConfig.critic"),
         (S(NB06, "1. The critic: a value for every prefix"),)),
    Term("同策略 / 异策略", "on-policy / off-policy", ("RLConfig.num_iterations", "RLConfig.num_minibatches"),
         (S(NB05, "8. Q8 — On-policy or off-policy? How many passes over one batch?"),)),
    Term("组相对策略优化", "GRPO (group relative policy optimisation)", ("rlhf_lab.rl.GRPO",),
         (S(NB07, "Q4 — The GRPO loss, term by term"),)),
    Term("近端策略优化", "PPO (proximal policy optimisation)", ("rlhf_lab.rl.PPO",),
         (S(NB06, "7. Q21, Q22, Q23 — PPO in detail, its hyperparameters, and the clip range"),)),
    Term("序列级策略优化", "GSPO (sequence-level ratios)", ("rlhf_lab.rl.GSPO",),
         (S(NB08, "1. One ratio per completion"),)),
    Term("熵", "entropy", ("rlhf_lab.rl.metrics.METRIC_COLUMNS",),
         (S(NB07, "Q3 — Which metrics to watch during GRPO training, and what does failure look like?"),)),
    Term("温度采样", "temperature sampling", ("rlhf_lab.sampling.SamplingConfig",),
         (S("01_sampling.ipynb", "3. Temperature"),)),
    Term("核采样", "top-p (nucleus) sampling", ("rlhf_lab.sampling.SamplingConfig",),
         (S("01_sampling.ipynb", "4. Truncation: top-k, top-p (nucleus) and min-p"),)),
    Term("重复惩罚", "repetition penalty", ("rlhf_lab.sampling.SamplingConfig",),
         (S("01_sampling.ipynb", "5. Repetition penalty and no-repeat-n-gram"),)),
    Term("旋转位置编码", "RoPE (rotary position embedding)", ("rlhf_lab.model.rope",),
         (S("02_rope.ipynb", "Q17 — Write RoPE, part 1: a rotation in two dimensions"),)),
    Term("KV 缓存", "KV cache", ("rlhf_lab.model.kv_cache",),
         (S("03_kv_cache.ipynb", "1. What is cached, and why it is exact"),)),
    Term("监督微调", "SFT (supervised fine-tuning)", ("rlhf_lab.sft.SFTTrainer",),
         (S("04_sft_and_data_format.ipynb", "1. The SFT loss: cross-entropy on the completion only"),)),
    Term("思维链", "chain of thought (reasoning first)", ("rlhf_lab.tasks.get_task",),
         (S("04_sft_and_data_format.ipynb",
            "Q15 — Chain-of-thought then answer, or answer then explanation: which generalises better, and why?"),)),
    Term("多轮智能体", "multi-turn agent, tool use", ("rlhf_lab.tasks.tool_use.run_episodes",),
         (S("13_interview_drill.ipynb", "Q11 · 多轮智能体与单轮：误差累积、上下文增长、何时停止、跨轮信用分配 — Multi-turn agents vs single turn"),)),
    Term("过度优化", "over-optimisation (Goodhart)", (), (S("11_reward_hacking.ipynb"),)),
    Term("梯度裁剪", "gradient clipping", ("RLConfig.max_grad_norm",),
         (S("13_interview_drill.ipynb", "Q26 · 常见实现错误 — Common implementation mistakes"),)),
)


def glossary_markdown(base: str = "") -> str:
    """The glossary as a markdown table; `base` is prefixed to notebook links (e.g. "notebooks/")."""
    rows = ["| 中文 | English | in the lab | where |", "| --- | --- | --- | --- |"]
    for term in GLOSSARY:
        names = ", ".join(f"`{name}`" for name in term.lab) or "—"
        where = "; ".join(_rebase(s.link, base) for s in term.where)
        rows.append(f"| {term.zh} | {term.en} | {names} | {where} |")
    return "\n".join(rows)


def _rebase(link: str, base: str) -> str:
    return re.sub(r"\]\(", f"]({base}", link, count=1) if base else link


# ------------------------------------------------------------------------------------------------
# Mock interview


def mock_interview(seed: int | None = None, use_widgets: bool | None = None):
    """A random question with its answer hidden until you ask for it.

    In Jupyter with ipywidgets: "Next question" and "Reveal answer" buttons. Anywhere else (a script,
    a headless run, `use_widgets=False`): an HTML card with the answer in a collapsed <details>
    block, which GitHub renders collapsed too."""
    from ..viz.widgets import widgets_available

    check_optional(check_number, "seed", seed, integer=True)
    rng = random.Random(seed)
    if use_widgets is None:
        use_widgets = widgets_available()
    if not use_widgets:
        from IPython.display import HTML

        return HTML(question_card(rng.choice(QUESTIONS).number))

    import ipywidgets as widgets
    from IPython.display import Markdown, display

    output = widgets.Output()
    state = {"number": rng.choice(QUESTIONS).number, "revealed": False}

    def draw() -> None:
        output.clear_output()
        with output:
            display(Markdown(question_markdown(state["number"], with_answer=state["revealed"])))

    def next_question(_button) -> None:
        state["number"], state["revealed"] = rng.choice(QUESTIONS).number, False
        draw()

    def reveal(_button) -> None:
        state["revealed"] = True
        draw()

    next_button, reveal_button = widgets.Button(description="Next question"), widgets.Button(description="Reveal answer")
    next_button.on_click(next_question)
    reveal_button.on_click(reveal)
    draw()
    return widgets.VBox([widgets.HBox([next_button, reveal_button]), output])


def question_card(number: int) -> str:
    """One question as static HTML, the answer inside a collapsed <details> (the headless mock interview)."""
    q = question(number)
    return (f"<div><b>Q{q.number}. {html.escape(q.title_en)}</b> ({html.escape(q.title_zh)})"
            f"<details><summary>Reveal the model answer</summary><p>{html.escape(q.answer)}</p></details></div>")
