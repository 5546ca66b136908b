"""Reward-model over-optimisation, measured (Gao, Schulman, Hilton 2022, arXiv 2210.10760).

A policy optimised against a learned reward (the *proxy*) is scored by a hidden *gold* reward that
plays the human. Both are followed against the distance the policy has moved from where it started,

    d = sqrt(KL(pi || pi_init))                       (nats^1/2; KL summed over a completion's tokens)

and Gao et al.'s functional forms are fitted to the gold gain R = gold - gold(pi_init):

    best-of-n   R_bon(d) = d (alpha - beta d)          peak at d* = alpha / (2 beta)
    RL          R_RL(d)  = d (alpha - beta log d)      peak at d* = exp(alpha / beta - 1)

The two ways to optimise:

- `best_of_n_pool` samples a pool of M completions per prompt once; `best_of_n_curve` turns it into
  the expected proxy and gold score of best-of-n for every n <= M (an unbiased estimator: the
  chance that the k-th best of the pool wins a random n-subset is C(k-1, n-1) / C(M, n)), with
  the KL of best-of-n against the policy it samples from. The analytic value
  KL_bon = log n - (n - 1) / n (`best_of_n_kl_bound`) holds when the n samples are almost surely
  distinct; with repeats it is only an upper bound (Beirami et al. 2024, arXiv 2401.01879), and a
  tiny model's completions repeat a lot, so the pool's own KL (`best_of_n_kl`) is the one to plot.
  `best_of_n` is the sampler itself: n completions per prompt, keep the top-scored one.
- RL with `rlhf_lab.rl.Trainer(config, reward_fn=proxy)`; `RewardTracker` is a callback that
  measures proxy, gold and d on fresh samples of held-out prompts every few steps, and
  `GoldEarlyStopping` stops the run when a held-out gold signal stops improving and puts back the
  best weights. `TimedReward` counts the seconds the reward model takes inside a step.

Rewards follow the lab's contract (`rlhf_lab.rl.score_completions`): a callable
(prompt, completion, answer, finished) -> float, or an object with `score_batch(...)` (a reward
model scores the whole batch in one forward). A reward designed from parts, a reward model plus
rules, is a `rlhf_lab.tasks.WeightedReward` (each part scored in one batch).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ..rl.losses import masked_sum
from ..rl.rollout import Rollout, next_token_logprobs, sample_and_score, score_completions
from ..sampling import SamplingConfig
from ..train.callbacks import Callback
from ..train.evaluate import completion_budget
from ..train.loop import clone_state
from ..util.device import autocast
from ..util.validation import check_choice, check_number

__all__ = [
    "FIT_FORMS",
    "BestOfNPool",
    "GaoFit",
    "GoldEarlyStopping",
    "PolicyMeasurement",
    "RewardTracker",
    "StepTimeBreakdown",
    "TimedReward",
    "best_of_n",
    "best_of_n_curve",
    "best_of_n_kl",
    "best_of_n_kl_bound",
    "best_of_n_pool",
    "completion_texts",
    "fit_gao",
    "measure_policy",
    "sample_proxy_and_gold",
    "sampled_best_of_n_kl",
    "sequence_kl",
]

FIT_FORMS = ("bon", "rl")


# ----------------------------------------------------------------------------------------------
# KL of best-of-n


def best_of_n_kl_bound(n: int) -> float:
    """KL(best-of-n || base) = log n - (n - 1) / n nats, exact when the n samples are almost surely
    distinct (a continuous score), an upper bound otherwise (Beirami et al. 2024).
    n = 4 -> 0.636, 16 -> 1.835, 64 -> 3.175."""
    check_number("n", n, low=1, integer=True)
    return math.log(n) - (n - 1) / n


def _tie_groups(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For (M,) scores: each item's CDF F(s) = P(score <= s), F(s-) = P(score < s), under the uniform
    distribution over the M items (equal scores form one tie group)."""
    s = scores.double()
    M = s.numel()
    below = (s[None, :] < s[:, None]).sum(1).double()  # (M,) items scoring strictly less
    at_or_below = (s[None, :] <= s[:, None]).sum(1).double()
    return below / M, at_or_below / M, s


