"""`python -m rlhf_lab train|compare`: files written, errors named."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from rlhf_lab.cli import main


def test_train_writes_history_metrics_plots_and_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--algo", "grpo", "--steps", "2", "--eval-every", "2", "--set", "eval_examples=20",
                 "--set", "prompts_per_step=4", "--no-progress", "--out", str(out)])
    assert code == 0
    history = pd.read_csv(out / "history.csv")
    assert list(history["step"]) == [0, 1, 2]
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0.0 <= metrics["final_eval_accuracy"] <= 1.0 and metrics["steps"] == 2
    assert (out / "checkpoint" / "model.safetensors").is_file()
    assert list((out / "plots").glob("*.png"))
    assert "held-out accuracy" in capsys.readouterr().out


def test_training_commands_turn_on_the_allocator_tuning_and_a_trainer_does_not(tmp_path, monkeypatch):
    """Process-wide tuning is the CLI's choice (rlhf_lab/util/allocator.py), never a side effect of
    constructing a trainer: glibc is asked through ctypes, so every path to mallopt loads libc there."""
    import ctypes

    from rlhf_lab.rl import Trainer, make_config

    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    loads, real = [], ctypes.CDLL
    monkeypatch.setattr(ctypes, "CDLL", lambda name, *a, **k: loads.append(name) or real(name, *a, **k))
    Trainer(make_config("grpo", prompts_per_step=2, n_train=50, n_test=10, eval_examples=5))
    assert "libc.so.6" not in loads
    assert main(["train", "--algo", "grpo", "--steps", "1", "--eval-every", "0", "--set", "eval_examples=5",
                 "--set", "prompts_per_step=2", "--no-progress", "--no-plots", "--out", str(tmp_path / "r")]) == 0
    import platform

    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert "libc.so.6" in loads


def test_compare_writes_one_report(tmp_path):
    out = tmp_path / "cmp"
    code = main(["compare", "--algos", "grpo", "reinforce", "--steps", "1", "--eval-every", "1",
                 "--set", "eval_examples=20", "--set", "prompts_per_step=4", "--no-progress", "--out", str(out)])
    assert code == 0
    report = (out / "report.md").read_text()
    assert "grpo" in report and "reinforce" in report
    assert len(pd.read_csv(out / "summary.csv")) == 2


@pytest.mark.parametrize("argv, field", [
    (["--set", "epsilon=1.5"], "epsilon"),
    (["--set", "num_generations=1"], "num_generations"),
    (["--set", "temperature=0"], "temperature"),
])
def test_invalid_settings_exit_2_naming_the_field(tmp_path, capsys, argv, field):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--algo", "grpo", "--steps", "1", "--out", str(tmp_path / "x"), *argv])
    assert exc.value.code == 2
    assert field in capsys.readouterr().err
