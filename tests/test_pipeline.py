"""The public RL pipeline: the phases called one by one equal the loop, rewards plug in, the loop
names no algorithm, and a new algorithm plugs in through the hooks alone."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
import torch

import rlhf_lab.rl.trainer as trainer_module
from rlhf_lab.model import LlamaModel
from rlhf_lab.rl import (
    ALGORITHMS,
    GRPO,
    PolicyGradient,
    RLConfig,
    Trainer,
    encode_rollout,
    make_config,
    policy_forward,
)
from rlhf_lab.sft import lab_model_config
from rlhf_lab.text.tokenizer import CharTokenizer

TOK = CharTokenizer()
SMALL = dict(prompts_per_step=4, num_generations=4, eval_every=0, eval_examples=8, n_train=200, n_test=40, steps=2)


def tiny_model() -> LlamaModel:
    torch.manual_seed(0)
    return LlamaModel(lab_model_config(TOK, hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                                       initializer_range=0.5))


def count_ones(prompt, completion, reference, finished=True):
    return float(completion.count("1"))


def trainer_for(algo="grpo", **kwargs) -> Trainer:
    reward_fn = kwargs.pop("reward_fn", count_ones)
    return Trainer(make_config(algo, **{**SMALL, **kwargs}), model=tiny_model(), tokenizer=TOK, reward_fn=reward_fn)


def test_trainer_names_no_algorithm():
    """The loop must not know the methods: no algorithm name, no method-specific config field."""
    source = inspect.getsource(trainer_module).lower()
    for name in ALGORITHMS:
        assert not re.search(rf"\b{name}\b", source), f"trainer.py names the algorithm {name!r}"
    for name in ("dapo", "dr_grpo", "getattr(", "separate\""):
        assert name not in source, f"trainer.py mentions {name!r}"
    shared = {f.name for f in dataclasses.fields(RLConfig)}
    specific = {f.name for algo in ALGORITHMS.values() for f in dataclasses.fields(algo.config_class)} - shared
    assert specific, "the algorithms' configs should add fields of their own"
    for name in sorted(specific):  # read from the config: c.beta, config.beta (getattr is refused above)
        pattern = rf"\b(c|config|self\.config)\.{name}\b"
        assert not re.search(pattern, source), f"trainer.py reads the method-specific field {name!r}"


@pytest.mark.parametrize("algo, overrides", [("grpo", {}), ("ppo", {}), ("gspo", {"num_minibatches": 2}),
                                             ("remax", {}), ("dapo", {})])
def test_phases_one_by_one_equal_train_step(algo, overrides):
    by_hand, looped = trainer_for(algo, **overrides), trainer_for(algo, **overrides)
    for _ in range(2):
        rollout = by_hand.collect_rollout()
        by_hand.algorithm.compute_advantages(rollout)
        stats = by_hand.update(rollout)
        by_hand.algorithm.after_step(stats.metrics())
        by_hand.step += 1
        looped.train_step()
    for (name, a), b in zip(by_hand.policy.state_dict().items(), looped.policy.state_dict().values()):
        assert torch.equal(a, b), name


def test_reward_fn_is_passed_in_and_sees_every_completion():
    seen = []

    def reward(prompt, completion, reference, finished):
        seen.append((prompt, completion))
        return 1.0

    trainer = trainer_for(reward_fn=reward)
    rollout = trainer.collect_rollout()
    assert len(seen) == len(rollout) == 16 and (rollout.rewards == 1).all()
    assert trainer.reward_fn is reward
    with pytest.raises(AttributeError):
        trainer.reward_fn = count_ones  # not patched in: passed to the constructor


def test_batched_reward_model_interface():
    class LengthModel:
        """A stand-in for a learned reward model: scores the whole batch at once."""

        calls = 0

        def score_batch(self, prompts, completions, answers, finished):
            self.calls += 1
            return torch.tensor([float(len(c)) for c in completions])

    model = LengthModel()
    rollout = trainer_for(reward_fn=model).collect_rollout()
    assert model.calls == 1
    texts = [TOK.decode_until_eos(row)[0] for row in rollout.completion_ids.tolist()]
    assert rollout.rewards.tolist() == [float(len(t)) for t in texts]


@pytest.mark.parametrize("bad", [None, "1.0", [1.0]])
def test_reward_of_the_wrong_type_names_the_function(bad):
    def broken_reward(prompt, completion, reference, finished):
        return bad

    with pytest.raises(TypeError, match="broken_reward must return a number"):
        trainer_for(reward_fn=broken_reward).collect_rollout()


def test_loss_and_gradient_changes_nothing_and_matches_backward():
    trainer = trainer_for("grpo")
    rollout = trainer.collect_rollout()
    trainer.algorithm.compute_advantages(rollout)
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    result = trainer.loss_and_gradient(rollout, on_policy=True)
    assert all(torch.equal(v, before[k]) for k, v in trainer.policy.state_dict().items())
    # the same gradient by hand: forward, the algorithm's loss, backward
    policy = policy_forward(trainer.policy, rollout, trainer.config.temperature)
    loss, _ = trainer.algorithm.loss(rollout, policy)  # on-policy: pi_old = pi_theta.detach()
    trainer.optimizer.zero_grad()
    loss.backward()
    by_hand = torch.cat([p.grad.flatten() for p in trainer.trainable_parameters()])
    torch.testing.assert_close(result.gradient, by_hand)
    assert result.gradient.norm() > 0 and result.loss == pytest.approx(loss.item())


def test_encode_rollout_scores_given_text_like_the_sampler():
    trainer = trainer_for("grpo")
    sampled = trainer.collect_rollout()
    texts = [TOK.decode_until_eos(row)[0] for row in sampled.completion_ids.tolist()]
    again = encode_rollout(TOK, [e.prompt for e in sampled.examples], texts, finished=sampled.finished.tolist())
    # an untrained model also samples special tokens, which decoding drops: compare the rows that round-trip
    width = again.completion_ids.shape[1]
    same = [i for i in range(len(texts)) if torch.equal(again.completion_ids[i] * again.completion_mask[i].long(),
                                                         (sampled.completion_ids[i] * sampled.completion_mask[i].long())[:width])]
    assert len(same) >= 4, "too few completions round-trip through text to compare"
    rows = torch.tensor(same)
    with torch.no_grad():
        a = policy_forward(trainer.policy, sampled.select(rows), 1.0).logprobs[:, :width]
        b = policy_forward(trainer.policy, again.select(rows), 1.0).logprobs
    mask = again.completion_mask[rows].bool()
    # Same tokens, same positions; only the prompts' left padding may differ, which changes the order of
    # the attention sums (a few dozen terms). fp32 rounding then moves a log-prob by a few eps times the
    # scale of the logits: 100 eps x scale bounds that with room, and a wrong token or shift is off by ~1.
    scale = a[mask].abs().max().clamp(min=1.0)
    torch.testing.assert_close(b[mask], a[mask], rtol=0, atol=100 * torch.finfo(torch.float32).eps * scale)


class ZeroAdvantage(PolicyGradient):
    """A method the package does not have, plugged in from outside: every advantage is 0."""

    name = "zero"

    def outcome_advantages(self, rollout):
        return torch.zeros_like(rollout.rewards)


def test_a_new_algorithm_plugs_in_through_the_hooks():
    config = make_config("grpo", **SMALL)
    trainer = Trainer(config, model=tiny_model(), tokenizer=TOK, reward_fn=count_ones,
                      algorithm=ZeroAdvantage(config))
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    history = trainer.train()
    assert (history["grad_norm"].iloc[1:] == 0).all()  # no advantage, no gradient...
    assert all(torch.equal(v, before[k]) for k, v in trainer.policy.state_dict().items())  # ...no change


def test_grpo_advantage_is_the_only_difference_from_the_base():
    # GRPO, REINFORCE, RLOO and ReMax share the loss: none of them overrides it
    for algo in ("grpo", "rloo", "reinforce", "remax", "gspo"):
        assert ALGORITHMS[algo].loss is PolicyGradient.loss, algo
    assert issubclass(ALGORITHMS["gspo"], GRPO) and not issubclass(ALGORITHMS["reinforce"], GRPO)


def test_held_out_split_and_its_standard_error():
    from rlhf_lab.train.evaluate import standard_error

    trainer = trainer_for("grpo")
    assert len(trainer.test_examples) == SMALL["n_test"]
    assert trainer.eval_examples == trainer.test_examples[: SMALL["eval_examples"]]
    assert not {e.prompt for e in trainer.test_examples} & {e.prompt for e in trainer.train_examples}
    assert standard_error(0.5, 100) == pytest.approx(0.05) and standard_error(1.0, 100) == 0.0
