"""Write the exercise worksheets from the package's exercise definitions (signatures, hints), in
English and in Chinese:

    .venv/bin/python notebooks/exercises/make_worksheets.py

Run it after changing an exercise's signature, texts or hints (tests/test_exercise_notebooks.py checks
that the worksheets show the package's current ones). The worksheets are written without outputs.
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from rlhf_lab import exercises

HERE = Path(__file__).resolve().parent

# The formula of each exercise. Its title, question, explanation and hints, in English and in Chinese,
# are the package's (rlhf_lab/exercises): the checker and the interview rounds show the same texts.
FORMULA = {
    "group_advantages": r"$$A_i = \frac{r_i - \operatorname{mean}(r_1..r_G)}{\operatorname{std}(r_1..r_G) + \varepsilon},"
                        r"\qquad \text{std with } G-1,\ \varepsilon = 10^{-4}\ \text{(TRL)}$$",
    "gae": r"$$\delta_t = r_t + \gamma V_{t+1}(1-d_t) - V_t,\quad A_t = \delta_t + "
           r"\gamma\lambda(1-d_t)A_{t+1},\quad R_t = A_t + V_t$$",
    "whiten": r"$$\hat x = \frac{x - \mu}{\sqrt{\sigma^2 + 10^{-8}}},\qquad \mu, \sigma^2 \text{ over } "
              r"\{x_{it} : m_{it} = 1\},\ \sigma^2 \text{ unbiased}$$",
    "clipped_policy_loss": r"$$\ell_t = -\min\big(r_t A_t,\ \operatorname{clip}(r_t, 1-\varepsilon_{low}, "
                           r"1+\varepsilon_{high}) A_t\big),\quad r_t = "
                           r"e^{\log\pi_\theta(a_t) - \log\pi_{old}(a_t)}$$",
    "kl_estimators": r"$$x = \log\pi_{ref}(a) - \log\pi(a):\qquad k_1 = -x,\quad k_2 = \tfrac{1}{2}x^2,\quad "
                     r"k_3 = e^{x} - x - 1$$",
    "gspo_ratio": r"$$s_i = \exp\Big(\frac{1}{|y_i|}\sum_t "
                  r"\log\frac{\pi_\theta(y_{it})}{\pi_{old}(y_{it})}\Big)$$",
    "aggregate": r"$$\text{grpo: } \tfrac{1}{B}\sum_i \tfrac{1}{|o_i|}\sum_t \ell_{it}\qquad \text{bnpo: } "
                 r"\tfrac{\sum \ell}{\sum m}\qquad \text{dr\_grpo: } \tfrac{\sum \ell}{B\,L_{max}}$$",
    "clipped_value_loss": r"$$L_V = \tfrac12\,\operatorname{mean}\big(\max((V - R)^2,\ "
                          r"(\operatorname{clip}(V, V_{old}-c, V_{old}+c) - R)^2)\big)$$",
    "filter_logits": r"$$p = \operatorname{softmax}(z/T);\quad \text{top-}p \text{ keeps the smallest } S "
                     r"\text{ with } \textstyle\sum_{i\in S} p_i \ge p$$",
    "repetition_penalty": r"$$z_v \leftarrow \begin{cases} z_v/\theta & z_v > 0\\ z_v\,\theta & z_v \le "
                          r"0\end{cases}\quad \text{for each } v \text{ in the context}$$",
    "rope_half_split": r"$$\theta_i = b^{-2i/d},\quad x' = x\odot\cos(m\theta) + "
                       r"\operatorname{rotate\_half}(x)\odot\sin(m\theta)$$",
    "rope_complex": r"$$z_i = x_{2i} + \mathrm{i}\,x_{2i+1},\qquad z_i' = z_i\, e^{\mathrm{i} m \theta_i}$$",
    "attention_decode_step": r"$$o = \operatorname{softmax}\big(q K'^\top/\sqrt d\big) V',\quad "
                             r"K' = [K_{cache}; k_{new}],\ V' = [V_{cache}; v_{new}]$$",
    "attention_backward": r"$$dV = P^\top dO,\quad dP = dO\,V^\top,\quad dS = P\odot(dP - "
                          r"\operatorname{rowsum}(dP\odot P)),\quad dQ = dS\,K/\sqrt d,\quad dK = dS^\top "
                          r"Q/\sqrt d$$",
    "isqrt_binary_search": r"$$\lfloor\sqrt n\rfloor = \max\{x \ge 0 : x^2 \le n\}$$",
    "isqrt_newton": r"$$x_{k+1} = \Big\lfloor \frac{x_k + \lfloor n / x_k\rfloor}{2} \Big\rfloor$$",
    "cohen_kappa": r"$$\kappa = \frac{p_o - p_e}{1 - p_e},\qquad p_e = \sum_k p_A(k)\,p_B(k)$$",
    "bradley_terry_loss": r"$$\mathcal L = -\log\sigma(r_w - r_l - m)$$",
    "dpo_loss": r"$$\log\pi(y) = \sum_t m_t \log\pi(y_t)\ \ \text{(DPO)},\qquad \log\pi(y) = "
                r"\frac{\sum_t m_t \log\pi(y_t)}{\sum_t m_t}\ \ \text{(IPO, as TRL)}$$" "\n"
                r"$$h = (\log\pi(y_w) - \log\pi_{ref}(y_w)) - (\log\pi(y_l) - \log\pi_{ref}(y_l)),\quad "
                r"\mathcal L_{DPO} = -(1-\epsilon)\log\sigma(\beta h) - \epsilon\log\sigma(-\beta h),\quad "
                r"\mathcal L_{IPO} = \big(h - \tfrac{1}{2\beta}\big)^2$$",
}

# What to say in an interview: (English, Chinese)
INTERVIEW = {
    "group_advantages": (
        "GRPO replaces the critic by the group: each answer's advantage is its reward minus the group mean, "
        "divided by the group's sample std plus 1e-4 (TRL). A group whose rewards are all equal gives zero "
        "advantage and no gradient.",
        "GRPO 用同一个提示词的一组回答代替价值模型：每个回答的优势等于它的奖励减去组内均值，"
        "再除以组内样本标准差加 1e-4（TRL 的写法）。如果一组的奖励全都相同，优势为零，这组数据不产生梯度。"),
    "gae": (
        "GAE sums TD errors discounted by gamma*lambda, computed backwards from the last real token, where "
        "the value of the next state is 0. The value target is A_t + V_t; the snippet that adds values[:-1] "
        "inside the loop is wrong.",
        "GAE 把时序差分误差按 γλ 的幂次加权求和，从最后一个真实 token 开始倒着算，那里下一状态的价值取 0。"
        "价值函数的学习目标是 A_t + V_t；面经里在循环中加上 `values[:-1]` 的那段代码是错的。"),
    "clipped_policy_loss": (
        "The loss is -min(rA, clip(r)A): the min makes the objective a pessimistic bound, so moving the "
        "ratio beyond the clip never helps. pi_old is detached; on-policy the ratio is exactly 1 and PPO "
        "reduces to REINFORCE with the clip inactive.",
        "损失是 `−min(rA, clip(r)A)`：取 min 让目标成为悲观下界，把比率推出裁剪区间得不到任何好处。π_old "
        "要截断梯度；同策略时比率恰好为 1，裁剪不起作用，PPO 就退化成 REINFORCE。"),
    "filter_logits": (
        "Order is temperature, top-k, top-p. Top-p keeps the token that crosses the threshold, so the kept "
        "mass is at least p; HF implements it by removing tokens whose ascending cumulative mass is <= 1 - "
        "p.",
        "顺序是温度、top-k、top-p。top-p 会保留让累计概率越过阈值的那个 token，所以保留下来的概率质量至少是 "
        "p；HF 的实现是按概率升序求累计和，删掉累计值 ≤ 1 − p 的 token。"),
    "attention_backward": (
        "dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = dS K / sqrt(d), dK = dS^T Q / "
        "sqrt(d). FlashAttention computes the rowsum as rowsum(dO * O), which needs no P.",
        "dV = Pᵀ dO，dP = dO Vᵀ，dS = P ∘ (dP − rowsum(dP ∘ P))，dQ = dS K / sqrt(d)，dK = dSᵀ Q / sqrt(d)。"
        "FlashAttention 把其中的 rowsum 写成 rowsum(dO ∘ O)，这样就不需要存下 P。"),
}

DIFFICULTY_ZH = {"easy": "简单", "medium": "中等", "hard": "困难"}


def exercise_cells(name):
    e = exercises.get(name)
    hints = "\n".join(f"<details><summary>Hint {i} · 提示 {i}</summary>\n\n{en}\n\n{zh}\n\n</details>"
                      for i, (en, zh) in enumerate(zip(e.hints_in("en"), e.hints_in("zh")), 1))
    md = (f"### {e.title_in('en')} · {e.title_in('zh')}\n\n"
          f"*{e.difficulty}, about {e.minutes} min · {DIFFICULTY_ZH[e.difficulty]}，约 {e.minutes} 分钟*\n\n"
          f"**Question.** {e.question_in('en')}\n\n**题目：** {e.question_in('zh')}\n\n"
          f"{e.explanation_in('en')}\n\n{e.explanation_in('zh')}\n\n{FORMULA[name]}\n\n"
          f"Source: {e.source}.\n\n{hints}\n\n"
          f"Stuck for good? `print(exercises.solution(\"{name}\"))` shows the reference solution. "
          f"实在卡住了？`print(exercises.solution(\"{name}\"))` 会打印参考答案。")
    blank = new_code_cell(f"# YOUR CODE: fill in the body. 在这里写函数体。\n{e.signature}\n"
                          f"    raise NotImplementedError(\"write {name}\")",
                          metadata={"exercise": name, "tags": ["exercise-blank"]})
    check = new_code_cell(f"exercises.check(\"{name}\", {name})", metadata={"tags": ["exercise-check"]})
    cells = [new_markdown_cell(md), blank, check]
    if name in INTERVIEW:
        english, chinese = INTERVIEW[name]
        cells.append(new_markdown_cell(f"> **What to say in an interview.** {english}\n>\n> **面试怎么答："
                                       f"** {chinese}"))
    return cells


def training_cells(name, algo, intro):
    return [
        new_markdown_cell(intro),
        new_code_cell(f"runs = training.compare_with_reference(\"{name}\", {name}, TRAINING)\n"
                      f"print(runs.groupby(\"run\")[[\"reward_mean\", \"eval_accuracy\"]].last().round(3))\n"
                      f"training.plot_comparison(runs, algo=\"{algo}\")"),
    ]


HOW = ("## How the exercises work · 练习怎么做\n\nEach exercise has a cell marked `# YOUR CODE`: replace "
       "the body (keep the name and the arguments) and run the check cell below it. The checker first "
       "checks your function's arguments, then runs published test vectors and seeded random cases against "
       "the reference solution, each under a time limit. When your function disagrees, it says what is "
       "wrong with the output's type or shape, runs a catalogue of known wrong versions (and pairs of them) "
       "on the same inputs and names the mistake whose outputs match yours (`Likely mistake [name]`), or "
       "which part of the failures a mistake explains, and prints the smallest failing case as a call you "
       "can paste and re-run. Hints open on click; `exercises.solution(name)` prints the reference, which "
       "is the package's own function wherever the package has one.\n\n每道练习都有一个标着 `# YOUR CODE` "
       "的代码单元格：改写函数体（函数名和参数不要动），然后运行下面的检查单元格。判题器先核对函数的参数，"
       "再把公开的测试向量和按随机种子生成的用例逐个跑一遍（每个用例都有时间限制），与参考答案比较。"
       "结果不一致时，它会指出输出的类型或形状哪里不对，把已知的错误写法（以及两两组合）"
       "在同样的输入上跑一遍，说出与你的输出吻合的错误（`很可能犯了这个错误 [名称]`），"
       "或者某个错误能解释哪一部分失败用例，并把最小的失败用例打印成可以直接粘贴重跑的调用。提示点开才显示；"
       "`exercises.solution(name)` 打印参考答案，只要本库里有现成的函数，参考答案就是它。\n\nVerdicts in "
       "Chinese: `exercises.set_language(\"zh\")`, or `exercises.check(name, function, lang=\"zh\")`. "
       "想看中文判定：运行 `exercises.set_language(\"zh\")`，或者 `exercises.check(name, function, "
       "lang=\"zh\")`。")


def rl_notebook():
    names = ["group_advantages", "gae", "whiten", "clipped_policy_loss", "kl_estimators", "gspo_ratio", "aggregate",
             "clipped_value_loss"]
    cells = [new_markdown_cell(
        "# Exercises 1: advantages and losses of PPO, GRPO and GSPO\n# 练习一：PPO、GRPO 和 GSPO "
        "的优势与损失\n\n**What you will learn**: to write, from a blank cell, the eight pieces of RL "
        "fine-tuning that interviews ask for (group advantages, GAE, whitening, the clipped surrogate, KL "
        "estimators, GSPO's ratio, the loss aggregations, the clipped value loss), and to watch your own "
        "advantages drive GRPO and your own GAE drive PPO on the lab's tiny Llama.\n\n**你将学到**："
        "从空白的代码单元格开始，手写面试常考的八个强化学习微调组件（组内相对优势、广义优势估计 GAE、"
        "优势白化、裁剪替代目标、KL 估计量、GSPO 的序列级重要性比率、损失聚合方式、裁剪价值损失），"
        "并亲眼看到自己写的优势函数驱动 GRPO、自己写的 GAE 驱动 PPO，在本项目的小型 Llama 上训练。"
        "\n\n**Prerequisites** · **前置知识**: notebooks 05 (policy gradients), 06 (PPO), 07 (GRPO) and 08 "
        "(GSPO) · 第 05（策略梯度）、06（PPO）、07（GRPO）、08（GSPO）号笔记本。\n\n**Run time** · "
        "**运行时间**: each check takes about a second. The two training comparisons (30 steps each for "
        "your run and the reference run) dominate: the whole notebook took 1218 s in full mode on a 2-core "
        "CPU shared with other jobs (so expect less on an idle laptop), and 29 s with `RLHF_LAB_FAST=1` "
        "(one step per run). No GPU needed. · 每次检查约一秒。耗时主要在两次训练对比上（你的和参考实现各训练"
        " 30 步）：在与其他任务共用的 2 核 CPU 上，完整模式跑完整个笔记本用了 1218 "
        "秒（空闲的笔记本电脑会更快），`RLHF_LAB_FAST=1` 时（每次只训练一步）用了 29 秒。不需要 GPU。"
        "\n\nThis notebook is committed without outputs: it is a worksheet. · 本笔记本提交时不带输出："
        "它是一份练习卷。"),
        new_code_cell("import torch\n\nfrom rlhf_lab import exercises\nfrom rlhf_lab.exercises import "
                      "training\nfrom rlhf_lab.teach.notebook import FAST, "
                      "setup\n\nsetup(seed=0)\nexercises.list_exercises(topic=None).query(\"topic in "
                      "('advantages', 'losses')\")"),
        new_markdown_cell(HOW),
        new_markdown_cell("## Advantages · 优势")]
    cells += exercise_cells("group_advantages")
    cells += [new_markdown_cell("## Your code trains the model · 用你的代码训练模型\n\nThe settings of both "
                                "runs below: the shipped checkpoint after SFT on reversed addition, the "
                                "same seed, the same prompts. · 下面两次训练的设置相同："
                                "同一个随附的检查点（已在倒序加法上做过监督微调），同一个随机种子，"
                                "同一批提示词。"),
              new_code_cell("TRAINING = dict(steps=1 if FAST else 30, prompts_per_step=2 if FAST else 16,\n  "
                            "              num_generations=4 if FAST else 8, eval_every=1 if FAST else 10,\n "
                            "               eval_examples=8 if FAST else 100)")]
    cells += training_cells(
        "group_advantages", "grpo",
        "Your `group_advantages` now replaces GRPO's (through `GRPO.outcome_advantages`; nothing is "
        "patched). Solid line: your run; dashed: the package's. With a correct function the two lines are "
        "the same line. A catalogued mistake changes the curve, or stops the run; one short run with one "
        "seed may also hide it (`seeds=(0, 1, 2)` shows the spread over seeds).\n\n现在由你的 `group_advanta"
        "ges` 代替 GRPO 自带的那个（通过 `GRPO.outcome_advantages` 接入，没有打任何补丁）。实线是你的训练，"
        "虚线是本库的。函数写对了，两条线完全重合。已收录的错误会改变曲线，或者让训练中断；"
        "不过只用一个随机种子、训练步数又少时，错误也可能看不出来（传入 `seeds=(0, 1, 2)` "
        "可以看到不同种子间的波动）。")
    for name in names[1:]:
        cells += exercise_cells(name)
        if name == "whiten":
            cells += training_cells("gae", "ppo", "### Your GAE drives PPO · 你的 GAE 驱动 PPO\n\nYour `gae` "
                                    "replaces PPO's (through `PPO.estimate_advantages`), beside the "
                                    "package's run. · 你的 `gae` 代替 PPO 自带的那个（通过 `PPO.estimate_advantages` 接入），"
                                    "与本库的训练并排对比。")
    cells.append(new_markdown_cell("## Next · 下一步\n\nExercises 2 (sampling, attention, coding questions, "
                                   "preferences) ends with a timed interview round. · 练习二（采样、注意力、手撕代码、偏好学习）最后"
                                   "有一轮限时模拟面试。"))
    return cells


def mechanisms_notebook():
    sections = [("Sampling · 采样", ["filter_logits", "repetition_penalty"]),
                ("Attention · 注意力", ["rope_half_split", "rope_complex", "attention_decode_step", "attention_backward"]),
                ("Coding warm-up (interview Q12) · 手撕代码（面试第 12 题）", ["isqrt_binary_search", "isqrt_newton"]),
                ("Human feedback · 人类反馈", ["cohen_kappa", "bradley_terry_loss", "dpo_loss"])]
    cells = [new_markdown_cell(
        "# Exercises 2: sampling, attention, coding questions and preferences, then a timed round\n# 练习二：采样、注"
        "意力、手撕代码与偏好学习，最后一轮限时模拟面试\n\n**What you will learn**: to write generate()'s sampling filters and the "
        "repetition penalty, RoPE in both layouts, one KV-cache decode step and the attention backward pass "
        "by hand, integer square root two ways without overflow, and the agreement and preference losses of "
        "RLHF; then to do a few of them against the clock.\n\n**你将学到**：手写 generate() 的采样过滤和重复惩罚、两种写法的旋转位置编码、带"
        " KV cache 的单步解码和手推注意力反向传播、两种不会溢出的整数平方根，以及 RLHF 中的标注一致性与偏好损失；最后限时再做几道。\n\n**Prerequisites** · **前置知识**: "
        "notebooks 01 (sampling), 02 (RoPE) and 03 (KV cache); notebook 10 for the preference exercises · 第 "
        "01（采样）、02（旋转位置编码）、03（KV cache）号笔记本；偏好学习的练习需要第 10 号。\n\n**Run time** · **运行时间**: no training: the whole "
        "notebook ran in 10 s on a 2-core CPU shared with other jobs (there is no FAST switch: nothing to "
        "shrink). No GPU needed. · 不涉及训练：在与其他任务共用的 2 核 CPU 上，整个笔记本 10 秒跑完（没有 FAST 开关，没什么可缩减的）。不需要 GPU。"
        "\n\nThis notebook is committed without outputs: it is a worksheet. · 本笔记本提交时不带输出：它是一份练习卷。"),
        new_code_cell("import torch\n\nfrom rlhf_lab import exercises\nfrom rlhf_lab.teach.notebook import "
                      "setup\n\nsetup(seed=0)\nexercises.list_exercises().query(\"topic not in "
                      "('advantages', 'losses')\")"),
        new_markdown_cell(HOW)]
    for title, names in sections:
        cells.append(new_markdown_cell(f"## {title}"))
        for name in names:
            cells += exercise_cells(name)
    cells += [
        new_markdown_cell(
            "## A timed interview round · 限时模拟面试\n\nThe next cell draws three exercises of this "
            "notebook, shows their signatures and starts a countdown (a live bar in Jupyter, a line of text "
            "elsewhere). Write the functions in the empty cell after it, under the names given, then run "
            "`round_.finish(globals())`: it stops the clock and prints each checker's verdict and the time "
            "you took. Functions you already wrote above count, so restart the kernel first for an honest "
            "round. For a round as an interviewer asks it, with the questions only and no formulas, pass "
            "`blind=True`; `lang=\"zh\"` gives the round in Chinese.\n\n下一个单元格会从本笔记本里随机抽三道"
            "题，显示函数签名并开始倒计时（在 Jupyter 里是一个实时进度条，在其他环境下是一行文字）。"
            "在它后面的空白单元格里按给定的函数名写好这些函数，然后运行 `round_.finish(globals())`："
            "计时停止，打印每道题的判定结果和你用的时间。上面已经写过的函数也会被算进去，所以想认真测一次，"
            "先重启内核。想要更像真实面试的形式，只看题目、不给公式，就传入 `blind=True`；`lang=\"zh\"` "
            "则用中文出题和判定。"),
        new_code_cell("round_ = exercises.interview_round(k=3, topics=(\"sampling\", \"attention\", "
                      "\"coding\", \"preferences\"))"),
        new_code_cell("# YOUR CODE for the round goes here (one function per task, named as shown above).\n"
                      "# 在这里写本轮的答案（每道题一个函数，函数名与上面显示的一致）。",
                      metadata={"tags": ["round-answers"]}),
        new_code_cell("round_.finish(globals())", metadata={"tags": ["round-finish"]}),
    ]
    return cells


def write(cells, path):
    for index, cell in enumerate(cells):
        cell.id = f"cell-{index:03d}"  # stable ids: regenerating gives no diff
    nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                                             "language_info": {"name": "python"}})
    nbformat.validate(nb)
    nbformat.write(nb, path)


if __name__ == "__main__":
    write(rl_notebook(), HERE / "01_rl_exercises.ipynb")
    write(mechanisms_notebook(), HERE / "02_mechanisms_and_coding.ipynb")
