"""`python -m rlhf_lab train|compare`: files written, errors named."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

try:
    import resource
except ImportError:  # Windows
    resource = None

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


# ------------------------------------------------------------------------ bad input, one line each

QUICK = ["--steps", "1", "--eval-every", "1", "--set", "eval_examples=10", "--set", "prompts_per_step=2",
         "--no-progress", "--no-plots", "--threads", "1"]


def refused(capsys, argv) -> str:
    """Run the CLI expecting exit status 2; its stderr, which must be one error line, no traceback."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err and err.count("error:") == 1, err
    return err


def test_overwrite_never_deletes_files_a_run_did_not_write(tmp_path, capsys):
    out = tmp_path / "mine"
    (out / "plots").mkdir(parents=True)
    (out / "plots" / "fig.png").write_bytes(b"my figure")
    (out / "checkpoint").mkdir()
    (out / "checkpoint" / "my_model.bin").write_bytes(b"my weights")
    err = refused(capsys, ["train", "--algo", "grpo", *QUICK, "--overwrite", "--out", str(out)])
    assert "holds plots, checkpoint but no run.json" in err
    assert (out / "plots" / "fig.png").read_bytes() == b"my figure"
    assert (out / "checkpoint" / "my_model.bin").read_bytes() == b"my weights"
    assert sorted(p.name for p in out.iterdir() if p.name != ".lock") == ["checkpoint", "plots"]
    # a folder of another command's run is not cleared either
    (tmp_path / "cmp").mkdir()
    (tmp_path / "cmp" / "run.json").write_text(json.dumps({"command": "compare", "algos": ["grpo"]}))
    (tmp_path / "cmp" / "report.md").write_text("mine")
    assert "holds a `compare` run, not a `train` run" in refused(
        capsys, ["train", "--algo", "grpo", *QUICK, "--overwrite", "--out", str(tmp_path / "cmp")])
    assert (tmp_path / "cmp" / "report.md").read_text() == "mine"


@pytest.mark.parametrize("run_json, message", [
    ('{"command": "train"}', "run.json has no 'config' entry"),
    ("{'command': 'train'}", "run.json is not valid JSON"),
    ('{"command": "train", "config": {"steps": 3}}', "names no algorithm"),
    ('["train"]', "records no run"),
], ids=["no config", "not JSON", "no algo", "a list"])
def test_resume_names_a_broken_run_json(tmp_path, capsys, run_json, message):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text(run_json)
    err = refused(capsys, ["train", "--resume", str(tmp_path / "run")])
    assert message in err and str(tmp_path / "run") in err, err


def test_set_algo_is_refused_naming_the_field(tmp_path, capsys):
    argv = ["train", "--algo", "grpo", *QUICK, "--set", "algo=ppo", "--out", str(tmp_path / "x")]
    err = refused(capsys, argv)
    assert "algo must be 'grpo' in a GRPOConfig, got 'ppo'" in err
    assert not (tmp_path / "x").exists()


def test_sft_refuses_a_bad_device_before_writing_anything(tmp_path, capsys):
    out = tmp_path / "ckpt"
    err = refused(capsys, ["sft", "--preset", "addition_sft", "--steps", "1", "--quiet", "--set",
                           "device=tpu", "--out", str(out)])
    assert "device must be one of" in err and "'tpu'" in err
    assert not out.exists()  # no run.json: the corrected command is not refused as "already holds a run"
    err = refused(capsys, ["sft", "--preset", "addition_sft", "--set", "task=countdown", "--set",
                           "task_params={}", "--out", str(out)])
    assert "needs a BPE tokenizer" in err and "--model" in err and not out.exists()


def test_train_points_a_free_text_task_to_a_bpe_model(tmp_path, capsys):
    argv = ["train", "--algo", "grpo", *QUICK, "--task", "countdown", "--out", str(tmp_path / "x")]
    err = refused(capsys, argv)
    assert "task 'countdown' writes free text" in err and "--model" in err


def test_data_refuses_empty_splits(tmp_path, capsys):
    err = refused(capsys, ["data", "--n-train", "0", "--n-test", "0", "--out-dir", str(tmp_path / "tasks")])
    assert "n_train must satisfy 1 <= n_train, got 0" in err
    assert not (tmp_path / "tasks").exists()


def limit_file_size(size: int):
    """preexec_fn of a subprocess whose files may not grow past `size` bytes: a write past it fails
    with EFBIG (Python ignores SIGXFSZ), what a full disk does to the file being written."""
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


@pytest.mark.skipif(resource is None, reason="RLIMIT_FSIZE is POSIX")
def test_a_full_disk_is_one_line_naming_the_file(tmp_path):
    """A state save that fails for lack of space, and the data command's files alike, end in one line
    (which file, what is wrong, what to do), not a traceback from torch or safetensors."""
    run = [sys.executable, "-m", "rlhf_lab", "train", "--algo", "grpo", *QUICK, "--save-every", "1",
           "--out", str(tmp_path / "run")]
    done = subprocess.run(run, capture_output=True, text=True, preexec_fn=limit_file_size(600_000))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    expected = f"error: {tmp_path / 'run' / 'resume'}: File too large; free some space"
    assert expected in done.stderr, done.stderr
    assert not [p.name for p in tmp_path.rglob(".*") if p.name != ".lock"]  # no temporary files left
    data = [sys.executable, "-m", "rlhf_lab", "data", "--out-dir", str(tmp_path / "tasks")]
    done = subprocess.run(data, capture_output=True, text=True, preexec_fn=limit_file_size(4096))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"error: {tmp_path / 'tasks'}" in done.stderr and "File too large; free some space" in done.stderr


def test_an_interrupt_handled_inside_exec_code_still_exits_130(tmp_path):
    """CPython ends a `python -m` process by SIGINT (exit status -2) when a KeyboardInterrupt once
    escaped code run by exec() of a string, even if it was caught later: a Ctrl-C landing while a
    dataclass builds its methods (a lazy import during start-up, e.g. torch._dynamo at the first
    optimiser step) did that to `sft`. The command here is interrupted exactly there."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "__main__.py").write_text(
        "import runpy, sys\n"
        "from rlhf_lab import cli\n"
        "def interrupted(args):\n"
        "    exec('raise KeyboardInterrupt')  # where a Ctrl-C lands in a dataclass being built\n"
        "cli.COMMANDS['data'] = interrupted\n"
        "sys.argv = ['rlhf_lab', 'data']\n"
        "runpy.run_module('rlhf_lab', run_name='__main__', alter_sys=True)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run([sys.executable, "-m", "probe"], capture_output=True, text=True, env=env)
    assert done.returncode == 130 and "Stopped." in done.stderr, (done.returncode, done.stderr[-2000:])
