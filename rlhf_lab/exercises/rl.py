"""RL exercises: advantages, GAE, whitening, the clipped surrogate, KL estimators, GSPO's ratio,
loss aggregation and the clipped value loss.

The reference of each is the package's own function (rlhf_lab.rl.advantages / losses / kl); only
two thin compositions of package functions are defined here (the clipped policy loss and the three
KL estimators returned together), because the exercise asks for them as one function.
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
    An input that gets no gradient counts as a zero gradient."""

    def observe(function, kwargs):
        for key in observe_keys:
            kwargs[key].requires_grad_(True)
        result = function(**kwargs)
        loss = result[0] if isinstance(result, tuple) else result
        observation = {"output": loss.detach().clone()}
        inputs = [kwargs[k] for k in observe_keys]
        grads = torch.autograd.grad(loss.sum(), inputs, allow_unused=True) if loss.requires_grad else [None] * len(inputs)
        seen = {}
        for key, tensor, grad in zip(observe_keys, inputs, grads):
            if id(tensor) in seen:  # the same tensor passed twice (old_logprobs = logprobs): one gradient
                grad = seen[id(tensor)]
            seen[id(tensor)] = grad
            observation[f"grad_{key}"] = torch.zeros_like(tensor) if grad is None else grad.detach().clone()
        return observation

    return observe


# ----------------------------------------------------------------------------------------------
# group-relative advantages (GRPO)


def _population_std(rewards, num_generations):
    grouped = rewards.float().view(-1, num_generations)
    a = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, unbiased=False, keepdim=True) + 1e-4)
    return a.reshape(-1)


def _batch_normalisation(rewards, num_generations):
    rewards = rewards.float()
    return (rewards - rewards.mean()) / (rewards.std() + 1e-4)


def _batch_std(rewards, num_generations):
    rewards = rewards.float()
    grouped = rewards.view(-1, num_generations)
    return ((grouped - grouped.mean(1, keepdim=True)).reshape(-1)) / (rewards.std() + 1e-4)


def _missing_epsilon(rewards, num_generations):
    grouped = rewards.float().view(-1, num_generations)
    return ((grouped - grouped.mean(1, keepdim=True)) / grouped.std(1, keepdim=True)).reshape(-1)


def _no_std(rewards, num_generations):
    grouped = rewards.float().view(-1, num_generations)
    return (grouped - grouped.mean(1, keepdim=True)).reshape(-1)


def _strided_groups(rewards, num_generations):
    grouped = rewards.float().view(num_generations, -1)  # assumes prompt-major interleaving
    a = (grouped - grouped.mean(0, keepdim=True)) / (grouped.std(0, keepdim=True) + 1e-4)
    return a.reshape(-1)


def group_advantages_cases(seed: int) -> list[Case]:
    cases = spec_cases([
        ("spec: [1,0,0,0]", {"rewards": torch.tensor([1.0, 0, 0, 0]), "num_generations": 4},
         [1.4997, -0.4999, -0.4999, -0.4999]),
        ("spec: [0,1]", {"rewards": torch.tensor([0.0, 1.0]), "num_generations": 2}, [-0.7070, 0.7070]),
    ])
    cases += [
        Case("two groups, different spreads", {"rewards": torch.tensor([1.0, 0, 0, 0, 4, 0, 2, 2]),
                                                "num_generations": 4}),
        Case("an all-equal group", {"rewards": torch.tensor([1.0, 1, 1, 1, 0, 1, 0, 1]), "num_generations": 4}),
        Case("a tiny spread (eps matters)", {"rewards": torch.tensor([0.0, 0, 0, 1e-3]), "num_generations": 4}),
    ]
    g = _generator(seed)
    for i in range(6):
        G = int(torch.randint(2, 9, (1,), generator=g))
        prompts = int(torch.randint(2, 5, (1,), generator=g))
        rewards = torch.randint(0, 3, (prompts * G,), generator=g).float() / 2  # {0, 0.5, 1}: like task rewards
        if i % 2:
            rewards = torch.randn(prompts * G, generator=g) * 3 + 1
        cases.append(Case(f"random {i}: {prompts} prompts x G={G}", {"rewards": rewards, "num_generations": G}))
    return cases


