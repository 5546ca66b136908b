"""bench/rl_step.py: how the per-step records of a paired run are grouped by phase of training and
by completion length, and what the derived times are (the numbers its tables are made of)."""

from __future__ import annotations

import csv

import pytest


@pytest.fixture(scope="module")
def rl_step(bench_script):
    return bench_script("rl_step")


def records(lengths):
    """Paired-step records as the worker prints them: steps 2, 3, ... (step 1 is the warm-up)."""
    return [{"step": i + 2, "step_time": 0.1 + i / 1000, "cpu_time": 0.1, "rollout_time": 0.04, "update_time": 0.05,
             "completion_len_mean": length, "reward": 0.5} for i, length in enumerate(lengths)]


def test_phases_cover_every_step_once_in_order(rl_step):
    runs = records([4.5] * 10)  # steps 2..11
    groups = rl_step.phase_groups(runs, [4, 8])
    assert list(groups) == ["2-4", "5-8", "9-11"]
    assert sum(groups.values(), []) == list(range(10))
    # an edge outside the run adds no empty phase
    assert list(rl_step.phase_groups(runs, [4, 50])) == ["2-4", "5-11"]


def test_length_bands_split_by_length_not_by_step(rl_step):
    lengths = [5.0, 3.0, 4.0, 6.0, 3.5, 4.5]
    groups = rl_step.length_groups(records(lengths))
    assert list(groups) == ["len 3.00-3.50", "len 4.00-4.50", "len 5.00-6.00"]
    assert [sorted(lengths[i] for i in g) for g in groups.values()] == [[3.0, 3.5], [4.0, 4.5], [5.0, 6.0]]


def test_derived_times_and_csv(rl_step, tmp_path):
    runs = records([4.5, 4.0])
    rl_step.add_derived_times(runs)
    assert runs[0]["trainer_time"] == 0.04 + 0.05
    assert runs[1]["other_time"] == runs[1]["step_time"] - runs[1]["trainer_time"]
    path = tmp_path / "steps.csv"
    rl_step.write_per_step({"before": runs, "after": runs}, path)
    rows = list(csv.DictReader(path.open()))
    assert [(r["tree"], r["step"]) for r in rows] == [("before", "2"), ("before", "3"), ("after", "2"), ("after", "3")]
    assert float(rows[1]["completion_len_mean"]) == 4.0


def test_paired_ratio_is_reference_over_tree(rl_step):
    ref = [{"t": 2.0}, {"t": 4.0}, {"t": 6.0}]
    assert rl_step.paired_ratio(ref, [{"t": 1.0}, {"t": 2.0}, {"t": 3.0}], "t").startswith("2.00x")
    assert rl_step.paired_ratio(ref[:1], [{"t": 4.0}], "t") == "0.50x"
