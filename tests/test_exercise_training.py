"""Your code trains the model: a learner's function plugged into a real (tiny) RL run through the
algorithm hooks. With the reference solution plugged in, the run is the package's run."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from rlhf_lab import exercises
from rlhf_lab.exercises import training
from rlhf_lab.model import LlamaModel
from rlhf_lab.sft import lab_model_config
from rlhf_lab.tokenizer import CharTokenizer

TOK = CharTokenizer()
# 4 prompts x 4 completions, 2 steps, no held-out evaluation: a few seconds per run on one core
SETTINGS = dict(prompts_per_step=4, num_generations=4, steps=2, eval_every=100, eval_examples=8,
                n_train=200, n_test=8)
TIMING = ("wall_time", "step_time", "rollout_time", "update_time", "tokens_per_s", "mem_peak_bytes")


def tiny_model() -> LlamaModel:
    torch.manual_seed(0)
    return LlamaModel(lab_model_config(TOK, hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                                       initializer_range=0.5))


def count_ones(prompt, completion, answer, finished=True):
    """A graded reward a random model already varies on, so advantages are not all zero."""
    return float(completion.count("1"))


def run(name, function):
    history = training.train_with(name, function, SETTINGS, model=tiny_model(), tokenizer=TOK,
                                  reward_fn=count_ones).history
    return history.drop(columns=[c for c in TIMING if c in history])


@pytest.mark.parametrize("name", sorted(training.PLUGGABLE))
def test_reference_plugged_in_gives_the_package_history(name):
    package = run(name, None)
    assert package["reward_std"].iloc[1:].gt(0).any(), "rewards must vary, or any advantage is 0"
    pd.testing.assert_frame_equal(run(name, exercises.reference(name)), package)


def test_a_wrong_function_changes_the_run():
    mistake = next(m for m in exercises.mistakes("group_advantages") if m.name == "population_std")
    assert not run("group_advantages", mistake.variant)["grad_norm"].equals(run("group_advantages", None)["grad_norm"])


def test_plugging_checks_the_config():
    with pytest.raises(ValueError, match="scale_rewards must be one of"):
        training.learner_algorithm("group_advantages", exercises.reference("group_advantages"),
                                   training.make_config("grpo", scale_rewards="none"))
    with pytest.raises(ValueError, match="name must be one of"):
        training.train_with("cohen_kappa", None)


def test_comparison_stacks_both_runs_and_plots():
    runs = training.compare_with_reference("whiten", exercises.reference("whiten"), SETTINGS, model=tiny_model(),
                                           tokenizer=TOK, reward_fn=count_ones)
    assert set(runs["run"]) == {"yours", "reference"} and len(runs) == 2 * (SETTINGS["steps"] + 1)
    fig = training.plot_comparison(runs, algo="ppo")
    assert len(fig.axes) == 2