GROUP_MISTAKES = (
    Mistake("population_std", "std divides by G (population std, torch.std(unbiased=False) / numpy's default); "
            "TRL and this lab use the sample std (G - 1), torch's default.", _population_std),
    Mistake("batch_normalisation", "mean and std over the whole batch mix different prompts: the baseline "
            "must be each prompt's own group (view(-1, G), then statistics along dim 1).", _batch_normalisation),
    Mistake("batch_std", "the std over the whole batch is TRL's scale_rewards='batch'; GRPO divides by the "
            "std of each group.", _batch_std),
    Mistake("missing_epsilon", "no epsilon: a group whose rewards are all equal gives 0/0 = nan. "
            "Divide by (std + 1e-4) as TRL does.", _missing_epsilon),
    Mistake("no_std_division", "r - mean without dividing by the std is Dr. GRPO's advantage; GRPO also "
            "divides by (std + eps).", _no_std),
    Mistake("strided_groups", "completions of one prompt are CONTIGUOUS rows (view(-1, G)), not every "
            "num_prompts-th row (view(G, -1)).", _strided_groups),
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
        advantage = (delta + gamma * lam * advantage * (mask[:, t + 1] if t + 1 < seq_len else 0)) * mask[:, t]
        advantages.insert(0, advantage)
        returns.insert(0, advantage[:, None] + values[:, :-1])  # wrong: values[:, t]
    return torch.stack(advantages, 1), torch.stack(returns, 1)


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
        ("spec: lambda 0.95", {"rewards": torch.tensor([[0.0, 0, 1]]), "values": torch.full((1, 3), 0.5),
                               "mask": ones, "gamma": 1.0, "lam": 0.95},
         ([[0.45125, 0.475, 0.5]], [[0.95125, 0.975, 1.0]])),
        ("spec: lambda 1", {"rewards": torch.tensor([[0.0, 0, 1]]), "values": torch.full((1, 3), 0.5),
                            "mask": ones, "gamma": 1.0, "lam": 1.0},
         ([[0.5, 0.5, 0.5]], [[1.0, 1.0, 1.0]])),
    ]
    cases = spec_cases(spec)
    g = _generator(seed)
    for i, (lengths, gamma, lam) in enumerate([([5, 3, 1], 1.0, 0.95), ([4, 4, 2, 6], 0.9, 0.8),
                                               ([6, 2, 5], 0.99, 0.95), ([3, 1, 2], 1.0, 0.5)]):
        seq_len = max(lengths) + 1  # at least one padded position in every row
        mask = _right_padded_mask(lengths, seq_len)
        rewards = torch.randn(len(lengths), seq_len, generator=g) * 0.1 * mask  # per-token KL penalties
        rewards[torch.arange(len(lengths)), torch.tensor(lengths) - 1] += torch.rand(len(lengths), generator=g)
        values = torch.randn(len(lengths), seq_len, generator=g)  # the critic also speaks on padding
        cases.append(Case(f"random {i}: lengths {lengths}, gamma {gamma}, lam {lam}",
                          {"rewards": rewards, "values": values, "mask": mask, "gamma": gamma, "lam": lam}))
    return cases