def _best_of_n_log_ratio(scores: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(M,) log pi_bon(item) / pi(item) and (M,) pi_bon(item) for best-of-n over the uniform pool.

    The winner's score is <= s with probability F(s)^n, so a tie group (score s) wins with
    probability F(s)^n - F(s-)^n, shared evenly by its members (ties are broken at random):
    ratio = (F^n - F_-^n) / (F - F_-). Without ties, F - F_- = 1/M and the ratio is ~ n F^(n-1)."""
    F_below, F, _ = _tie_groups(scores)
    group_mass = F - F_below  # P(score == s) under the pool
    bon_mass = F.pow(n) - F_below.pow(n)
    ratio = bon_mass / group_mass
    per_item = bon_mass / (group_mass * scores.numel())  # each member's share of its group's mass
    return torch.log(ratio), per_item


def best_of_n_kl(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Exact KL(best-of-n || base) in nats when the base distribution is the pool itself.

    scores: (M,) one prompt's pool, or (prompts, M); returns () or (prompts,). Identical completions
    score the same and fall in one tie group, so a pool with repeats gets the smaller KL it really
    has; a pool of M distinct scores gets log n - (n-1)/n up to a discretisation error O(n/M).
    KL = sum_items pi_bon(item) log(pi_bon(item) / pi(item))."""
    check_number("n", n, low=1, integer=True)
    if scores.dim() == 2:
        return torch.stack([best_of_n_kl(row, n) for row in scores])
    log_ratio, p_bon = _best_of_n_log_ratio(scores, n)
    terms = torch.where(p_bon > 0, p_bon * log_ratio, torch.zeros_like(p_bon))  # 0 log 0 = 0
    return terms.sum()


def sampled_best_of_n_kl(scores: torch.Tensor, n: int, draws: int = 10000,
                         generator: torch.Generator | None = None) -> tuple[float, float]:
    """Monte-Carlo estimate of KL(best-of-n || base) from one pool of scores (M,): draw n items with
    replacement `draws` times, keep the top-scored one, and average the log
    density ratio at the winner. Returns (estimate, its standard error)."""
    check_number("n", n, low=1, integer=True)
    check_number("draws", draws, low=2, integer=True)
    M = scores.numel()
    log_ratio, _ = _best_of_n_log_ratio(scores, n)
    picks = torch.randint(M, (draws, n), generator=generator)  # (draws, n) n samples per draw
    # The first maximum; which of several tied items wins does not matter: they share one ratio.
    winners = picks[torch.arange(draws), torch.argmax(scores.double()[picks], dim=1)]
    values = log_ratio[winners]
    return float(values.mean()), float(values.std() / math.sqrt(draws))


# ----------------------------------------------------------------------------------------------
# sampling, scoring and the KL of the current policy


def completion_texts(tokenizer, rollout: Rollout) -> list[str]:
    """(N,) the decoded completions of a rollout, up to EOS."""
    return [tokenizer.decode_until_eos(ids)[0] for ids in rollout.completion_ids.tolist()]


@torch.no_grad()
def sequence_kl(policy, ref_model, rollout: Rollout, temperature: float = 1.0) -> torch.Tensor:
    """(N,) KL(pi || pi_ref) of each sampled completion's token path, in nats.

    Sum over the completion's tokens of the exact next-token KL, sum_v pi_v (log pi_v - log ref_v):
    by the chain rule its mean over completions sampled from pi is an unbiased estimate of the
    sequence-level KL(pi || pi_ref), with less variance than summing log pi(a) - log ref(a) (k1)."""
    with autocast(rollout.input_ids.device):
        logp = next_token_logprobs(policy, rollout, temperature)  # (N, T, V)
        logq = next_token_logprobs(ref_model, rollout, temperature)
    per_token = (logp.exp() * (logp - logq)).sum(-1)  # (N, T)
    return masked_sum(per_token, rollout.completion_mask, dim=1)


def _mean_and_se(values: torch.Tensor, num_prompts: int) -> tuple[float, float]:
    """Mean and standard error with the prompt as the independent unit (the G samples of a prompt
    are correlated): se = std(prompt means) / sqrt(prompts)."""
    per_prompt = values.double().reshape(num_prompts, -1).mean(1)
    se = float(per_prompt.std() / math.sqrt(num_prompts)) if num_prompts > 1 else float("nan")
    return float(values.double().mean()), se


@dataclass
class PolicyMeasurement:
    """Where a policy stands: proxy and gold reward, KL to the initial policy, on fresh samples.
    Each `_se` is a standard error over prompts."""

    kl: float
    kl_se: float
    proxy: float
    proxy_se: float
    gold: float
    gold_se: float
    accuracy: float  # exact match of the sampled completions
    length: float  # mean completion length in tokens (EOS included)
    finished: float  # fraction that emitted EOS
    completions: list[str] = field(repr=False, default_factory=list)  # (N,) prompt-major
    prompts: list[str] = field(repr=False, default_factory=list)
    # (N,) each completion's gold
    gold_scores: torch.Tensor = field(repr=False, default_factory=lambda: torch.zeros(0))

    @property
    def d(self) -> float:
        """sqrt(KL): Gao et al.'s distance from the initial policy."""
        return math.sqrt(max(self.kl, 0.0))

    def row(self) -> dict:
        return {
            "kl": self.kl,
            "kl_se": self.kl_se,
            "d": self.d,
            "proxy": self.proxy,
            "proxy_se": self.proxy_se,
            "gold": self.gold,
            "gold_se": self.gold_se,
            "accuracy": self.accuracy,
            "length": self.length,
            "finished": self.finished,
        }


@torch.no_grad()
def sample_proxy_and_gold(policy, tokenizer, task, examples: Sequence, proxy, gold, num_generations: int,
                          temperature: float = 1.0, max_new_tokens: int | None = None,
                          seed: int = 0) -> tuple[Rollout, list[str], torch.Tensor]:
    """`num_generations` sampled completions per example (eval mode, a generator seeded with `seed`),
    scored by the proxy (rollout.rewards, one batch) and the gold: (rollout, (N,) texts, (N,) gold)."""
    if len(examples) == 0:
        raise ValueError("examples must not be empty")
    was_training = policy.training
    policy.eval()
    try:
        sampling = SamplingConfig(do_sample=True, temperature=temperature,
                                  max_new_tokens=max_new_tokens or completion_budget(examples))
        generator = torch.Generator(policy.device).manual_seed(seed)
        rollout = sample_and_score(policy, tokenizer, examples, num_generations, sampling, proxy, task,
                                   generator)
    finally:
        policy.train(was_training)
    texts = completion_texts(tokenizer, rollout)
    gold_scores = score_completions(gold, [e.prompt for e in rollout.examples], texts,
                                    [e.answer for e in rollout.examples], rollout.finished.tolist())
    return rollout, texts, gold_scores


@torch.no_grad()
def measure_policy(policy, ref_model, tokenizer, task, examples: Sequence, proxy, gold,
                   num_generations: int = 4, temperature: float = 1.0, max_new_tokens: int | None = None,
                   seed: int = 0) -> PolicyMeasurement:
    """Sample `num_generations` completions per example from `policy` and measure the proxy reward,
    the gold reward, the exact-match accuracy and KL(policy || ref_model) on them.

    The same seed at every call gives common random numbers: two policies measured with the same
    seed differ by what they learned, less by sampling noise."""
    check_number("num_generations", num_generations, low=1, integer=True)
    rollout, texts, gold_scores = sample_proxy_and_gold(
        policy, tokenizer, task, examples, proxy, gold, num_generations, temperature, max_new_tokens, seed
    )
    kl = sequence_kl(policy, ref_model, rollout, temperature).cpu()
    prompts = [e.prompt for e in rollout.examples]
    n = len(examples)
    kl_mean, kl_se = _mean_and_se(kl, n)
    proxy_mean, proxy_se = _mean_and_se(rollout.rewards.cpu(), n)
    gold_mean, gold_se = _mean_and_se(gold_scores, n)
    return PolicyMeasurement(
        kl=kl_mean,
        kl_se=kl_se,
        proxy=proxy_mean,
        proxy_se=proxy_se,
        gold=gold_mean,
        gold_se=gold_se,
        accuracy=float(rollout.correct.mean()),
        length=float(rollout.lengths.float().mean()),
        finished=float(rollout.finished.float().mean()),
        completions=texts,
        prompts=prompts,
        gold_scores=gold_scores,
    )


# ----------------------------------------------------------------------------------------------
# best-of-n


@dataclass
class BestOfNPool:
    """M completions per prompt from one policy, with their proxy and gold scores."""

    prompts: list[str]  # (prompts,)
    completions: list[list[str]]  # (prompts, M)
    proxy: torch.Tensor  # (prompts, M) float64
    gold: torch.Tensor  # (prompts, M) float64
    finished: torch.Tensor  # (prompts, M) bool

    @property
    def size(self) -> int:
        return self.proxy.shape[1]


@torch.no_grad()
def best_of_n_pool(policy, tokenizer, task, examples: Sequence, proxy, gold, pool_size: int = 64,
                   temperature: float = 1.0, max_new_tokens: int | None = None, seed: int = 0) -> BestOfNPool:
    """Sample a pool of `pool_size` completions per example and score every one with the proxy (in
    one batch) and the gold reward."""
    check_number("pool_size", pool_size, low=1, integer=True)
    rollout, texts, gold_scores = sample_proxy_and_gold(
        policy, tokenizer, task, examples, proxy, gold, pool_size, temperature, max_new_tokens, seed
    )
    shape = (len(examples), pool_size)
    return BestOfNPool(
        prompts=[e.prompt for e in examples],
        completions=[texts[i * pool_size:(i + 1) * pool_size] for i in range(len(examples))],
        proxy=rollout.rewards.cpu().double().reshape(shape), gold=gold_scores.double().reshape(shape),
        finished=rollout.finished.cpu().reshape(shape),
    )


def _win_weights(M: int, n: int) -> torch.Tensor:
    """(M,) chance that the k-th lowest of M distinct items is the maximum of a uniformly random
    n-subset: C(k-1, n-1) / C(M, n) (k = 1..M). Sums to 1."""
    k = torch.arange(1, M + 1, dtype=torch.float64)
    log_w = (torch.lgamma(k) - torch.lgamma(k - n + 1) - torch.lgamma(torch.tensor(n, dtype=torch.float64))
             - (math.lgamma(M + 1) - math.lgamma(n + 1) - math.lgamma(M - n + 1)))
    return torch.where(k >= n, log_w.exp(), torch.zeros_like(k))


def _expected_winner_value(proxy: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    """(prompts,) E[value of the proxy's top pick among n samples drawn without replacement from the
    pool] -- an unbiased estimate of best-of-n from the policy itself. Items tied on the proxy share
    their group's mean value (the winner among them is picked at random)."""
    M = proxy.shape[1]
    weights = _win_weights(M, n)
    out = []
    for scores, vals in zip(proxy, values):
        order = torch.argsort(scores, stable=True)
        s, v = scores[order], vals[order].clone()
        for level in torch.unique(s):  # a tie group: every member carries the group's mean value
            members = s == level
            v[members] = v[members].mean()
        out.append((weights * v).sum())
    return torch.stack(out)


def best_of_n_curve(pool: BestOfNPool, ns: Sequence[int]) -> pd.DataFrame:
    """Expected proxy and gold score of best-of-n for each n in `ns` (each <= the pool size), with
    the KL of best-of-n from the pool (`kl`, mean over prompts), d = sqrt(kl), the analytic
    `kl_bound` = log n - (n-1)/n, the gold gain over n = 1, and standard errors over prompts (the
    gain's is paired: the differences on each prompt)."""
    rows = []
    P = pool.proxy.shape[0]
    gold_of_one = pool.gold.mean(1)  # (prompts,) n = 1: the policy itself
    for n in ns:
        check_number("n", n, low=1, high=pool.size, integer=True)
        proxy = _expected_winner_value(pool.proxy, pool.proxy, n)
        gold = _expected_winner_value(pool.proxy, pool.gold, n)
        kl = best_of_n_kl(pool.proxy, n)
        proxy_mean, proxy_se = _mean_and_se(proxy, P)  # one value per prompt
        gold_mean, gold_se = _mean_and_se(gold, P)
        # the gain over n = 1 is paired (same prompts, same pool): its SE is that of the per-prompt
        # differences
        gain, gain_se = _mean_and_se(gold - gold_of_one, P)
        rows.append({"n": n, "kl": float(kl.mean()), "d": math.sqrt(max(float(kl.mean()), 0.0)),
                     "kl_bound": best_of_n_kl_bound(n), "proxy": proxy_mean, "proxy_se": proxy_se,
                     "gold": gold_mean, "gold_se": gold_se, "gold_gain": gain, "gold_gain_se": gain_se})
    return pd.DataFrame(rows)


@torch.no_grad()
def best_of_n(policy, tokenizer, task, examples: Sequence, scorer, n: int, temperature: float = 1.0,
              max_new_tokens: int | None = None, seed: int = 0) -> tuple[list[str], torch.Tensor]:
    """Best-of-n sampling (rejection sampling): n completions per example, scored by `scorer` in one
    batch, the top-scored one kept (the first of equal scores). Returns ((prompts,) completions,
    (prompts,) their scores)."""
    check_number("n", n, low=1, integer=True)
    pool = best_of_n_pool(policy, tokenizer, task, examples, scorer, scorer, n, temperature, max_new_tokens,
                          seed)
    top = pool.proxy.argmax(1)  # (prompts,)
    return [pool.completions[i][int(k)] for i, k in enumerate(top)], pool.proxy[torch.arange(len(top)), top]


# ----------------------------------------------------------------------------------------------
# Gao et al.'s functional forms


@dataclass
class GaoFit:
    """A least-squares fit of R(d) = d (alpha - beta d) ("bon") or d (alpha - beta log d) ("rl")."""

    form: str
    alpha: float
    beta: float
    r_squared: float

    def __call__(self, d) -> np.ndarray:
        d = np.asarray(d, dtype=float)
        # d (alpha - beta d) or d (alpha - beta log d)
        return self.alpha * d - self.beta * _second_feature(self.form, d)

    @property
    def peak_d(self) -> float:
        """The d where the fitted gain is largest (inf when beta <= 0: it never turns over)."""
        if self.beta <= 0:
            return math.inf
        if self.form == "bon":
            return self.alpha / (2 * self.beta)  # d/dd [alpha d - beta d^2] = 0
        # d/dd [alpha d - beta d log d] = alpha - beta (log d + 1) = 0
        return math.exp(self.alpha / self.beta - 1)

    @property
    def peak_value(self) -> float:
        return float(self(self.peak_d)) if math.isfinite(self.peak_d) else math.inf


def _second_feature(form: str, d: np.ndarray) -> np.ndarray:
    """The beta column of the design matrix: d^2 (bon) or d log d (rl, -> 0 as d -> 0)."""
    if form == "bon":
        return d * d
    safe = np.where(d > 0, d, 1.0)
    return np.where(d > 0, d * np.log(safe), 0.0)


def fit_gao(d, gain, form: str) -> GaoFit:
    """Fit Gao et al.'s form to points (d_i, gain_i) by linear least squares (both forms are linear in
    alpha and beta): gain ~ alpha * d - beta * f(d), f = d^2 (bon) or d log d (rl). `gain` is the
    reward minus the initial policy's (the forms pass through R(0) = 0)."""
    check_choice("form", form, FIT_FORMS)
    d, gain = np.asarray(d, dtype=float), np.asarray(gain, dtype=float)
    if d.shape != gain.shape or d.ndim != 1:
        raise ValueError(f"d and gain must be 1-D of the same length, got shapes {d.shape} and {gain.shape}")
    if len(d) < 2:
        raise ValueError(f"fit_gao needs at least 2 points, got {len(d)}")
    if (d < 0).any():
        raise ValueError("d = sqrt(KL) must be >= 0")
    design = np.stack([d, -_second_feature(form, d)], axis=1)  # gain = [d, -f(d)] @ [alpha, beta]
    (alpha, beta), *_ = np.linalg.lstsq(design, gain, rcond=None)
    residual = gain - design @ np.array([alpha, beta])
    total = ((gain - gain.mean()) ** 2).sum()
    r_squared = 1.0 - float((residual ** 2).sum() / total) if total > 0 else float("nan")
    return GaoFit(form=form, alpha=float(alpha), beta=float(beta), r_squared=r_squared)


# ----------------------------------------------------------------------------------------------
# during RL: record, stop early, time the reward model


class RewardTracker(Callback):
    """Measures the trainer's policy every `every` steps (and before the first step) on fresh samples
    of held-out prompts: proxy reward, gold reward and d = sqrt(KL(pi || pi_init)), with standard
    errors (`measure_policy`). `history` is one row per measurement.

    proxy: default the trainer's own reward (`trainer.reward_fn`, unwrapped from a `TimedReward`). examples:
    default the first
    `num_prompts` of the trainer's held-out test split. pi_init is `trainer.ref_model`, the frozen
    copy of the policy the trainer started from."""

    def __init__(self, gold, proxy=None, examples: Sequence | None = None, num_prompts: int = 64,
                 num_generations: int = 4, every: int = 5, seed: int = 1234) -> None:
        check_number("num_prompts", num_prompts, low=1, integer=True)
        check_number("num_generations", num_generations, low=1, integer=True)
        check_number("every", every, low=1, integer=True)
        self.gold, self.proxy, self.examples = gold, proxy, examples
        self.num_prompts, self.num_generations = num_prompts, num_generations
        self.every, self.seed = every, seed
        self.rows: list[dict] = []
        self.completions: dict[int, list[str]] = {}  # step -> the completions measured there
        self.gold_scores: dict[int, torch.Tensor] = {}  # step -> (N,) their gold scores, prompt-major

    def measure(self, trainer) -> PolicyMeasurement:
        examples = self.examples if self.examples is not None else trainer.test_examples[: self.num_prompts]
        proxy = self.proxy if self.proxy is not None else trainer.reward_fn
        if isinstance(proxy, TimedReward):  # measuring is not training: keep it out of the step's timing
            proxy = proxy.reward_fn
        result = measure_policy(
            trainer.policy,
            trainer.ref_model,
            trainer.tokenizer,
            trainer.task,
            examples,
            proxy,
            self.gold,
            self.num_generations,
            trainer.config.temperature,
            trainer.max_completion_length,
            self.seed,
        )
        self.rows.append({"step": trainer.step, **result.row()})
        self.completions[trainer.step] = result.completions
        self.gold_scores[trainer.step] = result.gold_scores
        return result

    def gold_change(self, from_step: int, to_step: int) -> tuple[float, float]:
        """Gold at `to_step` minus gold at `from_step`, with its paired standard error: both were
        measured on the same prompts (and sampling seed), so the per-prompt differences are the
        independent units, and what the prompts have in common (easy or hard sums) cancels."""
        for step in (from_step, to_step):
            if step not in self.gold_scores:
                raise ValueError(f"no measurement at step {step}; measured steps: {sorted(self.gold_scores)}")
        change = self.gold_scores[to_step].double() - self.gold_scores[from_step].double()
        # prompt-major: G samples per prompt
        return _mean_and_se(change, change.numel() // self.num_generations)

    def on_train_begin(self, trainer) -> None:
        if not self.rows or self.rows[-1]["step"] != trainer.step:
            self.measure(trainer)

    def on_step_end(self, trainer, metrics: dict, distributions=None) -> None:
        if trainer.step % self.every == 0:
            self.measure(trainer)

    @property
    def history(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


class GoldEarlyStopping(RewardTracker):
    """Early stopping on a held-out gold signal: every `every` steps, measure the gold reward on
    `examples` (keep them apart from the prompts you report on); remember the best weights; after
    `patience` measurements without an improvement larger than `min_delta`, ask the trainer to stop
    (`trainer.request_stop`). When training ends, the best weights are put back
    (restore_best=True), so the policy is the one a periodic human evaluation would have kept."""

    def __init__(self, gold, examples: Sequence | None = None, patience: int = 3, min_delta: float = 0.0,
                 restore_best: bool = True, **tracker) -> None:
        super().__init__(gold, examples=examples, **tracker)
        check_number("patience", patience, low=1, integer=True)
        check_number("min_delta", min_delta, low=0)
        self.patience, self.min_delta, self.restore_best = patience, min_delta, restore_best
        self.best_gold, self.best_step, self.best_state, self.waited = -math.inf, None, None, 0

    def measure(self, trainer) -> PolicyMeasurement:
        result = super().measure(trainer)
        if result.gold > self.best_gold + self.min_delta:
            self.best_gold, self.best_step, self.waited = result.gold, trainer.step, 0
            self.best_state = clone_state(trainer.policy.state_dict())
        elif trainer.step != self.best_step:
            self.waited += 1
        return result

    def on_step_end(self, trainer, metrics: dict, distributions=None) -> None:
        super().on_step_end(trainer, metrics, distributions)
        if self.waited >= self.patience:
            trainer.request_stop(f"gold_plateau (best at step {self.best_step})")

    def on_train_end(self, trainer) -> None:
        if self.restore_best and self.best_state is not None and self.best_step != trainer.step:
            trainer.policy.load_state_dict(self.best_state)


class TimedReward:
    """Wraps a reward (a callable or an object with `score_batch`) and counts the seconds spent in it,
    to put the reward model's scoring time next to generation and the update. Pass it to the trainer
    instead of the reward itself: `Trainer(config, reward_fn=TimedReward(reward_model))`."""

    def __init__(self, reward_fn) -> None:
        self.reward_fn = reward_fn
        self.seconds = 0.0
        self.calls = 0
        self.completions = 0
        # error messages about a bad reward name the wrapped one
        self.__qualname__ = f"TimedReward({getattr(reward_fn, '__qualname__', type(reward_fn).__name__)})"

    def score_batch(self, prompts, completions, answers, finished) -> torch.Tensor:
        start = time.perf_counter()
        values = score_completions(self.reward_fn, prompts, completions, answers, finished)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        self.completions += len(completions)
        return values


class StepTimeBreakdown(Callback):
    """Per-step seconds in three parts, from the trainer's own timings and a `TimedReward`:
    `reward_scoring` (inside the rollout), `sampling_and_forwards` (the rest of the rollout:
    generation and the no-grad reference / old-policy / critic forwards) and `update`."""

    def __init__(self, timed_reward: TimedReward) -> None:
        self.timed_reward = timed_reward
        self.rows: list[dict] = []
        self._seen = 0.0

    def on_step_end(self, trainer, metrics: dict, distributions=None) -> None:
        scoring = self.timed_reward.seconds - self._seen
        self._seen = self.timed_reward.seconds
        self.rows.append({"step": metrics["step"], "reward_scoring": scoring,
                          "sampling_and_forwards": metrics["rollout_time"] - scoring,
                          "update": metrics["update_time"], "step_time": metrics["step_time"]})

    @property
    def history(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)
