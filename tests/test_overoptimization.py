"""Over-optimisation tools: best-of-n and its KL, Gao et al.'s fits, the RL recording callbacks."""

import math

import numpy as np
import pytest
import torch

from rlhf_lab.preferences.overoptimization import (
    BestOfNPool,
    GoldEarlyStopping,
    RewardTracker,
    StepTimeBreakdown,
    TimedReward,
    best_of_n,
    best_of_n_curve,
    best_of_n_kl,
    best_of_n_kl_bound,
    fit_gao,
    measure_policy,
    sampled_best_of_n_kl,
    sequence_kl,
)
from rlhf_lab.rl import Trainer, encode_rollout, make_config
from rlhf_lab.tasks.rewards import WeightedReward, correctness_reward, partial_credit_reward

EPS32 = torch.finfo(torch.float32).eps


# ----------------------------------------------------------------------------------------------
# KL of best-of-n


def test_kl_bound_matches_the_spec_values():
    # log n - (n-1)/n, values from Gao et al. 2022 / the spec, to the 3 decimals they are given with
    for n, expected in [(1, 0.0), (4, 0.636), (16, 1.835), (64, 3.175)]:
        assert best_of_n_kl_bound(n) == pytest.approx(expected, abs=5e-4)


@pytest.mark.parametrize("n", [4, 16])
def test_pool_kl_and_sampled_estimate_agree_with_the_formula(n):
    """Distinct (continuous) scores: the exact KL over a pool of M equals log n - (n-1)/n up to the
    discretisation error of the pool, and the Monte-Carlo estimate agrees within its standard error."""
    M = 2000
    scores = torch.randn(M, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    bound = best_of_n_kl_bound(n)
    exact = float(best_of_n_kl(scores, n))
    # The pool's uniform distribution vs the continuum: sum of p log(p M) vs its integral; the
    # difference is O(n log M / M) (a Riemann sum of n u^(n-1) log(n u^(n-1))), ~0.02 here.
    assert abs(exact - bound) < 2 * n * math.log(M) / M
    estimate, se = sampled_best_of_n_kl(scores, n, draws=10000, generator=torch.Generator().manual_seed(1))
    assert se > 0
    # 4 standard errors: a false failure has probability ~6e-5 under the normal approximation
    assert abs(estimate - exact) < 4 * se


def test_pool_kl_with_repeats_is_below_the_formula():
    """Repeated completions tie on the score, and the KL falls below log n - (n-1)/n (an upper bound)."""
    scores = torch.tensor([0.0] * 50 + [1.0] * 30 + [2.0] * 20, dtype=torch.float64)
    n = 8
    # Three outcomes with base masses q = (0.5, 0.3, 0.2) and CDF F = (0.5, 0.8, 1): best-of-n masses F^n -
    # F_-^n
    q = np.array([0.5, 0.3, 0.2])
    F = np.cumsum(q)
    p = F ** n - np.concatenate([[0.0], F[:-1]]) ** n
    by_hand = float((p * np.log(p / q)).sum())
    assert float(best_of_n_kl(scores, n)) == pytest.approx(by_hand, rel=1e-9)
    assert by_hand < best_of_n_kl_bound(n)
    # all equal: best-of-n is the base policy, KL = 0
    assert float(best_of_n_kl(torch.zeros(10, dtype=torch.float64), n)) == pytest.approx(0.0, abs=1e-12)


def test_best_of_n_curve_is_the_expected_top_pick():
    """Expected gold of the proxy's pick among n, from the pool: by hand for n = 1, 2, M."""
    proxy = torch.tensor([[0.1, 0.7, 0.4]], dtype=torch.float64)
    gold = torch.tensor([[1.0, 0.0, 2.0]], dtype=torch.float64)
    pool = BestOfNPool(prompts=["p"], completions=[["a", "b", "c"]], proxy=proxy, gold=gold,
                       finished=torch.ones(1, 3, dtype=torch.bool))
    curve = best_of_n_curve(pool, [1, 2, 3]).set_index("n")
    assert curve.loc[1, "gold"] == pytest.approx(1.0)  # mean of the pool
    # pairs {a,b}->b (0), {a,c}->c (2), {b,c}->b (0): mean 2/3
    assert curve.loc[2, "gold"] == pytest.approx(2 / 3)
    assert curve.loc[3, "gold"] == pytest.approx(0.0)  # the proxy's favourite, b
    assert curve.loc[3, "proxy"] == pytest.approx(0.7)
    assert curve.loc[1, "kl"] == pytest.approx(0.0, abs=1e-12)
    assert curve.loc[3, "gold_gain"] == pytest.approx(-1.0)  # 0 for the proxy's pick against a pool mean of 1
    assert curve.loc[1, "gold_gain"] == pytest.approx(0.0, abs=1e-12)  # float64 rounding of a 3-term sum


# ----------------------------------------------------------------------------------------------
# Gao et al.'s fits


@pytest.mark.parametrize("form,alpha,beta", [("bon", 0.8, 0.3), ("rl", 0.5, 0.25)])
def test_fit_recovers_known_parameters(form, alpha, beta):
    d = np.linspace(0.0, 4.0, 40)
    f = d ** 2 if form == "bon" else np.where(d > 0, d * np.log(np.where(d > 0, d, 1)), 0.0)
    clean = alpha * d - beta * f
    fit = fit_gao(d, clean, form)
    # Exact data: only rounding, ~ eps64 * condition number; 1e-8 leaves a wide margin
    assert fit.alpha == pytest.approx(alpha, abs=1e-8) and fit.beta == pytest.approx(beta, abs=1e-8)
    assert fit.r_squared == pytest.approx(1.0, abs=1e-10)
    # With noise of std 0.02 the least-squares error on alpha/beta is ~0.01 (40 points): allow 5x
    noisy = clean + np.random.default_rng(0).normal(0.0, 0.02, size=d.shape)
    fit = fit_gao(d, noisy, form)
    assert fit.alpha == pytest.approx(alpha, abs=0.05) and fit.beta == pytest.approx(beta, abs=0.05)
    peak = alpha / (2 * beta) if form == "bon" else math.exp(alpha / beta - 1)
    assert fit.peak_d == pytest.approx(peak, rel=0.2)
    assert float(fit(0.0)) == 0.0


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError, match="form"):
        fit_gao([0.0, 1.0], [0.0, 1.0], "ppo")
    with pytest.raises(ValueError, match="d = sqrt"):
        fit_gao([-1.0, 1.0], [0.0, 1.0], "rl")