GAE_MISTAKES = (
    Mistake("values_vector_snippet", "the interview-notes snippet adds the whole vector values[:-1] inside "
            "the loop (`gae + values[:-1]`), so each return is a vector; the return of token t is "
            "A_t + V_t (`gae + values[t]`).", _gae_vector_snippet),
    Mistake("missing_lambda", "A_t = delta_t + gamma * lam * A_{t+1}: the recursion lost its lam "
            "(that is lam = 1, Monte Carlo returns).", _gae_missing_lambda),
    Mistake("bootstrap_into_padding", "after the last real token the episode is over: V_{t+1} and A_{t+1} "
            "must be 0 there (not_done_t = mask_{t+1}), not the critic's value at a padded position.",
            _gae_bootstrap_into_padding),
    Mistake("returns_to_go", "the value target is R_t = A_t + V_t (the lambda-return), not the discounted "
            "sum of rewards.", _gae_returns_to_go),
    Mistake("forward_order", "A_t depends on A_{t+1}: loop over t backwards (reversed(range(T))).",
            _gae_forward_order),
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
    return torch.stack([whiten(v[None], m[None])[0] for v, m in zip(values, mask)])


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
        cases.append(Case(f"random {i}: lengths {lengths}", {"values": values, "mask": mask}))
    mask = _right_padded_mask([3, 2], 4)
    values = torch.tensor([[0.5, 0.5, 0.5, 9.0], [0.5, 0.5, -3.0, 1.0]])
    cases.append(Case("constant real values (std 0)", {"values": values, "mask": mask}))
    return cases


WHITEN_MISTAKES = (
    Mistake("population_variance", "variance divided by n: TRL's masked_whiten uses the unbiased variance "
            "(n - 1), so the whitened values have torch.std() == 1.", _whiten_population),
    Mistake("stats_include_padding", "mean and variance must be over the REAL tokens only (mask == 1); "
            "padded positions are not data.", _whiten_with_padding),
    Mistake("per_row", "advantages are whitened over the whole batch (one mean, one std), not per "
            "sequence.", _whiten_per_row),
    Mistake("padding_not_zeroed", "padded positions must come out as 0 (multiply by the mask, or "
            "torch.where).", _whiten_padding_kept),
    Mistake("missing_epsilon", "no epsilon: constant values give 0/0 = nan. Use (x - mean) / sqrt(var + 1e-8).",
            _whiten_missing_eps),
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


def _policy_variant(per_token):
    """A clipped-policy-loss variant from a wrong per-token formula (ratio, A, eps_low, eps_high)."""

    def variant(logprobs, old_logprobs, advantages, mask, eps_low, eps_high):
        ratio = torch.exp(logprobs - old_logprobs.detach())
        return aggregate(per_token(ratio, advantages, eps_low, eps_high), mask, "grpo")

    return variant


def _policy_not_detached(logprobs, old_logprobs, advantages, mask, eps_low, eps_high):
    ratio = torch.exp(logprobs - old_logprobs)
    return aggregate(clipped_surrogate(ratio, advantages, eps_low, eps_high)[0], mask, "grpo")


def _policy_bnpo(logprobs, old_logprobs, advantages, mask, eps_low, eps_high):
    ratio = torch.exp(logprobs - old_logprobs.detach())
    return aggregate(clipped_surrogate(ratio, advantages, eps_low, eps_high)[0], mask, "bnpo")


def _policy_padding_counted(logprobs, old_logprobs, advantages, mask, eps_low, eps_high):
    ratio = torch.exp(logprobs - old_logprobs.detach())
    return clipped_surrogate(ratio, advantages, eps_low, eps_high)[0].mean()


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
            "eps_low": eps_low, "eps_high": eps_high}))
    mask = _right_padded_mask([3, 1, 4], 5)
    logprobs = -torch.rand(3, 5, generator=g) * 2
    cases.append(Case("on-policy: old_logprobs IS logprobs (num_iterations = 1)", {
        "logprobs": logprobs, "old_logprobs": logprobs, "advantages": torch.randn(3, 5, generator=g),
        "mask": mask, "eps_low": 0.2, "eps_high": 0.2}))
    return cases


