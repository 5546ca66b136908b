"""Write the exercise worksheets from the package's exercise definitions (signatures, hints):

    .venv/bin/python notebooks/exercises/make_worksheets.py

Run it after changing an exercise's signature or hints (tests/test_exercise_notebooks.py checks that
the worksheets show the package's current ones). The worksheets are written without outputs.
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from rlhf_lab import exercises

HERE = Path(__file__).resolve().parent

TEXT = {
"group_advantages": ("How does GRPO get a baseline without a critic?",
  "Sample G answers to the same prompt and use the group as its own baseline: an answer's advantage is how many standard deviations its reward sits above the group mean. Every token of the answer gets that one value.",
  r"$$A_i = \frac{r_i - \operatorname{mean}(r_1..r_G)}{\operatorname{std}(r_1..r_G) + \varepsilon},\qquad \text{std with } G-1,\ \varepsilon = 10^{-4}\ \text{(TRL)}$$"),
"gae": ("Write GAE. Why does the loop run backwards?",
  "GAE blends one-step TD errors with exponentially decaying weights (lambda) so that the advantage trades bias for variance. Each A_t needs A_{t+1}, so it is computed from the last token backwards; the episode ends at the last real token, where nothing is bootstrapped.",
  r"$$\delta_t = r_t + \gamma V_{t+1}(1-d_t) - V_t,\quad A_t = \delta_t + \gamma\lambda(1-d_t)A_{t+1},\quad R_t = A_t + V_t$$"),
"whiten": ("Why whiten advantages, and over what?",
  "PPO rescales the batch's advantages to mean 0 and standard deviation 1, so the step size does not depend on the reward scale. The statistics come from the real tokens of the whole batch only.",
  r"$$\hat x = \frac{x - \mu}{\sqrt{\sigma^2 + 10^{-8}}},\qquad \mu, \sigma^2 \text{ over } \{x_{it} : m_{it} = 1\},\ \sigma^2 \text{ unbiased}$$"),
"clipped_policy_loss": ("Implement the core of PPO's policy loss under time pressure.",
  "The importance ratio re-weights samples from the old policy; clipping it removes the incentive to move the ratio outside [1 - eps_low, 1 + eps_high], and the min keeps the pessimistic bound. The old policy's log-probs are data: no gradient flows into them.",
  r"$$\ell_t = -\min\big(r_t A_t,\ \operatorname{clip}(r_t, 1-\varepsilon_{low}, 1+\varepsilon_{high}) A_t\big),\quad r_t = e^{\log\pi_\theta(a_t) - \log\pi_{old}(a_t)}$$"),
"kl_estimators": ("What are k1, k2 and k3, and which one does GRPO use?",
  "The KL to the reference is estimated per sampled token from two log-probabilities. k1 is unbiased but can be negative; k3 is unbiased and never negative, which is why GRPO adds beta times k3 to its loss.",
  r"$$x = \log\pi_{ref}(a) - \log\pi(a):\qquad k_1 = -x,\quad k_2 = \tfrac{1}{2}x^2,\quad k_3 = e^{x} - x - 1$$"),
"gspo_ratio": ("How does GSPO's importance ratio differ from GRPO's?",
  "GSPO uses one ratio per answer: the geometric mean of its token ratios, so that long and short answers live on the same scale and a whole answer is clipped or not.",
  r"$$s_i = \exp\Big(\frac{1}{|y_i|}\sum_t \log\frac{\pi_\theta(y_{it})}{\pi_{old}(y_{it})}\Big)$$"),
"aggregate": ("What do the loss_type options of TRL's GRPOTrainer change?",
  "Only how per-token losses are averaged, which sets each token's weight: per sequence first (grpo), over all tokens (bnpo/dapo), or by a constant (dr_grpo).",
  r"$$\text{grpo: } \tfrac{1}{B}\sum_i \tfrac{1}{|o_i|}\sum_t \ell_{it}\qquad \text{bnpo: } \tfrac{\sum \ell}{\sum m}\qquad \text{dr\_grpo: } \tfrac{\sum \ell}{B\,L_{max}}$$"),
"clipped_value_loss": ("Why does PPO clip its value loss, and how?",
  "The critic's prediction may not move more than c from the value the rollout saw without paying for it; like the policy loss it takes the pessimistic (larger) error.",
  r"$$L_V = \tfrac12\,\operatorname{mean}\big(\max((V - R)^2,\ (\operatorname{clip}(V, V_{old}-c, V_{old}+c) - R)^2)\big)$$"),
"filter_logits": ("Implement temperature, top-k and top-p as generate() does.",
  "Temperature rescales the logits; top-k keeps the k best scores; top-p keeps the smallest set of most likely tokens whose mass reaches p, including the token that crosses p.",
  r"$$p = \operatorname{softmax}(z/T);\quad \text{top-}p \text{ keeps the smallest } S \text{ with } \textstyle\sum_{i\in S} p_i \ge p$$"),
"repetition_penalty": ("How does the repetition penalty treat a negative logit?",
  "A seen token should become less likely whatever the sign of its logit, so positive logits are divided and negative ones multiplied by the penalty.",
  r"$$z_v \leftarrow \begin{cases} z_v/\theta & z_v > 0\\ z_v\,\theta & z_v \le 0\end{cases}\quad \text{for each } v \text{ in the context}$$"),
"rope_half_split": ("Write RoPE the way Hugging Face does.",
  "Each pair of dimensions is rotated by an angle proportional to the position; HF pairs dimension i with i + d/2 and writes the rotation with rotate_half.",
  r"$$\theta_i = b^{-2i/d},\quad x' = x\odot\cos(m\theta) + \operatorname{rotate\_half}(x)\odot\sin(m\theta)$$"),
"rope_complex": ("Write RoPE the way Meta's llama does.",
  "The same rotation written with complex numbers: adjacent dimensions (2i, 2i+1) form one complex number, multiplied by a unit complex number of angle m theta_i.",
  r"$$z_i = x_{2i} + \mathrm{i}\,x_{2i+1},\qquad z_i' = z_i\, e^{\mathrm{i} m \theta_i}$$"),
"attention_decode_step": ("What happens in one decode step with a KV cache?",
  "The new token's key and value are appended to the cache, and its single query attends to every cached position; with grouped-query attention several query heads share one kv head.",
  r"$$o = \operatorname{softmax}\big(q K'^\top/\sqrt d\big) V',\quad K' = [K_{cache}; k_{new}],\ V' = [V_{cache}; v_{new}]$$"),
"attention_backward": ("Derive the gradient of softmax attention by hand.",
  "Back-propagate through O = PV, then through the row-wise softmax, whose Jacobian is diag(p) - p p^T, then through S = QK^T / sqrt(d).",
  r"$$dV = P^\top dO,\quad dP = dO\,V^\top,\quad dS = P\odot(dP - \operatorname{rowsum}(dP\odot P)),\quad dQ = dS\,K/\sqrt d,\quad dK = dS^\top Q/\sqrt d$$"),
"isqrt_binary_search": ("Integer square root by binary search, without overflow.",
  "Search for the largest x with x*x <= n. In a 32-bit language both lo + hi and mid * mid overflow, so write the midpoint as lo + (hi - lo) // 2 and compare mid <= n // mid.",
  r"$$\lfloor\sqrt n\rfloor = \max\{x \ge 0 : x^2 \le n\}$$"),
"isqrt_newton": ("Integer square root by Newton's method.",
  "Newton's iteration on x^2 - n, in integers, decreases from x_0 = n until it stops decreasing; that is the answer. Each step is the midpoint of x and n // x, which can be written without overflow too.",
  r"$$x_{k+1} = \Big\lfloor \frac{x_k + \lfloor n / x_k\rfloor}{2} \Big\rfloor$$"),
"cohen_kappa": ("How do you measure whether two annotators agree beyond chance?",
  "Observed agreement overstates agreement when labels are skewed; kappa subtracts the agreement two independent annotators with the same label frequencies would reach.",
  r"$$\kappa = \frac{p_o - p_e}{1 - p_e},\qquad p_e = \sum_k p_A(k)\,p_B(k)$$"),
"bradley_terry_loss": ("Write the reward model's loss.",
  "Bradley-Terry models the probability that the chosen answer beats the rejected one as a sigmoid of their reward difference; the loss is its negative log, with an optional margin.",
  r"$$\mathcal L = -\log\sigma(r_w - r_l - m)$$"),
"dpo_loss": ("Write the DPO loss.",
  "DPO trains the policy directly on preference pairs: the implicit reward is beta times the log-ratio to the reference, and the loss is Bradley-Terry on those implicit rewards (label smoothing mixes in the flipped label).",
  r"$$h = (\log\pi(y_w) - \log\pi_{ref}(y_w)) - (\log\pi(y_l) - \log\pi_{ref}(y_l)),\quad \mathcal L = -(1-\epsilon)\log\sigma(\beta h) - \epsilon\log\sigma(-\beta h)$$"),
}

INTERVIEW = {
"group_advantages": "GRPO replaces the critic by the group: each answer's advantage is its reward minus the group mean, divided by the group's sample std plus 1e-4 (TRL). A group whose rewards are all equal gives zero advantage and no gradient.",
"gae": "GAE sums TD errors discounted by gamma*lambda, computed backwards from the last real token, where the value of the next state is 0. The value target is A_t + V_t; the snippet that adds values[:-1] inside the loop is wrong.",
"clipped_policy_loss": "The loss is -min(rA, clip(r)A): the min makes the objective a pessimistic bound, so moving the ratio beyond the clip never helps. pi_old is detached; on-policy the ratio is exactly 1 and PPO reduces to REINFORCE with the clip inactive.",
"filter_logits": "Order is temperature, top-k, top-p. Top-p keeps the token that crosses the threshold, so the kept mass is at least p; HF implements it by removing tokens whose ascending cumulative mass is <= 1 - p.",
"attention_backward": "dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d). FlashAttention computes the rowsum as rowsum(dO * O), which needs no P.",
}


def exercise_cells(name):
    e = exercises.get(name)
    question, idea, formula = TEXT[name]
    hints = "\n".join(f"<details><summary>Hint {i}</summary>\n\n{h}\n\n</details>" for i, h in enumerate(e.hints, 1))
    md = (f"### {e.title} ({e.difficulty}, about {e.minutes} min)\n\n**Question.** {question}\n\n{idea}\n\n{formula}\n\n"
          f"Source: {e.source}.\n\n{hints}\n\nStuck for good? `print(exercises.solution(\"{name}\"))` shows the reference solution.")
    blank = new_code_cell(f"# YOUR CODE: fill in the body.\n{e.signature}\n    raise NotImplementedError(\"write {name}\")",
                          metadata={"exercise": name, "tags": ["exercise-blank"]})
    check = new_code_cell(f"exercises.check(\"{name}\", {name})", metadata={"tags": ["exercise-check"]})
    cells = [new_markdown_cell(md), blank, check]
    if name in INTERVIEW:
        cells.append(new_markdown_cell(f"> **What to say in an interview.** {INTERVIEW[name]}"))
    return cells


def training_cells(name, algo, intro):
    return [
        new_markdown_cell(intro),
        new_code_cell(f"runs = training.compare_with_reference(\"{name}\", {name}, TRAINING)\n"
                      f"print(runs.groupby(\"run\")[[\"reward_mean\", \"eval_accuracy\"]].last().round(3))\n"
                      f"training.plot_comparison(runs, algo=\"{algo}\")"),
    ]


HOW = ("## How the exercises work\n\nEach exercise has a cell marked `# YOUR CODE`: replace the body (keep the name and "
       "the arguments) and run the check cell below it. The checker runs published test vectors and seeded random "
       "cases against the reference solution. When your function disagrees, it runs a catalogue of known wrong versions "
       "on the same inputs and names the mistake whose outputs match yours (`Likely mistake [name]`), or shows the first "
       "case that differs. Hints open on click; `exercises.solution(name)` prints the reference, which is the package's "
       "own function wherever the package has one.")


def rl_notebook():
    names = ["group_advantages", "gae", "whiten", "clipped_policy_loss", "kl_estimators", "gspo_ratio", "aggregate",
             "clipped_value_loss"]
    cells = [new_markdown_cell(
        "# Exercises 1: advantages and losses of PPO, GRPO and GSPO\n\n"
        "**What you will learn**: to write, from a blank cell, the eight pieces of RL fine-tuning that interviews ask for "
        "(group advantages, GAE, whitening, the clipped surrogate, KL estimators, GSPO's ratio, the loss aggregations, "
        "the clipped value loss), and to watch your own advantages drive GRPO and your own GAE drive PPO on the "
        "lab's tiny Llama.\n\n"
        "**Prerequisites**: notebooks 05 (policy gradients), 06 (PPO), 07 (GRPO) and 08 (GSPO).\n\n"
        "**Run time**: each check takes about a second. The two training comparisons (30 steps each for your run and "
        "the reference run) dominate: the whole notebook took 1218 s in full mode on a 2-core CPU shared with other "
        "jobs (so expect less on an idle laptop), and 57 s with `RLHF_LAB_FAST=1` (one step per run). No GPU needed.\n\n"
        "This notebook is committed without outputs: it is a worksheet."),
        new_code_cell("import torch\n\nfrom rlhf_lab import exercises\nfrom rlhf_lab.exercises import training\n"
                      "from rlhf_lab.teach.notebook import FAST, setup\n\nsetup(seed=0)\n"
                      "exercises.list_exercises(topic=None).query(\"topic in ('advantages', 'losses')\")"),
        new_markdown_cell(HOW),
        new_markdown_cell("## Advantages")]
    cells += exercise_cells("group_advantages")
    cells += [new_markdown_cell("## Your code trains the model\n\nThe settings of both runs below: the shipped "
                                "checkpoint after SFT on reversed addition, the same seed, the same prompts."),
              new_code_cell("TRAINING = dict(steps=1 if FAST else 30, prompts_per_step=2 if FAST else 16,\n"
                            "                num_generations=4 if FAST else 8, eval_every=1 if FAST else 10,\n"
                            "                eval_examples=8 if FAST else 100)")]
    cells += training_cells("group_advantages", "grpo",
                            "Your `group_advantages` now replaces GRPO's (through `GRPO.outcome_advantages`; nothing is "
                            "patched). Solid line: your run; dashed: the package's. With a correct function the two "
                            "lines are the same line. A catalogued mistake changes the curve, or stops the run.")
    for name in names[1:]:
        cells += exercise_cells(name)
        if name == "whiten":
            cells += training_cells("gae", "ppo", "### Your GAE drives PPO\n\nYour `gae` replaces PPO's (through "
                                    "`PPO.estimate_advantages`), beside the package's run.")
    cells.append(new_markdown_cell("## Next\n\nExercises 2 (sampling, attention, coding questions, preferences) ends "
                                   "with a timed interview round."))
    return cells


def mechanisms_notebook():
    sections = [("Sampling", ["filter_logits", "repetition_penalty"]),
                ("Attention", ["rope_half_split", "rope_complex", "attention_decode_step", "attention_backward"]),
                ("Coding warm-up (interview Q12)", ["isqrt_binary_search", "isqrt_newton"]),
                ("Human feedback", [n for n in ("cohen_kappa", "bradley_terry_loss", "dpo_loss") if n in exercises.EXERCISES])]
    cells = [new_markdown_cell(
        "# Exercises 2: sampling, attention, coding questions and preferences, then a timed round\n\n"
        "**What you will learn**: to write generate()'s sampling filters and the repetition penalty, RoPE in both "
        "layouts, one KV-cache decode step and the attention backward pass by hand, integer square root two ways "
        "without overflow, and the agreement and preference losses of RLHF; then to do a few of them against the clock.\n\n"
        "**Prerequisites**: notebooks 01 (sampling), 02 (RoPE) and 03 (KV cache); notebook 10 for the preference "
        "exercises.\n\n"
        "**Run time**: no training: the whole notebook ran in 15 s on a 2-core CPU shared with other jobs (there "
        "is no FAST switch: nothing to shrink). No GPU needed.\n\n"
        "This notebook is committed without outputs: it is a worksheet."),
        new_code_cell("import torch\n\nfrom rlhf_lab import exercises\nfrom rlhf_lab.teach.notebook import setup\n\nsetup(seed=0)\n"
                      "exercises.list_exercises().query(\"topic not in ('advantages', 'losses')\")"),
        new_markdown_cell(HOW)]
    for title, names in sections:
        cells.append(new_markdown_cell(f"## {title}"))
        for name in names:
            cells += exercise_cells(name)
    cells += [
        new_markdown_cell("## A timed interview round\n\nThe next cell draws three exercises of this notebook, shows "
                          "their signatures and starts a countdown (a live bar in Jupyter, a line of text elsewhere). "
                          "Write the functions in the empty cell after it, under the names given, then run "
                          "`round_.finish(globals())`: it stops the clock and prints each checker's verdict and the "
                          "time you took. Functions you already wrote above count, so restart the kernel first for an "
                          "honest round."),
        new_code_cell("round_ = exercises.interview_round(k=3, topics=(\"sampling\", \"attention\", \"coding\", \"preferences\"))"),
        new_code_cell("# YOUR CODE for the round goes here (one function per task, named as shown above).",
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
