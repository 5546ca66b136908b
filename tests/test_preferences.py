"""Preference data, annotator agreement and the Bradley-Terry reward model (rlhf_lab.preferences)."""

import math
import random

import pytest
import torch

from rlhf_lab.checkpoints import load_checkpoint
from rlhf_lab.preferences import (
    Annotator,
    Comparison,
    RewardConfig,
    RewardEnsemble,
    RewardModel,
    RewardTrainer,
    accuracy_ceiling,
    bradley_terry_loss,
    cohen_kappa,
    fleiss_kappa,
    gold_reward,
    label_comparisons,
    load_preferences,
    make_preference_data,
    orient,
    pairwise_accuracy,
    rating_counts,
    read_preferences,
    save_preferences,
)

EPS32 = torch.finfo(torch.float32).eps

# ------------------------------------------------------------------------------- Bradley-Terry loss


def test_bradley_terry_loss_spec_vector():
    # spec: r_w = 1, r_l = 0, m = 0 -> log(1 + e^-1) = 0.31326. Tolerance: a few fp32 ulps of the value.
    loss = bradley_terry_loss(torch.tensor([1.0]), torch.tensor([0.0]))
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-1)), rel=8 * EPS32)
    assert loss.item() == pytest.approx(0.31326, abs=5e-6)


