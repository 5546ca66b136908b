"""RL exercises: advantages, GAE, whitening, the clipped surrogate, KL estimators, GSPO's ratio,
loss aggregation and the clipped value loss.

The reference of each is the package's own function (rlhf_lab.rl.advantages / losses / kl); only
two thin compositions of package functions are defined here (the clipped policy loss and the three
KL estimators returned together), because the exercise asks for them as one function.

The wrong variants of group_advantages and clipped_policy_loss are built from one function with a
switch per mistake, so that any two mistakes can also be made together (the checker names both).
"""

from __future__ import annotations

import torch

from ..rl.advantages import gae, group_advantages, whiten
from ..rl.kl import kl_k1, kl_k2, kl_k3
from ..rl.losses import aggregate, clipped_surrogate, clipped_value_loss, gspo_ratio, token_log_ratio
from .core import Case, Exercise, Mistake, spec_cases

# ----------------------------------------------------------------------------------------------
# helpers for cases


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _right_padded_mask(lengths: list[int], seq_len: int) -> torch.Tensor:
    """(batch, seq) float mask with `lengths[i]` ones at the start of row i."""
    return (torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]).float()


def _with_grad(observe_keys: tuple[str, ...]):
    """An observation for losses: the value and the gradient it sends to each input in
    `observe_keys` (a ratio not detached from pi_old has the right value and the wrong gradient).
    An input that gets no gradient counts as a zero gradient. A result that is not a tensor is
    observed as it is (the checker then says what type was expected)."""

    def observe(function, kwargs):
        for key in observe_keys:
            kwargs[key].requires_grad_(True)
        result = function(**kwargs)
        loss = result[0] if isinstance(result, tuple) else result
        if not isinstance(loss, torch.Tensor):
            return {"output": loss}
        observation = {"output": loss.detach().clone()}
        inputs = [kwargs[k] for k in observe_keys]
        grads = (torch.autograd.grad(loss.sum(), inputs, allow_unused=True) if loss.requires_grad
                 else [None] * len(inputs))
        seen = {}
        for key, tensor, grad in zip(observe_keys, inputs, grads):
            if id(tensor) in seen:  # the same tensor passed twice (old_logprobs = logprobs): one gradient
                grad = seen[id(tensor)]
            seen[id(tensor)] = grad
            observation[f"grad_{key}"] = torch.zeros_like(tensor) if grad is None else grad.detach().clone()
        return observation

    return observe


def _compatible(flags: frozenset, exclusive: tuple[frozenset, ...]) -> bool:
    """False when `flags` holds two switches of one exclusive group (two answers to one question)."""
    return all(len(flags & group) <= 1 for group in exclusive)


# ----------------------------------------------------------------------------------------------
# group-relative advantages (GRPO)

# epsilons learners put under the square root (LayerNorm's 1e-5, numpy habits 1e-8 ...)
EPS_UNDER_ROOT = (1e-8, 1e-4, 1e-5, 1e-6)
GROUP_EXCLUSIVE = (  # pairs of switches that answer the same question (so cannot both be made)
    frozenset({"batch_normalisation", "strided_groups"}),
    frozenset({"batch_normalisation", "batch_std"}),
    frozenset({"missing_epsilon", "eps_inside_sqrt"}),
    *(frozenset({"no_std_division", other})
      for other in ("population_std", "batch_std", "missing_epsilon", "eps_inside_sqrt")),
)


def _group_variant(flags: frozenset, eps_under_root: float = EPS_UNDER_ROOT[0]):
    """GRPO's advantage with the mistakes named in `flags` made (any compatible set)."""

    def variant(rewards, num_generations):
        rewards = rewards.float()
        if "batch_normalisation" in flags:
            grouped = rewards.view(1, -1)  # one "group": the whole batch
        elif "strided_groups" in flags:
            grouped = rewards.view(num_generations, -1).T  # assumes prompt-major interleaving
        else:
            grouped = rewards.view(-1, num_generations)
        centred = grouped - grouped.mean(1, keepdim=True)
        if "no_std_division" in flags:
            advantages = centred
        else:
            spread_of = rewards.view(1, -1) if "batch_std" in flags else grouped
            variance = spread_of.var(1, unbiased="population_std" not in flags, keepdim=True)
            if "eps_inside_sqrt" in flags:
                scale = torch.sqrt(variance + eps_under_root)
            elif "missing_epsilon" in flags:
                scale = variance.sqrt()
            else:
                scale = variance.sqrt() + 1e-4
            advantages = centred / scale
        if "strided_groups" in flags:
            advantages = advantages.T
        return advantages.reshape(-1)

    return variant


def _group_forms(flags: frozenset) -> tuple:
    if not _compatible(flags, GROUP_EXCLUSIVE):
        return ()
    if "eps_inside_sqrt" in flags:
        return tuple(_group_variant(flags, eps) for eps in EPS_UNDER_ROOT)
    return (_group_variant(flags),)


def group_advantages_cases(seed: int) -> list[Case]:
    cases = spec_cases([
        ("known value: [1,0,0,0]", {"rewards": torch.tensor([1.0, 0, 0, 0]), "num_generations": 4},
         [1.4997, -0.4999, -0.4999, -0.4999], "已知值：[1,0,0,0]"),
        ("known value: [0,1]", {"rewards": torch.tensor([0.0, 1.0]), "num_generations": 2}, [-0.7070, 0.7070],
         "已知值：[0,1]"),
    ])
    cases += [
        Case("two groups, different spreads", {"rewards": torch.tensor([1.0, 0, 0, 0, 4, 0, 2, 2]),
                                                "num_generations": 4}, name_zh="两组，组内离散程度不同"),
        Case("an all-equal group", {"rewards": torch.tensor([1.0, 1, 1, 1, 0, 1, 0, 1]),
                                     "num_generations": 4}, name_zh="有一组奖励全部相同"),
        Case("a tiny spread (eps matters)", {"rewards": torch.tensor([0.0, 0, 0, 1e-3]),
                                              "num_generations": 4}, name_zh="组内差异极小（eps 起作用）"),
    ]
    g = _generator(seed)
    for i in range(6):
        G = int(torch.randint(2, 9, (1,), generator=g))
        prompts = int(torch.randint(2, 5, (1,), generator=g))
        # {0, 0.5, 1}: like task rewards
        rewards = torch.randint(0, 3, (prompts * G,), generator=g).float() / 2
        if i % 2:
            rewards = torch.randn(prompts * G, generator=g) * 3 + 1
        cases.append(Case(f"random {i}: {prompts} prompts x G={G}",
                          {"rewards": rewards, "num_generations": G},
                          name_zh=f"随机用例 {i}：{prompts} 个提示词 × G={G}"))
    return cases


def _group(name: str, message: str, zh: str) -> Mistake:
    forms = _group_forms(frozenset({name}))
    return Mistake(name, message, forms[0], zh=zh, forms=forms[1:])