# ----------------------------------------------------------------------------------------------
# the policy's KL, best-of-n sampling, and RL through the public pipeline


@pytest.fixture(scope="module")
def trainer():
    config = make_config("grpo", prompts_per_step=4, num_generations=4, steps=2, eval_every=0,
                         n_train=64, n_test=16, eval_examples=16, learning_rate=1e-3)
    return Trainer(config, reward_fn=partial_credit_reward)


def test_sequence_kl_is_zero_against_itself_and_positive_otherwise(trainer):
    import copy

    rollout = encode_rollout(trainer.tokenizer, ["12+34=", "50+7="], ["64", "75"])
    same = sequence_kl(trainer.ref_model, trainer.ref_model, rollout)
    assert torch.equal(same, torch.zeros_like(same))  # identical models: log p - log q is exactly 0
    moved = copy.deepcopy(trainer.ref_model)
    with torch.no_grad():
        moved.lm_head.weight.mul_(1.5)  # sharper next-token distributions
    kl = sequence_kl(moved, trainer.ref_model, rollout)
    # By hand: per position sum_v p (log p - log q), summed over the 3 tokens (2 digits + EOS)
    from rlhf_lab.rl import next_token_logprobs

    logp = next_token_logprobs(moved, rollout, dtype=torch.float64)
    logq = next_token_logprobs(trainer.ref_model, rollout, dtype=torch.float64)
    by_hand = ((logp.exp() * (logp - logq)).sum(-1) * rollout.completion_mask).sum(1)
    assert (kl > 0).all()
    # float32 vs float64 on sums of ~V terms of size O(1): a few hundred eps32 covers it
    assert torch.allclose(kl.double(), by_hand, rtol=0, atol=300 * EPS32 * float(by_hand.abs().max() + 1))
    start = measure_policy(trainer.ref_model, trainer.ref_model, trainer.tokenizer, trainer.task,
                           trainer.test_examples[:4], partial_credit_reward, correctness_reward, 2)
    assert start.kl == 0.0 and start.d == 0.0


def test_best_of_n_keeps_the_top_scored_sample(trainer):
    examples = trainer.test_examples[:6]
    scorer = lambda prompt, completion, answer, finished: float(len(completion))  # noqa: E731
    chosen, scores = best_of_n(trainer.policy, trainer.tokenizer, trainer.task, examples, scorer, n=8, seed=3)
    pool = best_of_n(trainer.policy, trainer.tokenizer, trainer.task, examples, scorer, n=8, seed=3)
    assert chosen == pool[0]  # same seed, same pool
    from rlhf_lab.preferences.overoptimization import best_of_n_pool

    full = best_of_n_pool(trainer.policy, trainer.tokenizer, trainer.task, examples, scorer, scorer, 8,
                          seed=3)
    for i, text in enumerate(chosen):
        assert scores[i] == full.proxy[i].max()
        assert len(text) == max(len(c) for c in full.completions[i])