def test_bradley_terry_loss_margin_centring_and_mean():
    # margin 1 on r_w - r_l = 1 -> -log sigmoid(0) = log 2
    assert bradley_terry_loss(torch.tensor([1.0]), torch.tensor([0.0]), margin=1.0).item() == pytest.approx(
        math.log(2), rel=8 * EPS32)
    # TRL's centring adds c * mean((r_w + r_l)^2): 0.31326 + 0.5 * 1
    centred = bradley_terry_loss(torch.tensor([1.0]), torch.tensor([0.0]), center_rewards_coefficient=0.5)
    assert centred.item() == pytest.approx(math.log(1 + math.exp(-1)) + 0.5, rel=8 * EPS32)
    # the mean over pairs; a swapped pair costs log(1 + e^1); a per-pair margin tensor is accepted
    batch = bradley_terry_loss(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
    assert batch.item() == pytest.approx((math.log(1 + math.exp(-1)) + math.log(1 + math.e)) / 2,
                                         rel=8 * EPS32)
    per_pair = bradley_terry_loss(torch.tensor([1.0, 1.0]), torch.tensor([0.0, 0.0]),
                                  margin=torch.tensor([0.0, 1.0]))
    assert per_pair.item() == pytest.approx((math.log(1 + math.exp(-1)) + math.log(2)) / 2, rel=8 * EPS32)
    with pytest.raises(ValueError, match="same shape"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(3))


def test_bradley_terry_loss_is_shift_invariant():
    r_w, r_l = torch.tensor([0.3, -1.2, 2.0]), torch.tensor([0.1, 0.4, -0.5])
    # the scores are O(1): adding 5 rounds each to within ~5 * eps, so the loss moves by that much
    shifted = bradley_terry_loss(r_w + 5.0, r_l + 5.0)
    assert shifted.item() == pytest.approx(bradley_terry_loss(r_w, r_l).item(), abs=32 * EPS32)


# ------------------------------------------------------------------------------------- agreement


def test_cohen_kappa_equals_sklearn_on_random_labels():
    sklearn = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    for categories, n in ((2, 50), (3, 200), (4, 31)):
        a = [rng.randrange(categories) for _ in range(n)]
        b = [x if rng.random() < 0.6 else rng.randrange(categories) for x in a]  # correlated raters
        # both are sums of n terms of size 1/n: agree to a few float64 ulps
        assert cohen_kappa(a, b) == pytest.approx(sklearn.cohen_kappa_score(a, b), abs=1e-12)
    assert cohen_kappa([0, 1, 0, 1], [0, 1, 0, 1]) == 1.0
    assert cohen_kappa([0, 1, 0, 1], [1, 0, 1, 0]) == -1.0
    assert math.isnan(cohen_kappa([1, 1], [1, 1]))  # chance agreement 1: undefined, as sklearn
    with pytest.raises(ValueError, match="equal length"):
        cohen_kappa([0, 1], [0])


def test_cohen_kappa_of_two_independent_flippers():
    # spec: two raters flipping a balanced label with rate f agree beyond chance by 1 - 4 f (1 - f): 0.64 at f
    # = 0.1
    rng = random.Random(1)
    truth = [rng.randrange(2) for _ in range(40000)]
    a = [t ^ (rng.random() < 0.1) for t in truth]
    b = [t ^ (rng.random() < 0.1) for t in truth]
    # standard error of kappa at n = 40000 is ~0.004; 0.02 is 5 of them
    assert cohen_kappa(a, b) == pytest.approx(0.64, abs=0.02)


def test_fleiss_kappa_hand_example():
    # 3 items, 3 raters: counts (3, 0), (0, 3), (2, 1). P_i = 1, 1, 1/3 -> P_bar = 7/9; p = (5/9, 4/9),
    # P_e = 41/81; kappa = (7/9 - 41/81) / (1 - 41/81) = 22/40 = 0.55
    assert fleiss_kappa([[3, 0], [0, 3], [2, 1]]) == pytest.approx(0.55, abs=1e-12)
    labels = [[1, 1, 1], [0, 0, 0], [1, 1, 0]]
    assert fleiss_kappa(rating_counts(labels)) == pytest.approx(0.55, abs=1e-12)
    with pytest.raises(ValueError, match="same number"):
        fleiss_kappa([[3, 0], [1, 1]])


def test_accuracy_ceiling():
    # p_o = q^2 + (1 - q)^2: q = 0.9 -> p_o = 0.82
    assert accuracy_ceiling(0.82) == pytest.approx(0.9, abs=1e-12)
    assert accuracy_ceiling(1.0) == 1.0 and accuracy_ceiling(0.5) == 0.5
    with pytest.raises(ValueError, match="agreement must satisfy 0.5 <= agreement <= 1.0"):
        accuracy_ceiling(0.3)


# ------------------------------------------------------------------------------ gold and annotators


def test_gold_rewards_the_answer_and_never_length():
    assert gold_reward("047+085=", "231", "231") == 1.0
    assert gold_reward("047+085=", "201", "231") == pytest.approx(1 / 3)
    assert gold_reward("047+085=", "2310", "231") == pytest.approx(0.375)
    assert gold_reward("047+085=", "231", "231", finished=False) == 0.0
    padded = [gold_reward("047+085=", "231" + "0" * k, "231") for k in range(6)]
    assert padded == sorted(padded, reverse=True) and padded[-1] < padded[1]  # every extra character costs


def test_annotator_noise_model():
    comparisons = [Comparison("047+085=", "231", "231", "23100", True, True, "a", "b")] * 2000
    careful = Annotator("careful", flip_rate=0.0)
    assert careful.label(comparisons) == [1] * 2000  # the gold prefers the exact answer
    verbose = Annotator("verbose", length_bias=0.4)  # 1.0 + 1.2 < 0.3 + 2.0: the padded answer wins
    assert verbose.label(comparisons) == [0] * 2000
    noisy = Annotator("noisy", flip_rate=0.2)
    share = sum(noisy.label(comparisons)) / 2000
    assert share == pytest.approx(0.8, abs=0.05)  # binomial sd at n = 2000 is 0.009
    assert noisy.label(comparisons, data_seed=3) == noisy.label(comparisons, data_seed=3)
    with pytest.raises(ValueError, match="flip_rate must satisfy 0 <= flip_rate <= 0.5"):
        Annotator("x", flip_rate=0.7)


# ------------------------------------------------------------------------------------------- data


def test_preference_data_regenerate_byte_identically(tmp_path):
    first = save_preferences(tmp_path / "a.jsonl", make_preference_data(seed=5, n=24))
    second = save_preferences(tmp_path / "b.jsonl", make_preference_data(seed=5, n=24))
    other = save_preferences(tmp_path / "c.jsonl", make_preference_data(seed=6, n=24))
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() != other.read_bytes()
    pairs = read_preferences(first)
    assert len(pairs) == 24 and all(p.chosen != p.rejected or p.chosen_finished != p.rejected_finished
                                    for p in pairs)
    assert all(2 * sum(p.votes.values()) > len(p.votes) for p in pairs)  # chosen = the majority's pick


def test_shipped_preferences_are_consistent():
    train, validation = load_preferences("train"), load_preferences("validation")
    assert {p.prompt for p in train}.isdisjoint(p.prompt for p in validation)
    for pair in train[:300]:
        assert pair.gold_chosen == gold_reward(pair.prompt, pair.chosen, pair.answer, pair.chosen_finished)
        assert pair.gold_rejected == gold_reward(pair.prompt, pair.rejected, pair.answer,
                                                 pair.rejected_finished)
    gold = orient(train, "gold")
    assert all(p.gold_chosen > p.gold_rejected for p in gold)
    with pytest.raises(ValueError, match="split must be one of"):
        load_preferences("dev")


def test_labels_regenerate_from_the_comparisons():
    """The labelling is pure Python: from the shipped completions, in the order they were shown,
    the panel gives back the shipped lines byte for byte on any machine."""
    shipped = load_preferences("validation")
    # the validation split follows the 2000 training comparisons in one labelling pass
    comparisons = [p.as_comparison() for p in load_preferences("train") + shipped]
    relabelled = label_comparisons(comparisons, seed=0)[-len(shipped):]
    assert [r.to_json() for r in relabelled] == [p.to_json() for p in shipped]


# --------------------------------------------------------------------------------- reward model


@pytest.fixture(scope="module")
def reward_model():
    return RewardModel.from_pretrained("reward_model")


@torch.no_grad()
def test_score_is_read_at_the_last_token_whatever_the_padding(reward_model):
    prompts, completions = ["047+085=", "1+2=", "999+001="], ["231", "3", "0001000"]
    batch = reward_model.score(prompts, completions)
    alone = torch.cat([reward_model.score([p], [c]) for p, c in zip(prompts, completions)])
    assert batch.shape == (3,)
    # padding changes which zeros enter the attention sums; a 2-layer model keeps that within
    # a few hundred ulps of O(1) scores
    torch.testing.assert_close(batch, alone, rtol=0, atol=256 * EPS32 * (1 + float(alone.abs().max())))
    unfinished = reward_model.score(prompts, completions, [False, True, True])
    assert unfinished[
        0] != batch[0] and unfinished[1:].tolist() == pytest.approx(batch[1:].tolist(), abs=1e-5)


def test_save_and_load_round_trip(tmp_path, reward_model):
    folder = reward_model.save_pretrained(tmp_path / "rm", metadata={"note": "test"})
    loaded = RewardModel.from_pretrained(folder)
    prompts, completions = ["047+085=", "500+500="], ["231", "00019"]
    assert torch.equal(loaded.score(prompts, completions), reward_model.score(prompts, completions))
    assert loaded.offset == reward_model.offset
    model, tokenizer, meta = load_checkpoint(folder)  # the project's loader sees a Llama with its head
    assert model.value_head is not None and meta["kind"] == "reward_model" and meta["note"] == "test"


def test_ensemble_aggregates(reward_model):
    shifted = RewardModel(reward_model.model, reward_model.tokenizer, offset=reward_model.offset + 1.0)
    prompts, completions = ["047+085=", "500+500="], ["231", "0001"]
    base = reward_model.score(prompts, completions)
    for aggregate, expected in (("mean", base - 0.5), ("min", base - 1.0), ("mean_minus_std", base - 1.0)):
        ensemble = RewardEnsemble([reward_model, shifted], aggregate=aggregate)
        torch.testing.assert_close(torch.tensor(ensemble.score_batch(prompts, completions)), expected,
                                   rtol=0, atol=16 * EPS32 * (1 + float(base.detach().abs().max())))
    with pytest.raises(ValueError, match="aggregate must be one of"):
        RewardEnsemble([reward_model], aggregate="max")


def test_reward_config_names_the_bad_field():
    with pytest.raises(ValueError, match="learning_rate must satisfy 0 < learning_rate"):
        RewardConfig(learning_rate=0)
    with pytest.raises(ValueError, match="n_pairs must satisfy 1 <= n_pairs"):
        RewardConfig(n_pairs=0)


def test_rl_trainer_uses_the_reward_model_as_its_reward(reward_model):
    from rlhf_lab.rl import Trainer, make_config

    config = make_config("grpo", prompts_per_step=2, num_generations=4, steps=1, eval_every=0)
    trainer = Trainer(config, reward_fn=reward_model)
    examples = trainer.train_examples[:2]
    rollout = trainer.sampler.sample(examples)  # the sampling + scoring phase of a step
    texts = [trainer.tokenizer.decode_until_eos(row)[0] for row in rollout.completion_ids.tolist()]
    prompts = [e.prompt for e in examples for _ in range(config.num_generations)]
    expected = reward_model.score_batch(prompts, texts, None, rollout.finished.tolist())
    # the same forward on the same strings, batched alike: equal up to padding-width rounding
    torch.testing.assert_close(rollout.rewards, torch.tensor(expected), rtol=0, atol=1e-5)
    row = trainer.train_step()
    assert math.isfinite(row["reward_mean"]) and trainer.step == 1


def _train_on(pairs, eval_pairs, steps=40):
    # label "majority" takes each pair as given (chosen = the preferred side)
    config = RewardConfig(steps=steps, label="majority", learning_rate=1e-3, batch_size=32, warmup_steps=5,
                          eval_every=0, seed=0)
    trainer = RewardTrainer(config, train_pairs=pairs, eval_pairs=eval_pairs)
    trainer.train()
    return pairwise_accuracy(trainer.model, eval_pairs, "gold")


def test_reward_model_learns_gold_preferences_and_not_shuffled_ones():
    """Acceptance: a few CPU-seconds of training on the gold labels beats chance clearly; the same
    run on labels shuffled at random stays near chance (so the test can fail)."""
    train = orient(load_preferences("train")[:800], "gold")
    validation = load_preferences("validation")[:300]
    learned = _train_on(train, validation)
    rng = random.Random(0)
    shuffled = [p if rng.random() < 0.5 else p.swapped() for p in train]
    chance = _train_on(shuffled, validation)
    n = len(orient(validation, "gold"))
    se = math.sqrt(0.25 / n)  # standard error of an accuracy near 0.5 on n pairs
    assert learned > 0.5 + 4 * se, (learned, se)
    assert abs(chance - 0.5) < 4 * se, (chance, se)


def test_checkpoint_readme_lists_the_shipped_reward_models():
    from rlhf_lab.checkpoints import CHECKPOINT_DIR
    from rlhf_lab.preferences.reward_model import reward_models_table

    rows = reward_models_table()
    assert rows.count("\n") >= 2  # the model and two ensemble members
    assert rows in (CHECKPOINT_DIR / "README.md").read_text(), (
        "regenerate the reward-model rows with reward_models_table()"
    )


def test_datasheet_is_regenerated_from_the_shipped_files(tmp_path):
    import shutil

    from rlhf_lab.preferences import PREFERENCE_DIR, write_datasheet

    copy = tmp_path / "preferences"
    shutil.copytree(PREFERENCE_DIR, copy)
    (copy / "DATASHEET.md").unlink()
    assert write_datasheet(copy).read_text() == (PREFERENCE_DIR / "DATASHEET.md").read_text(), (
        "data/preferences/DATASHEET.md is stale: run rlhf_lab.preferences.write_datasheet()")


def test_loglik_readout_ranks_right_answers_from_the_frozen_sft_model(tmp_path):
    """readout "last_token+loglik" with a frozen trunk: a few CPU-seconds on the gold labels rank a
    right answer above a wrong one clearly better than chance, by learning w > 0 (the SFT model's
    next-token predictions already know the sum); the trunk is untouched; save/load keeps readout and w."""
    train = orient(load_preferences("train")[:800], "gold")
    validation = load_preferences("validation")
    right_vs_wrong = [p for p in validation if (p.chosen == p.answer) != (p.rejected == p.answer)]
    config = RewardConfig(
        readout="last_token+loglik",
        train_trunk=False,
        label="gold",
        steps=20,
        batch_size=32,
        learning_rate=1e-2,
        warmup_steps=5,
        eval_every=0,
        seed=0,
    )
    trainer = RewardTrainer(config, train_pairs=train, eval_pairs=validation[:50])
    before = {name: p.detach().clone() for name, p in trainer.model.model.named_parameters()}
    trainer.train()
    model = trainer.model
    n = len(right_vs_wrong)
    se = math.sqrt(0.25 / n)  # standard error of an accuracy near 0.5 on n pairs
    accuracy = pairwise_accuracy(model, right_vs_wrong, "gold")
    assert accuracy > 0.5 + 6 * se, (accuracy, se, n)
    assert model.loglik_weight.item() > 0
    for name, p in model.model.named_parameters():
        assert name.startswith("value_head.") or torch.equal(p, before[name]), name
    loaded = RewardModel.from_pretrained(model.save_pretrained(tmp_path / "rm"))
    prompts, completions = ["047+085=", "500+500="], ["231", "00019"]
    assert loaded.readout == "last_token+loglik" and loaded.loglik_weight.item() == model.loglik_weight.item()
    torch.testing.assert_close(loaded.score(prompts, completions), model.score(prompts, completions),
                               rtol=0, atol=0)


def test_train_trunk_true_unfreezes_a_model_a_frozen_run_trained_first():
    """A linear probe, then fine-tuning (Kumar et al. 2022): a second RewardTrainer with train_trunk=True
    on the probe's model must train the trunk again (the first run set requires_grad False on it)."""
    train = load_preferences("train")[:64]
    settings = dict(readout="last_token+loglik", steps=2, batch_size=8, warmup_steps=0, eval_every=0, seed=0)
    probe = RewardTrainer(RewardConfig(train_trunk=False, learning_rate=1e-2, **settings), train_pairs=train,
                          eval_pairs=train[:8])
    probe.train()
    before = {name: p.detach().clone() for name, p in probe.model.model.named_parameters()}
    fine_tune = RewardTrainer(
        RewardConfig(train_trunk=True, learning_rate=1e-3, **settings),
        model=probe.model,
        train_pairs=train,
        eval_pairs=train[:8],
    )
    assert all(p.requires_grad for p in fine_tune.model.model.parameters())
    fine_tune.train()
    changed = (
        [name for name, p in fine_tune.model.model.named_parameters() if not torch.equal(p, before[name])]
    )
    assert any(not name.startswith("value_head.") for name in changed), changed


def test_readout_is_validated():
    with pytest.raises(ValueError, match="readout must be one of"):
        RewardConfig(readout="mean")
    with pytest.raises(ValueError, match="train_trunk"):
        RewardConfig(train_trunk="no")