POLICY_MISTAKES = (
    Mistake("clip_without_min", "-clip(r, 1-eps, 1+eps) * A alone lets the ratio escape where the clip "
            "should not help it; the surrogate is -min(r * A, clip(r) * A).",
            _policy_variant(lambda r, a, lo, hi: -torch.clamp(r, 1 - lo, 1 + hi) * a)),
    Mistake("ratio_not_detached", "pi_old is data: exp(logprobs - old_logprobs.detach()). Without the "
            "detach, old_logprobs = logprobs gives ratio 1 with ZERO gradient (and off-policy, gradient "
            "flows into pi_old).", _policy_not_detached),
    Mistake("max_instead_of_min", "-max(r A, clip(r) A) is optimistic; PPO takes the pessimistic bound: "
            "-min(r A, clip(r) A).",
            _policy_variant(lambda r, a, lo, hi: -torch.max(r * a, torch.clamp(r, 1 - lo, 1 + hi) * a))),
    Mistake("symmetric_clip", "the upper clip is 1 + eps_high (DAPO's clip-higher), not 1 + eps_low.",
            _policy_variant(lambda r, a, lo, hi: -torch.min(r * a, torch.clamp(r, 1 - lo, 1 + lo) * a))),
    Mistake("log_ratio_not_exponentiated", "the ratio is exp(log pi - log pi_old), not the log-ratio "
            "itself.", _policy_variant(lambda r, a, lo, hi: -torch.min(
                torch.log(r) * a, torch.clamp(torch.log(r), 1 - lo, 1 + hi) * a))),
    Mistake("token_mean_over_batch", "that is the 'bnpo' aggregation (every token of the batch weighs the "
            "same); GRPO averages tokens within each sequence first, then sequences.", _policy_bnpo),
    Mistake("padding_counted", "the mean runs over padded positions too; average over real tokens "
            "(mask) only.", _policy_padding_counted),
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
    cases = spec_cases([("spec: log pi -1, log pi_ref -1.5",
                         {"logprobs": torch.tensor([[-1.0]]), "ref_logprobs": torch.tensor([[-1.5]])},
                         ([[0.5]], [[0.125]], [[0.1065]]))])
    g = _generator(seed)
    for i in range(3):
        logprobs = -torch.rand(3, 6, generator=g) * 4
        cases.append(Case(f"random {i}", {"logprobs": logprobs,
                                          "ref_logprobs": logprobs + torch.randn(3, 6, generator=g) * 0.5}))
    return cases


KL_MISTAKES = (
    Mistake("k3_wrong_direction", "k3 uses x = log pi_ref - log pi (ratio pi_ref / pi): e^x - x - 1. With "
            "x = log(pi / pi_ref) it estimates KL(pi_ref || pi) and is biased under samples from pi.",
            _kl_k3_reversed),
    Mistake("k1_sign", "k1 = log pi - log pi_ref (positive when the policy likes its sample more than the "
            "reference does).", _kl_k1_sign),
    Mistake("k2_without_half", "k2 = (log pi - log pi_ref)^2 / 2: the half makes its gradient equal "
            "k1's in expectation.", _kl_k2_no_half),
    Mistake("k3_without_minus_one", "k3 = e^x - x - 1; without the -1 it is not 0 when pi = pi_ref.",
            _kl_k3_without_minus_one),
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
    cases = spec_cases([("spec: token log-ratios [0.1, -0.2, 0.4]", {
        "logprobs": torch.tensor([[-1.0 + 0.1, -2.0 - 0.2, -0.5 + 0.4]]),
        "old_logprobs": torch.tensor([[-1.0, -2.0, -0.5]]), "mask": torch.ones(1, 3)},
        [[1.1052, 1.1052, 1.1052]])], tolerance=1e-3)
    g = _generator(seed)
    for i, lengths in enumerate([[4, 2, 5], [1, 3, 6, 2]]):
        seq_len = max(lengths) + 1
        mask = _right_padded_mask(lengths, seq_len)
        old = -torch.rand(len(lengths), seq_len, generator=g) * 3
        cases.append(Case(f"random {i}: lengths {lengths}", {
            "logprobs": old + torch.randn(len(lengths), seq_len, generator=g) * 0.3,
            "old_logprobs": old, "mask": mask}))
    mask = _right_padded_mask([3, 5], 6)
    logprobs = -torch.rand(2, 6, generator=g)
    cases.append(Case("on-policy: old_logprobs IS logprobs", {"logprobs": logprobs, "old_logprobs": logprobs,
                                                              "mask": mask}))
    return cases


def _observe_masked_ratio(function, kwargs):
    """GSPO's ratio is compared on real tokens (padding may hold anything), with its gradient."""
    observe = _with_grad(("logprobs", "old_logprobs"))
    mask = kwargs["mask"].bool()

    def masked(**kw):
        ratio = function(**kw)
        return torch.where(mask, ratio, torch.zeros_like(ratio))

    return observe(masked, kwargs)


GSPO_MISTAKES = (
    Mistake("product_not_geometric_mean", "s_i is the GEOMETRIC MEAN of the token ratios: "
            "exp((1/|y_i|) sum_t log r_t). Without 1/|y_i| long answers get astronomically large ratios.",
            _gspo_product),
    Mistake("mean_over_padding", "divide the summed log-ratio by the completion's own length |y_i| "
            "(mask.sum(-1)), not by the padded width T.", _gspo_mean_over_padding),
    Mistake("arithmetic_mean_of_ratios", "GSPO averages LOG-ratios and exponentiates (a geometric mean), "
            "not the ratios themselves.", _gspo_arithmetic_mean),
    Mistake("ratio_not_detached", "pi_old is data: detach old_logprobs. Without it, old = logprobs gives "
            "s = 1 with zero gradient.", _gspo_not_detached),
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
                "max_completion_length": seq_len + 3}))
    return cases