def test_tracker_and_timer_record_through_the_public_pipeline():
    """RL against a proxy (partial credit) with the gold reward (exact match) watched by callbacks."""
    timed = TimedReward(partial_credit_reward)
    tracker = RewardTracker(gold=correctness_reward, num_prompts=4, num_generations=2, every=1)
    breakdown = StepTimeBreakdown(timed)
    config = make_config("grpo", prompts_per_step=4, num_generations=4, steps=2, eval_every=0,
                         n_train=64, n_test=16, eval_examples=16, learning_rate=3e-3)
    trainer = Trainer(config, reward_fn=timed, callbacks=[tracker, breakdown])
    trainer.train()
    history = tracker.history
    assert list(history["step"]) == [0, 1, 2]
    assert history.loc[0, "kl"] == 0.0  # the policy is pi_init before the first step
    assert (history.loc[1:, "kl"] > 0).all()  # an update at lr 3e-3 moves it
    assert ((history["gold"] >= 0) & (history["gold"] <= 1)).all()
    assert np.allclose(history["d"], np.sqrt(history["kl"]))
    # the proxy the tracker reports is the trainer's reward: partial credit >= exact match
    assert (history["proxy"] >= history["gold"] - 1e-12).all()
    # the paired change is the mean of per-completion differences on the same prompts: the difference of the
    # two means (gold in [0, 1], float64 sums of 8 values: rounding ~1e-15, hence 1e-12)
    change, se = tracker.gold_change(0, 2)
    assert change == pytest.approx(history.loc[2, "gold"] - history.loc[0, "gold"], abs=1e-12)
    assert len(tracker.gold_scores[2]) == 4 * 2 and se >= 0
    with pytest.raises(ValueError, match="step 7"):
        tracker.gold_change(0, 7)
    assert timed.calls == 2 and timed.completions == 2 * 16
    times = breakdown.history
    assert len(times) == 2 and (times["reward_scoring"] > 0).all()
    parts = times["reward_scoring"] + times["sampling_and_forwards"] + times["update"]
    assert np.allclose(parts, times["step_time"], rtol=1e-6, atol=1e-3)


def test_gold_early_stopping_stops_and_restores_the_best_weights():
    # A gold signal that only gets worse: the best weights are those of step 0
    calls = []

    def falling_gold(prompt, completion, answer, finished):
        return -float(len(calls))

    class CountingStop(GoldEarlyStopping):
        def measure(self, trainer):
            calls.append(trainer.step)
            return super().measure(trainer)

    config = make_config("grpo", prompts_per_step=4, num_generations=4, steps=20, eval_every=0,
                         n_train=64, n_test=16, eval_examples=16, learning_rate=3e-3)
    trainer = Trainer(config, reward_fn=partial_credit_reward)
    start = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    stopper = CountingStop(gold=falling_gold, examples=trainer.test_examples[-4:], patience=2,
                           num_prompts=4, num_generations=1, every=1)
    trainer.add_callback(stopper)
    trainer.train()
    assert trainer.step == 2 and trainer.stop_reason.startswith("gold_plateau")
    assert stopper.best_step == 0
    for name, value in trainer.policy.state_dict().items():
        assert torch.equal(value, start[name]), name


def test_settings_are_validated():
    with pytest.raises(ValueError, match="every"):
        RewardTracker(gold=correctness_reward, every=0)
    with pytest.raises(ValueError, match="patience"):
        GoldEarlyStopping(gold=correctness_reward, patience=0)
    with pytest.raises(ValueError, match="n must"):
        best_of_n_kl_bound(0)


class CountingScorer:
    """A stand-in reward model: scores a batch through `score_batch` (number of 3s in the completion)
    and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def score_batch(self, prompts, completions, answers, finished):
        self.calls += 1
        return torch.tensor([float(c.count("3")) for c in completions])


def test_weighted_reward_sums_a_batch_scorer_and_rules():
    """A designed reward (interview Q24): a reward model's score plus rules, each part weighted; the
    reward model part is scored once per batch, not once per completion."""
    length = lambda prompt, completion, answer, finished: float(len(completion))  # noqa: E731
    scorer = CountingScorer()
    reward = WeightedReward({"preference": 2.0, "correct": 1.0, "length": -0.25},
                            rewards={"preference": scorer, "correct": correctness_reward, "length": length})
    values = reward.score_batch(["1+2=", "1+2="], ["3", "333"], ["3", "3"], [True, True])
    assert values == [2.0 * 1 + 1.0 - 0.25, 2.0 * 3 + 0.0 - 0.75]
    assert scorer.calls == 1
    assert reward.breakdown("1+2=", "33", "3") == {"preference": 2.0, "correct": 0.0, "length": 2.0}
    assert reward("1+2=", "33", "3") == 2.0 * 2 + 0.0 - 0.5
    with pytest.raises(ValueError, match="length"):
        WeightedReward({"length": float("nan")}, rewards={"length": length})
