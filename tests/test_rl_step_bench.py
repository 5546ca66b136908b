"""bench/rl_step.py: how the per-step records of a paired run are grouped by phase of training and
by completion length, and what the derived times are (the numbers its tables are made of)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def rl_step(bench_script):
    return bench_script("rl_step")


def records(lengths):
    """Paired-step records as the worker prints them: steps 2, 3, ... (step 1 is the warm-up)."""
    return [
        {
            "step": i + 2,
            "step_time": 0.1 + i / 1000,
            "cpu_time": 0.1,
            "rollout_time": 0.04,
            "update_time": 0.05,
            "completion_len_mean": length,
            "reward": 0.5,
        }
        for i, length in enumerate(lengths)
    ]


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
    assert [(r["tree"], r["step"]) for r in rows] == [("before", "2"), ("before", "3"), ("after", "2"),
                                                      ("after", "3")]
    assert float(rows[1]["completion_len_mean"]) == 4.0


def test_paired_ratio_is_reference_over_tree(rl_step):
    ref = [{"t": 2.0}, {"t": 4.0}, {"t": 6.0}]
    assert rl_step.paired_ratio(ref, [{"t": 1.0}, {"t": 2.0}, {"t": 3.0}], "t").startswith("2.00x")
    assert rl_step.paired_ratio(ref[:1], [{"t": 4.0}], "t") == "0.50x"


def test_repeats_pool_in_partner_order_and_give_one_median_per_set(rl_step):
    # two sets of processes: in the first, "after" takes half the time of "before"; in the second, a third
    first = {"before": records([4.0, 4.0, 4.0]), "after": records([4.0, 4.0, 4.0])}
    second = {"before": records([5.0, 5.0]), "after": records([5.0, 5.0])}
    for r in first["after"]:
        r["step_time"] /= 2
    for r in second["after"]:
        r["step_time"] /= 3
    sets = [first, second]
    assert rl_step.run_medians(sets, "before", "after", "step_time") == pytest.approx([2.0, 3.0])
    assert rl_step.run_medians(sets, "before", "before", "step_time") == [1.0, 1.0]
    pooled = rl_step.pool_runs(sets)
    assert [r["run"] for r in pooled["after"]] == [1, 1, 1, 2, 2]
    # record i of one tree is still the partner of record i of the other
    ratios = [b["step_time"] / a["step_time"] for b, a in zip(pooled["before"], pooled["after"])]
    assert ratios == pytest.approx([2, 2, 2, 3, 3])
    assert "run" not in first["after"][0]  # the sets' own records are left as they were


def test_repeats_below_one_refused_by_name():
    script = Path(__file__).resolve().parents[1] / "bench" / "rl_step.py"
    out = subprocess.run([sys.executable, str(script), "--paired", "2", "--repeats", "0"],
                         capture_output=True, text=True)
    assert (
        out.returncode == 2 and "--repeats must be a whole number >= "
                                "1" in out.stderr and "got 0" in out.stderr
    )