AGGREGATION_MISTAKES = (
    Mistake("grpo_bnpo_swapped", "'grpo' is the mean over sequences of each sequence's token mean; 'bnpo' "
            "and 'dapo' divide the sum over all tokens by the token count.", _aggregate_swapped),
    Mistake("padding_counted", "the token count is mask.sum(), not the padded tensor's numel().",
            _aggregate_padding_counted),
    Mistake("dr_grpo_by_tokens", "Dr. GRPO divides by the CONSTANT batch * max_completion_length, so the "
            "weight of a token does not depend on how long the answers happened to be.",
            _aggregate_dr_grpo_tokens),
    Mistake("dr_grpo_padded_width", "Dr. GRPO's constant is max_completion_length (the generation budget), "
            "not the width of this padded batch.", _aggregate_dr_grpo_width),
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
            "mask": _right_padded_mask(lengths, seq_len), "clip_range_value": clip}))
    return cases


VALUE_MISTAKES = (
    Mistake("min_instead_of_max", "PPO's value loss takes the MAX of the clipped and unclipped errors "
            "(pessimistic), like the policy's min of the surrogates.", _value_min),
    Mistake("padding_counted", "the mean runs over padded positions too; average over real tokens only.",
            _value_padding_counted),
    Mistake("missing_half", "the loss is 0.5 * mean(max(...)) (so its gradient is V - R).", _value_no_half),
    Mistake("no_clip", "plain 0.5 (V - R)^2: the clip to V_old +- c is missing. (Clipping V around the "
            "RETURN gives exactly this: that clipped error is never the larger one.)", _value_unclipped),
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
        hints=("rewards.view(-1, G) puts one prompt's group on each row.",
               "torch.std divides by n - 1 by default; numpy's std divides by n.",
               "What happens to a group whose G rewards are all 1?"),
        source="DeepSeekMath (arXiv 2402.03300); TRL GRPOTrainer; spec algorithms section 1",
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
        reference=gae, make_cases=gae_cases, mistakes=GAE_MISTAKES,
        hints=("A_t needs A_{t+1}: loop t from the last column down to 0.",
               "Keep next_value, next_advantage and not_done as (batch,) tensors, all 0 before the loop.",
               "The return of token t is A_t + V_t: one number per token."),
        source="GAE (arXiv 1506.02438); spec algorithms section 4",
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
               "One mean and one variance for the whole batch.", "torch.where(mask.bool(), x, 0) clears padding."),
        source="TRL masked_whiten; OpenAI lm-human-preferences; spec algorithms section 4",
    ),
    Exercise(
        name="clipped_policy_loss", title="the PPO/GRPO clipped surrogate with eps_low/eps_high",
        topic="losses", difficulty="medium", minutes=15,
        signature='''def clipped_policy_loss(logprobs, old_logprobs, advantages, mask, eps_low: float, eps_high: float):
    """The clipped policy loss (to minimise), GRPO aggregation. All inputs (batch, seq); returns a scalar.

        r_t    = exp(log pi(a_t) - log pi_old(a_t))          pi_old is data: no gradient through it
        l_t    = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)
        loss   = mean over sequences of (sum_t mask_t l_t / sum_t mask_t)

    eps_high > eps_low is DAPO's clip-higher. (PPO arXiv 1707.06347; DAPO arXiv 2503.14476.)
    """''',
        reference=clipped_policy_loss, make_cases=policy_loss_cases, mistakes=POLICY_MISTAKES,
        hints=("old_logprobs.detach(): the sampling policy is a constant.",
               "torch.min of the two surrogates, then the minus sign.",
               "Token mean inside each sequence (divide by its mask sum), then the mean over sequences."),
        source="PPO (arXiv 1707.06347); DAPO (arXiv 2503.14476); TRL GRPOTrainer",
        observe=_grad_of("logprobs", "old_logprobs"),
    ),
    Exercise(
        name="kl_estimators", title="k1, k2, k3 KL estimators", topic="losses", difficulty="easy", minutes=10,
        signature='''def kl_estimators(logprobs: torch.Tensor, ref_logprobs: torch.Tensor):
    """Per-token KL(pi || pi_ref) estimates from the sampled tokens' log-probs. (batch, seq) each;
    returns (k1, k2, k3), each (batch, seq). With x = log pi_ref - log pi:

        k1 = -x        k2 = x^2 / 2        k3 = e^x - x - 1

    (John Schulman, "Approximating KL Divergence", 2020; GRPO adds beta * k3 to its loss.)
    """''',
        reference=kl_estimators, make_cases=kl_cases, mistakes=KL_MISTAKES,
        hints=("All three are functions of one number per token: x = log pi_ref - log pi.",
               "k3 >= 0 always, and k3 = 0 when pi = pi_ref."),
        source="Schulman (2020) 'Approximating KL Divergence'; DeepSeekMath; spec algorithms section 1",
    ),
    Exercise(
        name="gspo_ratio", title="GSPO's sequence-level importance ratio", topic="losses", difficulty="medium",
        minutes=10,
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
        source="GSPO (arXiv 2507.18071); spec algorithms section 2",
        observe=_observe_masked_ratio,
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
        source="TRL GRPOTrainer; Dr. GRPO; DAPO; spec algorithms section 3",
    ),
    Exercise(
        name="clipped_value_loss", title="PPO's clipped value loss", topic="losses", difficulty="easy", minutes=10,
        signature='''def clipped_value_loss(values, old_values, returns, mask, clip_range_value: float):
    """PPO's clipped value loss over real tokens. All (batch, seq); returns a scalar.

        V_clip = clip(V, V_old - c, V_old + c)
        loss   = 0.5 * masked_mean(max((V - R)^2, (V_clip - R)^2))

    (OpenAI lm-human-preferences; TRL PPOTrainer.)
    """''',
        reference=clipped_value_loss, make_cases=value_loss_cases, mistakes=VALUE_MISTAKES,
        hints=("Clip around the value the rollout saw (V_old), with torch.clamp.",
               "Pessimistic: the larger of the two squared errors."),
        source="OpenAI lm-human-preferences; TRL PPOTrainer; spec algorithms section 4",
        observe=_grad_of("values"),
    ),
]