GROUP_MISTAKES = (
    _group("population_std", "std divides by G (population std, torch.std(unbiased=False) / numpy's "
           "default); TRL and this lab use the sample std (G - 1), torch's default.",
           "标准差除以了 G（总体标准差，即 `torch.std(unbiased=False)`，也是 numpy 的默认写法）；TRL "
           "和本项目用的是样本标准差（除以 G − 1），也就是 torch 的默认值。"),
    _group("batch_normalisation", "mean and std over the whole batch mix different prompts: the baseline "
           "must be each prompt's own group (view(-1, G), then statistics along dim 1).",
           "在整个批次上求均值和标准差，把不同提示词的回答混在了一起：基线必须是每个提示词自己的那一组"
           "（先 `view(-1, G)`，再沿第 1 维求统计量）。"),
    _group("batch_std", "the std over the whole batch is TRL's scale_rewards='batch'; GRPO divides by the "
           "std of each group.",
           "用整个批次的标准差做分母，是 TRL 里 `scale_rewards='batch'` 的做法；GRPO "
           "除以的是每组的组内标准差。"),
    _group("missing_epsilon", "no epsilon: a group whose rewards are all equal gives 0/0 = nan. "
           "Divide by (std + 1e-4) as TRL does.",
           "分母没有加 eps：一组奖励完全相同时会得到 0/0 = nan。按 TRL 的写法除以 (std + 1e-4)。"),
    _group("no_std_division", "r - mean without dividing by the std is Dr. GRPO's advantage; GRPO also "
           "divides by (std + eps).",
           "只做了 r − mean 而没有除以标准差，这是 Dr. GRPO 的优势函数；GRPO 还要除以 (std + eps)。"),
    _group("strided_groups", "completions of one prompt are CONTIGUOUS rows (view(-1, G)), not every "
           "num_prompts-th row (view(G, -1)).",
           "同一个提示词的 G 个回答在批次里是连续排列的（`view(-1, G)`），不是每隔 num_prompts 行取一个"
           "（`view(G, -1)`）。"),
    _group("eps_inside_sqrt", "the epsilon went under the square root, sqrt(var + eps) (the LayerNorm "
           "habit); GRPO adds it to the std: (r - mean) / (std + 1e-4). The two differ most where a group's "
           "rewards barely differ.",
           "eps 放进了根号里，写成了 sqrt(var + eps)（LayerNorm 的习惯写法）；GRPO 是把它加在标准差上："
           "(r − mean) / (std + 1e-4)。组内奖励相差很小时，两者差别最大。"),
)


# ----------------------------------------------------------------------------------------------
# GAE


def _gae_vector_snippet(rewards, values, mask, gamma, lam):
    """The snippet from interview notes: `returns.insert(0, gae + values[:-1])`, a whole vector."""
    rewards, values, mask = rewards.float(), values.float(), mask.float()
    batch, seq_len = rewards.shape
    advantage = torch.zeros(batch)
    advantages, returns = [], []
    for t in reversed(range(seq_len)):
        next_value = values[:, t + 1] * mask[:, t + 1] if t + 1 < seq_len else torch.zeros(batch)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        not_done = mask[:, t + 1] if t + 1 < seq_len else 0
        advantage = (delta + gamma * lam * advantage * not_done) * mask[:, t]
        advantages.insert(0, advantage)
        returns.insert(0, advantage[:, None] + values[:, :-1])  # wrong: values[:, t]
    return torch.stack(advantages, 1), torch.stack(returns, 1)


def _returns_are_vectors(got: dict, expected: dict, case: Case) -> bool:
    """The snippet's mark: each token's return is a whole vector of values (values[:-1] or values), so
    the returns have one more axis than (batch, seq) - however the rest was batched."""
    returns, wanted = got["output"][1], expected["output"][1]
    if isinstance(returns, (list, tuple)):
        returns = torch.stack([torch.as_tensor(r) for r in returns], 1)
    seq_len = wanted.shape[-1]
    return (returns.dim() == wanted.dim() + 1 and tuple(returns.shape[:2]) == tuple(wanted.shape)
            and returns.shape[-1] in (seq_len - 1, seq_len))


