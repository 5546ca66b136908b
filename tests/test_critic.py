"""PPO's critic: a head on the policy's trunk, a separate model, and the prefix-likelihood critic that
judges the tokens written so far (rlhf_lab/rl/ppo.py)."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_lab.rl import Trainer, make_config, policy_forward
from rlhf_lab.train.schedule import learning_rate_at

SMALL = dict(prompts_per_step=4, num_generations=4, eval_every=0, eval_examples=8, n_train=200, n_test=40,
             steps=2, seed=0)
JUDGE = dict(critic="separate", critic_init="addition_sft", critic_readout="prefix_likelihood",
             critic_learning_rate=5e-3)


def trainer(**overrides) -> Trainer:
    return Trainer(make_config("ppo", {**SMALL, **overrides}))


def test_prefix_likelihood_is_the_judges_probability_of_the_prefix_times_a_sigmoid():
    t = trainer(**JUDGE)
    rollout = t.collect_rollout()
    critic = t.algorithm.critic
    with torch.no_grad():
        values = t.algorithm.critic_values(rollout, None)
        out = policy_forward(critic, rollout, 1.0, with_values=True, share_prompts=True)
    mask = rollout.completion_mask
    logprobs = out.logprobs * mask
    by_hand = torch.stack([torch.exp(logprobs[:, :k].sum(1)) for k in range(mask.shape[1])], 1)
    by_hand = by_hand * torch.sigmoid(out.values)
    # the cumulative sum adds the same terms in the same order as the prefix sums above, up to rounding
    torch.testing.assert_close(values, by_hand, rtol=8 * torch.finfo(torch.float32).eps * mask.shape[1],
                               atol=0)
    # before any token the prefix is empty (probability 1) and the zero-initialised head gives sigmoid(0)
    assert torch.equal(values[:, 0], torch.full_like(values[:, 0], 0.5))
    assert (values >= 0).all() and (values <= 1).all()


def test_the_judge_stays_frozen_and_only_its_head_learns():
    t = trainer(**JUDGE)
    before = {name: p.detach().clone() for name, p in t.algorithm.critic.named_parameters()}
    t.train()
    after = dict(t.algorithm.critic.named_parameters())
    head = {name for name in before if name.startswith("value_head.")}
    assert head and all(not torch.equal(before[n], after[n]) for n in head)
    assert all(torch.equal(before[n], after[n]) for n in before if n not in head)
    assert {id(p) for p in t.trainable_parameters()} >= {id(p) for n, p in after.items() if n in head}


def test_the_critic_learns_at_its_own_rate_through_the_warm_up():
    t = trainer(**JUDGE, warmup_steps=4)
    t.train_step()
    policy, critic = t.optimizer.param_groups
    assert policy["lr"] == learning_rate_at(1, t.config.learning_rate, 4)
    assert critic["lr"] == learning_rate_at(1, 5e-3, 4)
    assert len(critic["params"]) == 2  # the head's weight and bias
    default = trainer()
    assert len(default.optimizer.param_groups) == 1  # one group when no rate of its own is asked for


@pytest.mark.parametrize("settings, field", [
    ({"critic_init": "addition_sft"}, "critic_init"),
    ({"critic_readout": "prefix_likelihood"}, "critic_readout"),
    ({"critic_learning_rate": 0.0}, "critic_learning_rate"),
    ({"critic_readout": "judge", "critic": "separate"}, "critic_readout"),
])
def test_critic_settings_that_cannot_work_name_the_field(settings, field):
    with pytest.raises(ValueError, match=field):
        make_config("ppo", settings)


def test_a_critic_that_can_judge_the_prefix_explains_the_returns():
    """The lesson of notebook 06: the head on the policy's trunk explains nothing of the 0/1 returns,
    the frozen judge's prefix likelihood explains most of it within a few steps."""
    common = dict(steps=8, eval_every=0, seed=0)
    judge = Trainer(make_config("ppo", common, **JUDGE)).train()
    head = Trainer(make_config("ppo", common)).train()
    assert judge["explained_variance"].iloc[-4:].mean() > 0.3
    assert head["explained_variance"].iloc[-4:].mean() < 0.1
    assert not math.isnan(judge["explained_variance_mc"].iloc[-1])
