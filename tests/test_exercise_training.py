"""Your code trains the model: a learner's function plugged into a real (tiny) RL run through the
algorithm hooks. With the reference solution plugged in, the run is the package's run."""

from __future__ import annotations

import pandas as pd
import pytest
from test_rl import TOK, tiny_model

from rlhf_lab import exercises
from rlhf_lab.exercises import training

# 4 prompts x 4 completions, 2 steps, no held-out evaluation: a few seconds per run on one core
SETTINGS = dict(prompts_per_step=4, num_generations=4, steps=2, eval_every=100, eval_examples=8,
                n_train=200, n_test=8)
TIMING = ("wall_time", "step_time", "rollout_time", "update_time", "tokens_per_s", "mem_peak_bytes")


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


def test_comparison_stacks_both_runs_and_plots(capsys):
    runs = training.compare_with_reference("whiten", exercises.reference("whiten"), SETTINGS, model=tiny_model(),
                                           tokenizer=TOK, reward_fn=count_ones)
    assert set(runs["run"]) == {"yours", "reference"} and len(runs) == 2 * (SETTINGS["steps"] + 1)
    assert set(runs["seed"]) == {0}
    # one short run per side: the comparison says plainly that it may not show a mistake
    assert "a short single-seed run may not show a mistake" in capsys.readouterr().out
    fig = training.plot_comparison(runs, algo="ppo")
    assert len(fig.axes) == 2


def test_comparison_over_seeds_shows_the_spread(capsys):
    wrong = next(m for m in exercises.mistakes("whiten") if m.name == "population_variance").variant
    runs = training.compare_with_reference("whiten", wrong, SETTINGS, seeds=(0, 1), lang="zh",
                                           model=tiny_model(), tokenizer=TOK, reward_fn=count_ones)
    assert set(runs["seed"]) == {0, 1} and len(runs) == 2 * 2 * (SETTINGS["steps"] + 1)
    reference = runs[runs["run"] == "reference"]
    rewards = [reference[reference["seed"] == seed]["reward_mean"].tolist() for seed in (0, 1)]
    assert rewards[0] != rewards[1]  # the seeds give different runs: there is a spread to show
    shown = capsys.readouterr().out
    assert "2 个随机种子下的最终值" in shown and "+-" in shown and "单种子" not in shown
    table = training.spread_over_seeds(runs)
    assert list(table.index) == ["yours", "reference"] and table["reward_mean"].str.contains(r"\(n=2\)").all()
    finals = reference.groupby("seed")["reward_mean"].last()
    assert table.loc["reference", "reward_mean"].startswith(f"{finals.mean():.3f} "
                                                            f"+- {finals.std(ddof=1):.3f}")
    fig = training.plot_comparison(runs, algo="ppo")
    assert fig.axes[0].collections  # the band from the lowest to the highest seed