def _gae_mask_ignored(rewards, values, mask, gamma, lam):
    """The textbook recursion over the whole padded row: V after the last column is 0, nothing masked."""
    rewards, values = rewards.float(), values.float()
    batch, seq_len = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_advantage, next_value = torch.zeros(batch), torch.zeros(batch)
    for t in reversed(range(seq_len)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    return advantages, advantages + values


def _gae_missing_lambda(rewards, values, mask, gamma, lam):
    return gae(rewards, values, mask, gamma, 1.0)


def _gae_bootstrap_into_padding(rewards, values, mask, gamma, lam):
    rewards, values, mask = rewards.float(), values.float(), mask.float()
    batch, seq_len = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_advantage, next_value = torch.zeros(batch), torch.zeros(batch)
    for t in reversed(range(seq_len)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # V_{t+1} even after the last real token
        next_advantage = (delta + gamma * lam * next_advantage) * mask[:, t]
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    return advantages, (advantages + values) * mask


def _gae_returns_to_go(rewards, values, mask, gamma, lam):
    advantages, _ = gae(rewards, values, mask, gamma, lam)
    returns = torch.zeros_like(advantages)
    running = torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        running = (rewards[:, t].float() + gamma * running) * mask[:, t]
        returns[:, t] = running
    return advantages, returns


def _gae_forward_order(rewards, values, mask, gamma, lam):
    rewards, values, mask = rewards.float(), values.float(), mask.float()
    batch, seq_len = rewards.shape
    advantages = torch.zeros_like(rewards)
    previous = torch.zeros(batch)
    for t in range(seq_len):  # wrong direction: A_t must use A_{t+1}, so the loop runs backwards
        next_value = values[:, t + 1] * mask[:, t + 1] if t + 1 < seq_len else torch.zeros(batch)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        previous = (delta + gamma * lam * previous) * mask[:, t]
        advantages[:, t] = previous
    return advantages, (advantages + values) * mask


def gae_cases(seed: int) -> list[Case]:
    ones = torch.ones(1, 3)
    spec = [
        (
            "known value: lambda 0.95",
            {
                "rewards": torch.tensor([[0.0, 0, 1]]),
                "values": torch.full((1, 3), 0.5),
                "mask": ones,
                "gamma": 1.0,
                "lam": 0.95,
            },
            ([[0.45125, 0.475, 0.5]], [[0.95125, 0.975, 1.0]]),
            "已知值：λ = 0.95",
        ),
        (
            "known value: lambda 1",
            {
                "rewards": torch.tensor([[0.0, 0, 1]]),
                "values": torch.full((1, 3), 0.5),
                "mask": ones,
                "gamma": 1.0,
                "lam": 1.0,
            },
            ([[0.5, 0.5, 0.5]], [[1.0, 1.0, 1.0]]),
            "已知值：λ = 1",
        ),
    ]
    cases = spec_cases(spec)
    g = _generator(seed)
    for i, (lengths, gamma, lam) in enumerate([([5, 3, 1], 1.0, 0.95), ([4, 4, 2, 6], 0.9, 0.8),
                                               ([6, 2, 5], 0.99, 0.95), ([3, 1, 2], 1.0, 0.5)]):
        seq_len = max(lengths) + 1  # at least one padded position in every row
        mask = _right_padded_mask(lengths, seq_len)
        rewards = torch.randn(len(lengths), seq_len, generator=g) * 0.1 * mask  # per-token KL penalties
        last = torch.tensor(lengths) - 1
        rewards[torch.arange(len(lengths)), last] += torch.rand(len(lengths), generator=g)
        values = torch.randn(len(lengths), seq_len, generator=g)  # the critic also speaks on padding
        cases.append(Case(f"random {i}: lengths {lengths}, gamma {gamma}, lam {lam}",
                          {"rewards": rewards, "values": values, "mask": mask, "gamma": gamma, "lam": lam},
                          name_zh=f"随机用例 {i}：长度 {lengths}，γ = {gamma}，λ = {lam}"))
    return cases


GAE_MISTAKES = (
    Mistake("values_vector_snippet", "the interview-notes snippet adds the whole vector values[:-1] inside "
            "the loop (`gae + values[:-1]`), so each return is a vector; the return of token t is "
            "A_t + V_t (`gae + values[t]`).", _gae_vector_snippet,
            zh="面经里流传的那段代码在循环里加的是整个向量 `values[:-1]`（`gae + values[:-1]`），"
               "于是每个回报都成了"
               "一个向量；第 t 个 token 的回报应当是 A_t + V_t（`gae + values[t]`）。",
            recognise=_returns_are_vectors, component=1,
            error_line=r"values\s*\[\s*(:\s*,\s*)?:\s*-\s*1\s*\]"),
    Mistake("missing_lambda", "A_t = delta_t + gamma * lam * A_{t+1}: the recursion lost its lam "
            "(that is lam = 1, Monte Carlo returns).", _gae_missing_lambda,
            zh="A_t = δ_t + γ·λ·A_{t+1}：递推式里漏掉了 λ（相当于 λ = 1，即蒙特卡洛回报）。"),
    Mistake("bootstrap_into_padding", "after the last real token the episode is over: V_{t+1} and A_{t+1} "
            "must be 0 there (not_done_t = mask_{t+1}), not the critic's value at a padded position.",
            _gae_bootstrap_into_padding,
            zh="最后一个真实 token 之后回合已经结束：那里的 V_{t+1} 和 A_{t+1} 必须取 0（`not_done_t = "
               "mask_{t+1}`），"
               "不能用价值模型在填充位置上的输出。"),
    Mistake("returns_to_go", "the value target is R_t = A_t + V_t (the lambda-return), not the discounted "
            "sum of rewards.", _gae_returns_to_go,
            zh="价值函数的学习目标是 R_t = A_t + V_t（λ-回报），不是奖励的折扣累加和。"),
    Mistake("forward_order", "A_t depends on A_{t+1}: loop over t backwards (reversed(range(T))).",
            _gae_forward_order, zh="A_t 依赖 A_{t+1}：时间步要倒序遍历（`reversed(range(T))`）。"),
    Mistake("mask_ignored", "the mask is not used: the recursion runs on through the padded positions "
            "(bootstrapping the critic's values there) and they come out non-zero. The episode ends at the "
            "last real token (not_done_t = mask_{t+1}); padded positions get A = R = 0.", _gae_mask_ignored,
            zh="完全没有用到掩码：递推一路穿过填充位置（用上了价值模型在那里的输出），填充位置的结果也不为 "
               "0。"
               "回合在最后一个真实 token 处结束（`not_done_t = mask_{t+1}`），填充位置的 A 和 R 都应为 0。"),
)


# ----------------------------------------------------------------------------------------------
# whitening


def _whiten_population(values, mask):
    return whiten(values, mask, unbiased=False)


def _whiten_with_padding(values, mask):
    values = values.float()
    whitened = (values - values.mean()) * torch.rsqrt(values.var() + 1e-8)
    return whitened * mask


def _whiten_per_row(values, mask):
    rows = []
    for row, row_mask in zip(values.float(), mask):
        real = row[row_mask.bool()]
        # a one-token row has no unbiased variance: nan, as torch.var gives (without its warning)
        variance = real.var() if real.numel() > 1 else torch.tensor(float("nan"))
        rows.append((row - real.mean()) * torch.rsqrt(variance + 1e-8) * row_mask)
    return torch.stack(rows)


def _whiten_padding_kept(values, mask):
    values = values.float()
    real = values[mask.bool()]
    return (values - real.mean()) * torch.rsqrt(real.var() + 1e-8)


def _whiten_missing_eps(values, mask):
    values = values.float()
    real = values[mask.bool()]
    return ((values - real.mean()) / real.std()) * mask


def whiten_cases(seed: int) -> list[Case]:
    g = _generator(seed)
    cases = []
    for i, lengths in enumerate([[5, 3, 1], [4, 4, 2, 6], [2, 7], [3, 3, 3]]):
        seq_len = max(lengths) + 1
        mask = _right_padded_mask(lengths, seq_len)
        values = torch.randn(len(lengths), seq_len, generator=g) * 2 + 0.5 * (i - 1)
        cases.append(Case(f"random {i}: lengths {lengths}", {"values": values, "mask": mask},
                          name_zh=f"随机用例 {i}：长度 {lengths}"))
    mask = _right_padded_mask([3, 2], 4)
    values = torch.tensor([[0.5, 0.5, 0.5, 9.0], [0.5, 0.5, -3.0, 1.0]])
    cases.append(Case("constant real values (std 0)", {"values": values, "mask": mask},
                      name_zh="真实位置上的值全部相同（标准差为 0）"))
    return cases


WHITEN_MISTAKES = (
    Mistake("population_variance", "variance divided by n: TRL's masked_whiten uses the unbiased variance "
            "(n - 1), so the whitened values have torch.std() == 1.", _whiten_population,
            zh="方差除以了 n：TRL 的 `masked_whiten` 用的是无偏方差（除以 n − 1），这样白化后的 "
               "`torch.std()` 恰好为 1。"),
    Mistake("stats_include_padding", "mean and variance must be over the REAL tokens only (mask == 1); "
            "padded positions are not data.", _whiten_with_padding,
            zh="均值和方差只能在真实 token（掩码为 1 的位置）上计算；填充位置不是数据。"),
    Mistake("per_row", "advantages are whitened over the whole batch (one mean, one std), not per "
            "sequence.", _whiten_per_row,
            zh="优势白化是在整个批次上做的（一个均值、一个标准差），不是每条序列各做一次。"),
    Mistake("padding_not_zeroed", "padded positions must come out as 0 (multiply by the mask, or "
            "torch.where).", _whiten_padding_kept,
            zh="填充位置的输出必须是 0（乘以掩码，或用 `torch.where`）。"),
    Mistake("missing_epsilon", "no epsilon: constant values give 0/0 = nan. Use (x - mean) / sqrt(var + "
                               "1e-8).",
            _whiten_missing_eps, zh="没有加 eps：数值全部相同时会得到 0/0 = nan。应写成 (x − mean) / "
                                    "sqrt(var + 1e-8)。"),
)


# ----------------------------------------------------------------------------------------------
# the clipped surrogate (PPO / GRPO / DAPO clip-higher)


def clipped_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """The package's pieces, composed as GRPO's loss does (policy_gradient.py): the token ratio from
    token_log_ratio (which detaches pi_old), clipped_surrogate, and the "grpo" aggregation."""
    ratio = torch.exp(token_log_ratio(logprobs, old_logprobs))  # r_t = pi / pi_old
    per_token_loss = clipped_surrogate(ratio, advantages, eps_low, eps_high)[0]  # -min(rA, clip(r)A)
    return aggregate(per_token_loss, mask, "grpo")  # token mean per sequence, then mean


POLICY_EXCLUSIVE = (
    frozenset({"clip_without_min", "max_instead_of_min"}),
    frozenset({"token_mean_over_batch", "padding_counted"}),
)


def _policy_variant(flags: frozenset):
    """The clipped policy loss with the mistakes named in `flags` made (any compatible set)."""

    def variant(logprobs, old_logprobs, advantages, mask, eps_low, eps_high):
        old = old_logprobs if "ratio_not_detached" in flags else old_logprobs.detach()
        log_ratio = logprobs - old
        ratio = log_ratio if "log_ratio_not_exponentiated" in flags else torch.exp(log_ratio)
        high = eps_low if "symmetric_clip" in flags else eps_high
        clipped = torch.clamp(ratio, 1 - eps_low, 1 + high)
        if "clip_without_min" in flags:
            per_token = -clipped * advantages
        elif "max_instead_of_min" in flags:
            per_token = -torch.max(ratio * advantages, clipped * advantages)
        else:
            per_token = -torch.min(ratio * advantages, clipped * advantages)
        if "token_mean_over_batch" in flags:
            return aggregate(per_token, mask, "bnpo")
        if "padding_counted" in flags:
            return per_token.mean()
        return aggregate(per_token, mask, "grpo")

    return variant


def _policy_forms(flags: frozenset) -> tuple:
    return (_policy_variant(flags),) if _compatible(flags, POLICY_EXCLUSIVE) else ()


def policy_loss_cases(seed: int) -> list[Case]:
    g = _generator(seed)
    cases = []
    for i, (lengths, eps_low, eps_high) in enumerate([([4, 2, 5], 0.2, 0.2), ([3, 5, 1, 4], 0.2, 0.28),
                                                      ([5, 5], 0.1, 0.3)]):
        seq_len = max(lengths) + 1
        mask = _right_padded_mask(lengths, seq_len)
        old = -torch.rand(len(lengths), seq_len, generator=g) * 3
        logprobs = old + torch.randn(len(lengths), seq_len, generator=g) * 0.4  # ratios 0.5-2: clips active
        advantages = torch.randn(len(lengths), 1, generator=g).expand(-1, seq_len).clone()
        cases.append(Case(f"off-policy {i}: eps {eps_low}/{eps_high}", {
            "logprobs": logprobs, "old_logprobs": old, "advantages": advantages, "mask": mask,
            "eps_low": eps_low, "eps_high": eps_high}, name_zh=f"异策略用例 {i}：eps {eps_low}/{eps_high}"))
    mask = _right_padded_mask([3, 1, 4], 5)
    logprobs = -torch.rand(3, 5, generator=g) * 2
    cases.append(Case("on-policy: old_logprobs IS logprobs (num_iterations = 1)", {
        "logprobs": logprobs, "old_logprobs": logprobs, "advantages": torch.randn(3, 5, generator=g),
        "mask": mask, "eps_low": 0.2, "eps_high": 0.2},
        name_zh="同策略：old_logprobs 就是 logprobs 本身（num_iterations = 1）"))
    return cases


def _policy(name: str, message: str, zh: str) -> Mistake:
    return Mistake(name, message, _policy_forms(frozenset({name}))[0], zh=zh)


POLICY_MISTAKES = (
    _policy("clip_without_min", "-clip(r, 1-eps, 1+eps) * A alone lets the ratio escape where the clip "
            "should not help it; the surrogate is -min(r * A, clip(r) * A).",
            "只写 `−clip(r, 1−ε, 1+ε)·A` 不够：比率一旦越出区间，就没有梯度把它拉回来（例如 A < 0 而 r > 1 "
            "+ ε 时）；"
            "替代目标应为 `−min(r·A, clip(r)·A)`，取悲观的那一项。"),
    _policy("ratio_not_detached", "pi_old is data: exp(logprobs - old_logprobs.detach()). Without the "
            "detach, old_logprobs = logprobs gives ratio 1 with ZERO gradient (and off-policy, gradient "
            "flows into pi_old).",
            "旧策略 π_old 是数据，要截断它的梯度：`exp(logprobs - old_logprobs.detach())`。不截断的话，"
            "同策略时"
            "（old_logprobs 就是 logprobs）比率恒为 1、梯度恰好为零；异策略时梯度还会流进 π_old。"),
    _policy("max_instead_of_min", "-max(r A, clip(r) A) is optimistic; PPO takes the pessimistic bound: "
            "-min(r A, clip(r) A).",
            "`−max(r·A, clip(r)·A)` 是乐观估计；PPO 取的是悲观下界：`−min(r·A, clip(r)·A)`。"),
    _policy("symmetric_clip", "the upper clip is 1 + eps_high (DAPO's clip-higher), not 1 + eps_low.",
            "裁剪上界是 1 + eps_high（DAPO 的非对称裁剪 `clip-higher`），不是 1 + eps_low。"),
    _policy("log_ratio_not_exponentiated", "the ratio is exp(log pi - log pi_old), not the log-ratio "
            "itself.", "重要性采样比率是 exp(log π − log π_old)，不是对数比率本身。"),
    _policy("token_mean_over_batch", "that is the 'bnpo' aggregation (every token of the batch weighs the "
            "same); GRPO averages tokens within each sequence first, then sequences.",
            "这是 'bnpo' 的聚合方式（整个批次里每个 token 权重相同）；GRPO 先在每条序列内对 token 求平均，"
            "再对序列求平均。"),
    _policy("padding_counted", "the mean runs over padded positions too; average over real tokens "
            "(mask) only.", "求平均时把填充位置也算了进去；只能对真实 token（掩码为 1 的位置）求平均。"),
)


# ----------------------------------------------------------------------------------------------
# KL estimators


def kl_estimators(logprobs: torch.Tensor, ref_logprobs: torch.Tensor):
    """(k1, k2, k3), each from the package's kl.py."""
    return kl_k1(logprobs, ref_logprobs), kl_k2(logprobs, ref_logprobs), kl_k3(logprobs, ref_logprobs)


def _kl_k3_reversed(logprobs, ref_logprobs):
    x = logprobs.float() - ref_logprobs.float()  # wrong direction: log(pi / pi_ref)
    return kl_k1(logprobs, ref_logprobs), kl_k2(logprobs, ref_logprobs), torch.exp(x) - x - 1


def _kl_k1_sign(logprobs, ref_logprobs):
    return kl_k1(ref_logprobs, logprobs), kl_k2(logprobs, ref_logprobs), kl_k3(logprobs, ref_logprobs)


def _kl_k2_no_half(logprobs, ref_logprobs):
    return kl_k1(logprobs, ref_logprobs), 2 * kl_k2(logprobs, ref_logprobs), kl_k3(logprobs, ref_logprobs)


def _kl_k3_without_minus_one(logprobs, ref_logprobs):
    x = ref_logprobs.float() - logprobs.float()
    return kl_k1(logprobs, ref_logprobs), kl_k2(logprobs, ref_logprobs), torch.exp(x) - x


def kl_cases(seed: int) -> list[Case]:
    cases = spec_cases([("known value: log pi -1, log pi_ref -1.5",
                         {"logprobs": torch.tensor([[-1.0]]), "ref_logprobs": torch.tensor([[-1.5]])},
                         ([[0.5]], [[0.125]], [[0.1065]]), "已知值：log π = −1，log π_ref = −1.5")])
    g = _generator(seed)
    for i in range(3):
        logprobs = -torch.rand(3, 6, generator=g) * 4
        cases.append(Case(f"random {i}", {"logprobs": logprobs,
                                          "ref_logprobs": logprobs + torch.randn(3, 6, generator=g) * 0.5},
                          name_zh=f"随机用例 {i}"))
    return cases


KL_MISTAKES = (
    Mistake("k3_wrong_direction", "k3 uses x = log pi_ref - log pi (ratio pi_ref / pi): e^x - x - 1. With "
            "x = log(pi / pi_ref) it estimates KL(pi_ref || pi) and is biased under samples from pi.",
            _kl_k3_reversed,
            zh="k3 里的 x = log π_ref − log π（比率是 π_ref / π）：e^x − x − 1。若取 x = log(π / π_ref)，"
               "估计的就成了 "
               "KL(π_ref ‖ π)，在从 π 采样的数据上是有偏的。"),
    Mistake("k1_sign", "k1 = log pi - log pi_ref (positive when the policy likes its sample more than the "
            "reference does).", _kl_k1_sign,
            zh="k1 = log π − log π_ref（策略比参考模型更偏爱这个采样结果时为正）。"),
    Mistake("k2_without_half", "k2 = (log pi - log pi_ref)^2 / 2: the half makes its gradient equal "
            "k1's in expectation.", _kl_k2_no_half,
            zh="k2 = (log π − log π_ref)² / 2：有了这个 1/2，它的梯度在期望上才与 k1 相同。"),
    Mistake("k3_without_minus_one", "k3 = e^x - x - 1; without the -1 it is not 0 when pi = pi_ref.",
            _kl_k3_without_minus_one, zh="k3 = e^x − x − 1；少了 −1，π = π_ref 时它就不为 0。"),
)


# ----------------------------------------------------------------------------------------------
# GSPO's sequence ratio


def _gspo_product(logprobs, old_logprobs, mask):
    log_s = ((logprobs - old_logprobs.detach()) * mask).sum(-1, keepdim=True)  # no 1/|y|
    return torch.exp(log_s).expand_as(logprobs)


def _gspo_mean_over_padding(logprobs, old_logprobs, mask):
    log_s = ((logprobs - old_logprobs.detach()) * mask).mean(-1, keepdim=True)  # / T, not / |y_i|
    return torch.exp(log_s).expand_as(logprobs)


def _gspo_arithmetic_mean(logprobs, old_logprobs, mask):
    ratio = torch.exp(logprobs - old_logprobs.detach()) * mask
    s = ratio.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)  # mean of ratios, not geometric mean
    return s.expand_as(logprobs)


def _gspo_not_detached(logprobs, old_logprobs, mask):
    log_s = ((logprobs - old_logprobs) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)
    return torch.exp(log_s).expand_as(logprobs)


def gspo_cases(seed: int) -> list[Case]:
    cases = spec_cases([("known value: token log-ratios [0.1, -0.2, 0.4]", {
        "logprobs": torch.tensor([[-1.0 + 0.1, -2.0 - 0.2, -0.5 + 0.4]]),
        "old_logprobs": torch.tensor([[-1.0, -2.0, -0.5]]), "mask": torch.ones(1, 3)},
        [[1.1052, 1.1052, 1.1052]], "已知值：逐 token 对数比率 [0.1, -0.2, 0.4]")], tolerance=1e-3)
    g = _generator(seed)
    for i, lengths in enumerate([[4, 2, 5], [1, 3, 6, 2]]):
        seq_len = max(lengths) + 1
        mask = _right_padded_mask(lengths, seq_len)
        old = -torch.rand(len(lengths), seq_len, generator=g) * 3
        cases.append(Case(f"random {i}: lengths {lengths}", {
            "logprobs": old + torch.randn(len(lengths), seq_len, generator=g) * 0.3,
            "old_logprobs": old, "mask": mask}, name_zh=f"随机用例 {i}：长度 {lengths}"))
    mask = _right_padded_mask([3, 5], 6)
    logprobs = -torch.rand(2, 6, generator=g)
    cases.append(Case("on-policy: old_logprobs IS logprobs",
                      {"logprobs": logprobs, "old_logprobs": logprobs, "mask": mask},
                      name_zh="同策略：old_logprobs 就是 logprobs 本身"))
    return cases


def _observe_masked_ratio(function, kwargs):
    """GSPO's ratio is compared on real tokens (padding may hold anything), with its gradient."""
    observe = _with_grad(("logprobs", "old_logprobs"))
    mask = kwargs["mask"].bool()

    def masked(**kw):
        ratio = function(**kw)
        if not isinstance(ratio, torch.Tensor) or ratio.shape != mask.shape:
            return ratio  # the checker names the shape it expected
        return torch.where(mask, ratio, torch.zeros_like(ratio))

    return observe(masked, kwargs)


GSPO_MISTAKES = (
    Mistake("product_not_geometric_mean", "s_i is the GEOMETRIC MEAN of the token ratios: "
            "exp((1/|y_i|) sum_t log r_t). Without 1/|y_i| long answers get astronomically large ratios.",
            _gspo_product,
            zh="s_i 是各 token 比率的几何平均：exp((1/|y_i|) Σ_t log r_t)。少了 1/|y_i|，"
               "长回答的比率会大得离谱。"),
    Mistake("mean_over_padding", "divide the summed log-ratio by the completion's own length |y_i| "
            "(mask.sum(-1)), not by the padded width T.", _gspo_mean_over_padding,
            zh="对数比率之和要除以这条回答自己的长度 |y_i|（`mask.sum(-1)`），而不是填充后的宽度 T。"),
    Mistake("arithmetic_mean_of_ratios", "GSPO averages LOG-ratios and exponentiates (a geometric mean), "
            "not the ratios themselves.", _gspo_arithmetic_mean,
            zh="GSPO 是先对对数比率求平均、再取指数（几何平均），不是对比率本身求算术平均。"),
    Mistake("ratio_not_detached", "pi_old is data: detach old_logprobs. Without it, old = logprobs gives "
            "s = 1 with zero gradient.", _gspo_not_detached,
            zh="π_old 是数据，要对 old_logprobs 调用 `detach()`。"
               "否则 old 等于 logprobs 时 s = 1，梯度为零。"),
)


# ----------------------------------------------------------------------------------------------
# the four loss aggregations


def _aggregate_swapped(per_token_loss, mask, loss_type, max_completion_length):
    swap = {"grpo": "bnpo", "bnpo": "grpo", "dapo": "grpo", "dr_grpo": "dr_grpo"}[loss_type]
    return aggregate(per_token_loss, mask, swap, max_completion_length=max_completion_length)


def _aggregate_padding_counted(per_token_loss, mask, loss_type, max_completion_length):
    if loss_type in ("bnpo", "dapo"):
        return (per_token_loss * mask).sum() / mask.numel()  # padding counted as tokens
    return aggregate(per_token_loss, mask, loss_type, max_completion_length=max_completion_length)


def _aggregate_dr_grpo_tokens(per_token_loss, mask, loss_type, max_completion_length):
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / mask.sum()  # token count, not the constant B * L_max
    return aggregate(per_token_loss, mask, loss_type, max_completion_length=max_completion_length)


def _aggregate_dr_grpo_width(per_token_loss, mask, loss_type, max_completion_length):
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / mask.numel()  # the padded width, not max_completion_length
    return aggregate(per_token_loss, mask, loss_type, max_completion_length=max_completion_length)


def aggregation_cases(seed: int) -> list[Case]:
    g = _generator(seed)
    cases = []
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        for i, lengths in enumerate([[1, 4, 2], [5, 3, 3, 1]]):
            seq_len = max(lengths) + 1
            cases.append(Case(f"{loss_type} {i}: lengths {lengths}", {
                "per_token_loss": torch.randn(len(lengths), seq_len, generator=g) + 0.5,
                "mask": _right_padded_mask(lengths, seq_len), "loss_type": loss_type,
                "max_completion_length": seq_len + 3}, name_zh=f"{loss_type} 用例 {i}：长度 {lengths}"))
    return cases


AGGREGATION_MISTAKES = (
    Mistake("grpo_bnpo_swapped", "'grpo' is the mean over sequences of each sequence's token mean; 'bnpo' "
            "and 'dapo' divide the sum over all tokens by the token count.", _aggregate_swapped,
            zh="'grpo' 是先求每条序列内 token 损失的平均，再对序列求平均；'bnpo' 和 'dapo' "
               "是全部 token 的损失之和除以 token 总数。"),
    Mistake("padding_counted", "the token count is mask.sum(), not the padded tensor's numel().",
            _aggregate_padding_counted, zh="token 总数是 `mask.sum()`，不是填充后张量的 `numel()`。"),
    Mistake("dr_grpo_by_tokens", "Dr. GRPO divides by the CONSTANT batch * max_completion_length, so the "
            "weight of a token does not depend on how long the answers happened to be.",
            _aggregate_dr_grpo_tokens,
            zh="Dr. GRPO 除以的是常数 B × `max_completion_length`，"
               "这样每个 token 的权重与这批回答碰巧有多长无关。"),
    Mistake("dr_grpo_padded_width", "Dr. GRPO's constant is max_completion_length (the generation budget), "
            "not the width of this padded batch.", _aggregate_dr_grpo_width,
            zh="Dr. GRPO 的常数用的是 `max_completion_length`（生成长度上限），不是这个批次填充后的宽度。"),
)


# ----------------------------------------------------------------------------------------------
# the clipped value loss (PPO)


def _value_min(values, old_values, returns, mask, clip_range_value):
    clipped = torch.clamp(values, old_values - clip_range_value, old_values + clip_range_value)
    return 0.5 * (torch.min((values - returns) ** 2, (clipped - returns) ** 2) * mask).sum() / mask.sum()


def _value_padding_counted(values, old_values, returns, mask, clip_range_value):
    clipped = torch.clamp(values, old_values - clip_range_value, old_values + clip_range_value)
    return 0.5 * (torch.max((values - returns) ** 2, (clipped - returns) ** 2) * mask).mean()


def _value_no_half(values, old_values, returns, mask, clip_range_value):
    return 2 * clipped_value_loss(values, old_values, returns, mask, clip_range_value)[0]


def _value_unclipped(values, old_values, returns, mask, clip_range_value):
    return 0.5 * (((values - returns) ** 2) * mask).sum() / mask.sum()


def value_loss_cases(seed: int) -> list[Case]:
    g = _generator(seed)
    cases = []
    for i, (lengths, clip) in enumerate([([4, 2, 5], 0.2), ([3, 1, 6, 2], 0.1), ([2, 2], 0.5)]):
        seq_len = max(lengths) + 1
        old = torch.randn(len(lengths), seq_len, generator=g)
        cases.append(Case(f"random {i}: clip {clip}", {
            "values": old + torch.randn(len(lengths), seq_len, generator=g) * 0.4,
            "old_values": old, "returns": old + torch.randn(len(lengths), seq_len, generator=g),
            "mask": _right_padded_mask(lengths, seq_len), "clip_range_value": clip},
            name_zh=f"随机用例 {i}：裁剪范围 {clip}"))
    return cases


VALUE_MISTAKES = (
    Mistake("min_instead_of_max", "PPO's value loss takes the MAX of the clipped and unclipped errors "
            "(pessimistic), like the policy's min of the surrogates.", _value_min,
            zh="PPO 的价值损失对裁剪与未裁剪两种误差取最大值（悲观估计），"
               "与策略损失对两个替代目标取最小值是同一个道理。"),
    Mistake("padding_counted", "the mean runs over padded positions too; average over real tokens only.",
            _value_padding_counted, zh="求平均时把填充位置也算了进去；只能对真实 token 求平均。"),
    Mistake("missing_half", "the loss is 0.5 * mean(max(...)) (so its gradient is V - R).", _value_no_half,
            zh="损失是 0.5 × mean(max(...))（这样它的梯度正好是 V − R）。"),
    Mistake("no_clip", "plain 0.5 (V - R)^2: the clip to V_old +- c is missing. (Clipping V around the "
            "RETURN gives exactly this: that clipped error is never the larger one.)", _value_unclipped,
            zh="只有 0.5 (V − R)²：缺了把 V 裁剪到 V_old ± c 这一步。（若围绕回报 R 去裁剪 V，"
               "结果也正是这样："
               "裁剪后的误差永远不会是较大的那个。）"),
)


# ----------------------------------------------------------------------------------------------

def _grad_of(*keys):
    return _with_grad(keys)


EXERCISES = [
    Exercise(
        name="group_advantages", title="GRPO's group-relative advantages", topic="advantages",
        difficulty="easy", minutes=10,
        signature='''def group_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """GRPO's outcome advantage. rewards: (num_prompts * G,), the G completions of each prompt in
    CONTIGUOUS rows; returns (num_prompts * G,) float32.

        A_i = (r_i - mean_group(r)) / (std_group(r) + 1e-4)

    std is the sample std (divides by G - 1), as TRL's GRPOTrainer. (DeepSeekMath, arXiv 2402.03300.)
    """''',
        reference=group_advantages, make_cases=group_advantages_cases, mistakes=GROUP_MISTAKES,
        combine=_group_forms,
        hints=("rewards.view(-1, G) puts one prompt's group on each row.",
               "torch.std divides by n - 1 by default; numpy's std divides by n.",
               "What happens to a group whose G rewards are all 1?"),
        source="DeepSeekMath (arXiv 2402.03300); TRL GRPOTrainer",
        title_zh="GRPO 的组内相对优势",
        question="How does GRPO get a baseline without a critic?",
        question_zh="GRPO 没有价值模型，它的基线从哪里来？",
        explanation="Sample G answers to the same prompt and use the group as its own baseline: an answer's "
                    "advantage is how many standard deviations its reward sits above the group mean. Every "
                    "token of the answer gets that one value.",
        explanation_zh="对同一个提示词采样 G 个回答，用这一组自己做基线：一个回答的优势，"
                       "就是它的奖励比组内均值高出几个标准差，这个回答的每个 token 都共用这个值。",
        hints_zh=("`rewards.view(-1, G)` 让每一行正好是一个提示词的那一组。",
                  "`torch.std` 默认除以 n − 1；numpy 的 std 默认除以 n。",
                  "如果一组的 G 个奖励全是 1，会发生什么？"),
    ),
    Exercise(
        name="gae", title="GAE advantages and returns", topic="advantages", difficulty="medium", minutes=20,
        signature='''def gae(rewards, values, mask, gamma: float, lam: float):
    """Generalised Advantage Estimation over right-padded completions. Returns (advantages, returns).

    rewards, values, mask: (batch, seq) float; mask is 1 on real tokens. The episode ends at the last
    real token: the value after it is 0 (not_done_t = mask_{t+1}, and 0 after the last column).

        delta_t = r_t + gamma * V_{t+1} * not_done_t - V_t
        A_t     = delta_t + gamma * lam * not_done_t * A_{t+1}
        R_t     = A_t + V_t

    Padded positions get A = R = 0. (Schulman et al. 2015, arXiv 1506.02438.)
    """''',
        reference=gae, make_cases=gae_cases, mistakes=GAE_MISTAKES, outputs=("advantages", "returns"),
        hints=("A_t needs A_{t+1}: loop t from the last column down to 0.",
               "Keep next_value, next_advantage and not_done as (batch,) tensors, all 0 before the loop.",
               "The return of token t is A_t + V_t: one number per token."),
        source="GAE (arXiv 1506.02438)",
        runaway="The recursion is one pass over the sequence, T steps: look for a loop that never ends.",
        runaway_zh="递推只需把序列倒着走一遍，共 T 步：检查是否有停不下来的循环。",
        title_zh="广义优势估计 GAE：优势与回报",
        question="Write GAE. Why does the loop run backwards?",
        question_zh="手写 GAE（广义优势估计）。为什么循环要倒着跑？",
        explanation="GAE blends one-step TD errors with exponentially decaying weights (lambda) so that the "
                    "advantage trades bias for variance. Each A_t needs A_{t+1}, so it is computed from the "
                    "last token backwards; the episode ends at the last real token, where nothing is "
                    "bootstrapped.",
        explanation_zh="GAE 把各步的时序差分误差按 λ 指数衰减加权求和，在偏差和方差之间做权衡。每个 A_t "
                       "都要用到 "
                       "A_{t+1}，所以要从最后一个 token 往前算；回合在最后一个真实 token 处结束，"
                       "之后不再用价值估计自举。",
        hints_zh=("A_t 要用到 A_{t+1}：t 从最后一列倒着循环到 0。",
                  "把 next_value、next_advantage 和 not_done 都存成形状为 `(batch,)` 的张量，循环前全部置 "
                  "0。",
                  "第 t 个 token 的回报是 A_t + V_t：每个 token 一个数。"),
    ),
    Exercise(
        name="whiten", title="advantage whitening", topic="advantages", difficulty="easy", minutes=10,
        signature='''def whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Normalise to mean 0, std 1 over the REAL positions of the whole batch. (batch, seq) -> same.

        x_hat = (x - mean) / sqrt(var + 1e-8)      var unbiased (n - 1), as TRL's masked_whiten

    Masked-out positions come out as 0.
    """''',
        reference=whiten, make_cases=whiten_cases, mistakes=WHITEN_MISTAKES,
        hints=("values[mask.bool()] is the 1-D tensor of real values.",
               "One mean and one variance for the whole batch.",
               "torch.where(mask.bool(), x, 0) clears padding."),
        source="TRL masked_whiten; OpenAI lm-human-preferences",
        title_zh="优势白化",
        question="Why whiten advantages, and over what?",
        question_zh="为什么要对优势做白化？在什么范围上做？",
        explanation="PPO rescales the batch's advantages to mean 0 and standard deviation 1, so the step "
                    "size does not depend on the reward scale. The statistics come from the real tokens of "
                    "the whole batch only.",
        explanation_zh="PPO 把一个批次的优势缩放到均值 0、标准差 1，这样更新步长就不受奖励量纲的影响。"
                       "均值和标准差只在整个批次的真实 token 上计算。",
        hints_zh=("`values[mask.bool()]` 就是所有真实位置上的值组成的一维张量。",
                  "整个批次只用一个均值和一个方差。",
                  "`torch.where(mask.bool(), x, 0)` 可以把填充位置清零。"),
    ),
    Exercise(
        name="clipped_policy_loss", title="the PPO/GRPO clipped surrogate with eps_low/eps_high",
        topic="losses", difficulty="medium", minutes=15,
        signature='''def clipped_policy_loss(logprobs, old_logprobs, advantages, mask, eps_low: float,
                        eps_high: float):
    """The clipped policy loss (to minimise), GRPO aggregation. All inputs (batch, seq); returns a scalar.

        r_t    = exp(log pi(a_t) - log pi_old(a_t))          pi_old is data: no gradient through it
        l_t    = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)
        loss   = mean over sequences of (sum_t mask_t l_t / sum_t mask_t)

    eps_high > eps_low is DAPO's clip-higher. (PPO arXiv 1707.06347; DAPO arXiv 2503.14476.)
    """''',
        reference=clipped_policy_loss, make_cases=policy_loss_cases, mistakes=POLICY_MISTAKES,
        combine=_policy_forms,
        hints=("old_logprobs.detach(): the sampling policy is a constant.",
               "torch.min of the two surrogates, then the minus sign.",
               "Token mean inside each sequence (divide by its mask sum), then the mean over sequences."),
        source="PPO (arXiv 1707.06347); DAPO (arXiv 2503.14476); TRL GRPOTrainer",
        observe=_grad_of("logprobs", "old_logprobs"),
        title_zh="PPO/GRPO 的裁剪替代目标，含 eps_low / eps_high",
        question="Implement the core of PPO's policy loss under time pressure.",
        question_zh="限时手写 PPO 策略损失的核心部分。",
        explanation="The importance ratio re-weights samples from the old policy; clipping it removes the "
                    "incentive to move the ratio outside [1 - eps_low, 1 + eps_high], and the min keeps the "
                    "pessimistic bound. The old policy's log-probs are data: no gradient flows into them.",
        explanation_zh="重要性采样比率给旧策略采到的样本重新加权；对它做裁剪，就不再有把比率推出 "
                       "[1 − eps_low, 1 + eps_high] 的动力，取 min 则保证用的是悲观下界。"
                       "旧策略的对数概率是数据，"
                       "梯度不流向它。",
        hints_zh=("`old_logprobs.detach()`：采样策略是常量。",
                  "先对两个替代目标取 `torch.min`，再加负号。",
                  "先在每条序列内对 token 求平均（除以该行掩码之和），再对序列求平均。"),
    ),
    Exercise(
        name="kl_estimators", title="k1, k2, k3 KL estimators", topic="losses", difficulty="easy", minutes=10,
        signature='''def kl_estimators(logprobs: torch.Tensor, ref_logprobs: torch.Tensor):
    """Per-token KL(pi || pi_ref) estimates from the sampled tokens' log-probs. (batch, seq) each;
    returns (k1, k2, k3), each (batch, seq). With x = log pi_ref - log pi:

        k1 = -x        k2 = x^2 / 2        k3 = e^x - x - 1

    (John Schulman, "Approximating KL Divergence", 2020; GRPO adds beta * k3 to its loss.)
    """''',
        reference=kl_estimators, make_cases=kl_cases, mistakes=KL_MISTAKES, outputs=("k1", "k2", "k3"),
        hints=("All three are functions of one number per token: x = log pi_ref - log pi.",
               "k3 >= 0 always, and k3 = 0 when pi = pi_ref."),
        source="Schulman (2020) 'Approximating KL Divergence'; DeepSeekMath",
        title_zh="k1、k2、k3 三种 KL 估计量",
        question="What are k1, k2 and k3, and which one does GRPO use?",
        question_zh="k1、k2、k3 分别是什么？GRPO 用的是哪一个？",
        explanation="The KL to the reference is estimated per sampled token from two log-probabilities. k1 "
                    "is unbiased but can be negative; k3 is unbiased and never negative, which is why GRPO "
                    "adds beta times k3 to its loss.",
        explanation_zh="相对参考模型的 KL 散度，是在每个采样到的 token 上用两个对数概率来估计的。k1 "
                       "无偏但可能为负；k3 "
                       "无偏且永远非负，所以 GRPO 在损失里加的是 β 乘以 k3。",
        hints_zh=("三者都只是每个 token 上一个数的函数：x = log π_ref − log π。",
                  "k3 始终 ≥ 0，且 π = π_ref 时 k3 = 0。"),
    ),
    Exercise(
        name="gspo_ratio", title="GSPO's sequence-level importance ratio", topic="losses",
        difficulty="medium", minutes=10,
        signature='''def gspo_ratio(logprobs, old_logprobs, mask):
    """GSPO's length-normalised sequence ratio, broadcast to every token. (batch, seq) -> (batch, seq).

        s_i = exp( (1/|y_i|) sum_t mask_it (log pi(y_it) - log pi_old(y_it)) )

    |y_i| = mask[i].sum(). pi_old is data (no gradient). Padded positions may hold any value.
    (GSPO, arXiv 2507.18071, eq. 7.)
    """''',
        reference=gspo_ratio, make_cases=gspo_cases, mistakes=GSPO_MISTAKES,
        hints=("A geometric mean of ratios is exp of the mean of log-ratios.",
               "Divide by each row's own length, mask.sum(-1, keepdim=True).",
               ".expand_as(logprobs) broadcasts (batch, 1) to (batch, seq)."),
        source="GSPO (arXiv 2507.18071)",
        observe=_observe_masked_ratio,
        title_zh="GSPO 组序列策略优化：序列级重要性比率",
        question="How does GSPO's importance ratio differ from GRPO's?",
        question_zh="GSPO 的重要性采样比率和 GRPO 的有什么不同？",
        explanation="GSPO uses one ratio per answer: the geometric mean of its token ratios, so that long "
                    "and short answers live on the same scale and a whole answer is clipped or not.",
        explanation_zh="GSPO 每个回答只用一个比率：各 token 比率的几何平均。这样长回答和短回答的比率处在同一"
                       "量级；裁剪也以整个回答为单位，要么整条裁掉，要么整条保留。",
        hints_zh=("比率的几何平均，就是对数比率的平均再取指数。",
                  "每一行除以它自己的长度：`mask.sum(-1, keepdim=True)`。",
                  "`.expand_as(logprobs)` 把 `(batch, 1)` 广播成 `(batch, seq)`。"),
    ),
    Exercise(
        name="aggregate", title="the four loss aggregations (grpo, bnpo, dr_grpo, dapo)", topic="losses",
        difficulty="easy", minutes=10,
        signature='''def aggregate(per_token_loss, mask, loss_type: str, max_completion_length: int):
    """Reduce a (batch, seq) per-token loss to a scalar; mask (batch, seq), 1 = real token.

        grpo     (1/B) sum_i (1/|o_i|) sum_t l_it            token mean per sequence, then mean
        bnpo     sum_it l_it / sum_it m_it                    every token of the batch weighs the same
        dr_grpo  sum_it l_it / (B * max_completion_length)    a constant normaliser (Dr. GRPO)
        dapo     sum_it l_it / (token count of the batch)     (= bnpo on one process)

    (TRL GRPOTrainer loss_type; Dr. GRPO arXiv 2503.20783; DAPO arXiv 2503.14476.)
    """''',
        reference=aggregate, make_cases=aggregation_cases, mistakes=AGGREGATION_MISTAKES,
        hints=("Mask first: (per_token_loss * mask). The token count is mask.sum().",
               "Dr. GRPO's normaliser does not depend on the answers' lengths at all."),
        source="TRL GRPOTrainer; Dr. GRPO; DAPO",
        title_zh="四种损失聚合方式：grpo、bnpo、dr_grpo、dapo",
        question="What do the loss_type options of TRL's GRPOTrainer change?",
        question_zh="TRL 的 GRPOTrainer 里 loss_type 的几个选项改变的是什么？",
        explanation="Only how per-token losses are averaged, which sets each token's weight: per sequence "
                    "first (grpo), over all tokens (bnpo/dapo), or by a constant (dr_grpo).",
        explanation_zh="它只改变逐 token 损失的平均方式，也就是每个 token 的权重：先按序列平均（grpo）、"
                       "对所有 token 平均（bnpo/dapo），或者除以一个常数（dr_grpo）。",
        hints_zh=("先乘掩码：`per_token_loss * mask`。token 总数是 `mask.sum()`。",
                  "Dr. GRPO 的归一化常数与回答的长度完全无关。"),
    ),
    Exercise(
        name="clipped_value_loss", title="PPO's clipped value loss", topic="losses", difficulty="easy",
        minutes=10,
        signature='''def clipped_value_loss(values, old_values, returns, mask, clip_range_value: float):
    """PPO's clipped value loss over real tokens. All (batch, seq); returns a scalar.

        V_clip = clip(V, V_old - c, V_old + c)
        loss   = 0.5 * masked_mean(max((V - R)^2, (V_clip - R)^2))

    (OpenAI lm-human-preferences; TRL PPOTrainer.)
    """''',
        reference=clipped_value_loss, make_cases=value_loss_cases, mistakes=VALUE_MISTAKES,
        hints=("Clip around the value the rollout saw (V_old), with torch.clamp.",
               "Pessimistic: the larger of the two squared errors."),
        source="OpenAI lm-human-preferences; TRL PPOTrainer",
        observe=_grad_of("values"),
        title_zh="PPO 的裁剪价值损失",
        question="Why does PPO clip its value loss, and how?",
        question_zh="PPO 为什么要裁剪价值损失？怎么裁剪？",
        explanation="The critic's prediction may not move more than c from the value the rollout saw without "
                    "paying for it; like the policy loss it takes the pessimistic (larger) error.",
        explanation_zh="价值模型的预测偏离采样时的旧值超过 c 就要付出代价；和策略损失一样，"
                       "它取的是悲观的（较大的）那个误差。",
        hints_zh=("用 `torch.clamp` 围绕采样时看到的旧值 V_old 做裁剪。",
                  "取悲观估计：两个平方误差中较大的那个。"),
    ),
]
