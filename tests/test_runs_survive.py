"""Runs that survive: faults injected into real runs, each followed by what a user would do next.

Stops (SIGTERM, a double SIGINT, SIGKILL) hit a CLI run in a subprocess at a random moment of its
training or wrap-up; `train --resume` must then end with the same history, value for value, as a
run that never stopped. The comparison leaves out the columns that measure the clock or the
process (wall/step/rollout/update time, tokens per second, peak resident memory): everything else
is computed from the saved weights, optimiser moments and RNG states, so on one machine with one
thread it is reproducible to the last bit, and any state the resume forgot shows up as a
different number.

The random delay of each stop is printed on failure (pytest -s shows it always).
"""

from __future__ import annotations

import collections
import copy
import hashlib
import importlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from rlhf_lab import cli
from rlhf_lab.checkpoints import CHECKPOINT_DIR, CheckpointError, load_checkpoint, loader
from rlhf_lab.cli import main
from rlhf_lab.model.hf import from_pretrained, save_pretrained
from rlhf_lab.preferences.data import load_preferences, read_preferences
from rlhf_lab.preferences.dpo import DPOConfig, DPOTrainer
from rlhf_lab.preferences.overoptimization import TimedReward
from rlhf_lab.preferences.reward_model import RewardConfig, RewardModel
from rlhf_lab.rl import Trainer, make_config
from rlhf_lab.sampling import SamplingConfig, generate
from rlhf_lab.sft import SFTConfig, SFTTrainer
from rlhf_lab.tasks import TASKS, get_task
from rlhf_lab.tasks.reasoning import (
    countdown_answer_reward,
    extract_tagged_answer,
    is_think_answer,
    number_answer_reward,
)
from rlhf_lab.text.tokenizer import default_tokenizer
from rlhf_lab.train.callbacks import NonFiniteLossError
from rlhf_lab.train.run_state import Checkpointer
from rlhf_lab.util.atomic import FolderInUseError, FolderLock, recover_folder, replace_folder

PROCESS_COLUMNS = ["wall_time", "step_time", "rollout_time", "update_time", "tokens_per_s", "mem_peak_bytes"]
RUN = ["--steps", "8", "--eval-every", "4", "--save-every", "2", "--set", "prompts_per_step=4",
       "--set", "eval_examples=10", "--no-progress", "--threads", "1", "--no-plots"]
SEED = int(os.environ.get("RLHF_LAB_FAULT_SEED", time.time_ns() % 10_000))


def comparable(path: Path) -> pd.DataFrame:
    """history.csv as text (no float parsing), without the clock / process columns."""
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    return frame.drop(columns=[c for c in PROCESS_COLUMNS if c in frame.columns])


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> pd.DataFrame:
    """The uninterrupted run (in-process: the same CLI code, one thread like the subprocesses)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    assert main(["train", "--algo", "grpo", *RUN, "--out", str(out)]) == 0
    return comparable(out / "history.csv")


def launch(out: Path, plots: bool) -> subprocess.Popen:
    """A CLI run; with plots, its wrap-up (where a second Ctrl-C lands) lasts longer."""
    args = [a for a in RUN if a != "--no-plots"] if plots else RUN
    return subprocess.Popen([sys.executable, "-m", "rlhf_lab", "train", "--algo", "grpo", *args, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until `path` exists (the run got that far) or the process ended."""
    end = time.monotonic() + timeout
    while not path.exists() and process.poll() is None and time.monotonic() < end:
        time.sleep(0.02)


def resume_and_compare(out: Path, reference: pd.DataFrame, what: str) -> None:
    """Resume, then check that the run continued (the saved rows' wall times, which no rerun could
    reproduce, are still there) and that it ends as the uninterrupted run did."""
    state = out / "resume" / "trainer_state.pt"
    saved = torch.load(state, weights_only=True)["rows"] if state.is_file() else []
    assert main(["train", "--resume", str(out), "--no-progress", "--threads", "1"]) == 0, what
    wall_times = [float(text) for text in pd.read_csv(out / "history.csv", dtype=str)["wall_time"]]  # exact parse
    assert wall_times[: len(saved)] == [row["wall_time"] for row in saved], f"{what}: not continued"
    pd.testing.assert_frame_equal(comparable(out / "history.csv"), reference, obj=what)
    leftovers = [p.name for p in out.rglob(".*") if p.name != ".lock"]
    assert not leftovers, f"{what}: temporary files left behind: {leftovers}"


@pytest.mark.parametrize("fault", ["SIGTERM", "double SIGINT", "SIGKILL"])
def test_a_stopped_cli_run_resumes_to_the_uninterrupted_history(tmp_path, reference, fault):
    rng = random.Random(f"{SEED}-{fault}")
    out = tmp_path / "run"
    process = launch(out, plots=fault == "double SIGINT")
    if fault == "double SIGINT":  # the second one lands in the wrap-up (saving, evaluating, plotting)
        wait_for(out / "resume" / "trainer_state.json", process)
        assert process.poll() is None, "the run ended without saving a resumable state along the way"
        delay = rng.uniform(0.0, 0.5)
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        time.sleep(0.1)
        process.send_signal(signal.SIGINT)
    else:  # any moment from the run's start (run.json written) through training and the wrap-up
        wait_for(out / "run.json", process)
        assert (out / "run.json").is_file(), "the run never started"
        delay = rng.uniform(0.0, 2.5)
        time.sleep(delay)
        process.send_signal(signal.SIGTERM if fault == "SIGTERM" else signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=120)
    what = f"{fault} {delay:.2f} s in (RLHF_LAB_FAULT_SEED={SEED}), exit {process.returncode}"
    print(what)
    expected = {"SIGTERM": (0, 130), "double SIGINT": (0, 130), "SIGKILL": (-signal.SIGKILL, 0)}[fault]
    assert process.returncode in expected, f"{what}\n{stderr[-2000:]}"
    assert "Traceback" not in stderr, f"{what}\n{stderr[-2000:]}"
    if process.returncode == 130:  # a clean stop says how to continue
        assert f"--resume {out}" in stdout + stderr
    resume_and_compare(out, reference, what)


def test_a_ctrl_c_while_importing_exits_cleanly_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    process = launch(out, plots=False)
    time.sleep(1.0)  # torch is still being imported
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130 and "Traceback" not in stderr, stderr[-2000:]
    assert not out.exists() or (out / "run.json").exists()  # no folder, or (on a slow start) a resumable run


def test_the_stop_message_is_written_after_the_signal_handlers_are_back(tmp_path, monkeypatch):
    """The race behind a double-SIGINT run that died by SIGINT (exit status -2): the second signal
    raised its KeyboardInterrupt while main() was printing the first one's stop message, still under
    StopSignals' handler, and it left main uncaught. The message must be written once the previous
    handlers are back (under `python -m rlhf_lab`, ignoring), where a further signal cannot cut it."""
    def stopped_at_once(args):
        raise KeyboardInterrupt

    before = signal.getsignal(signal.SIGINT)
    handlers_seen = []

    class RecordingStderr(io.StringIO):
        def write(self, text):
            handlers_seen.append(signal.getsignal(signal.SIGINT))
            return super().write(text)

    stderr = RecordingStderr()
    monkeypatch.setitem(cli.COMMANDS, "train", stopped_at_once)
    monkeypatch.setattr(sys, "stderr", stderr)
    out = tmp_path / "run"
    assert main(["train", "--algo", "grpo", "--out", str(out)]) == 130
    assert f"Stopped. The run keeps what it saved: python -m rlhf_lab train --resume {out}" in stderr.getvalue()
    assert handlers_seen and all(handler is before for handler in handlers_seen)


def test_one_writer_per_folder_and_a_killed_writer_leaves_no_stale_lock(tmp_path, capsys):
    out = tmp_path / "shared"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from rlhf_lab.util.atomic import FolderLock; "
                               "FolderLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(60)", str(out)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(SystemExit) as exc:
            main(["train", "--algo", "grpo", *RUN, "--out", str(out)])
        assert exc.value.code == 2
        assert "in use by another run (pid" in capsys.readouterr().err
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # the refused run wrote nothing
    finally:
        holder.kill()
        holder.wait()
    with FolderLock(out):  # the OS released the killed holder's lock
        with pytest.raises(FolderInUseError):
            FolderLock(out).acquire()  # ... and a second holder in this process is refused too


def test_a_folder_holding_a_run_needs_resume_or_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--algo", "grpo", "--steps", "1", "--eval-every", "0", "--set", "prompts_per_step=2",
            "--set", "eval_examples=4", "--no-progress", "--no-plots", "--out", str(out)]
    assert main(args) == 0
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2 and "already holds a run" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "mine"  # --overwrite deletes the run's files only
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("x")
    for bad_out, message in ((other, "holds no run"), ("", "empty string")):
        with pytest.raises(SystemExit) as exc:
            main([*args[:-1], str(bad_out)])
        assert exc.value.code == 2 and message in capsys.readouterr().err


def test_an_unwritable_folder_is_refused_before_training(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    targets = [blocker / "run"]  # a path under a file: never writable, even for root
    if os.geteuid() != 0:  # root ignores permission bits
        locked = tmp_path / "read_only"
        locked.mkdir(mode=0o555)
        targets.append(locked / "run")
    for out in targets:
        with pytest.raises(SystemExit) as exc:
            main(["train", "--algo", "grpo", "--steps", "1", "--no-progress", "--out", str(out)])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "cannot write to the output folder" in err, err
        assert "held-out accuracy" not in err


def test_compare_refuses_an_algorithm_listed_twice(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--algos", "grpo", "grpo", "--steps", "1", "--out", str(tmp_path / "c")])
    assert exc.value.code == 2 and "more than once" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


# ----------------------------------------------------------------------------------- the sft CLI

# A small SFT run: 60 steps of 8 examples, an evaluation every 20 steps on 20 problems (the whole
# test split, so the checkpoint's final evaluation is that small too), the state saved every 2 steps.
SFT_RUN = ["--preset", "addition_sft", "--steps", "60", "--batch-size", "8", "--set", "eval_every=20",
           "--set", "n_train=300", "--set", "n_test=20", "--set", "eval_examples=20", "--save-every", "2",
           "--quiet", "--threads", "1"]


def saved_step(state_json: Path) -> int:
    """The step of the saved state (-1 while none is there; the folder is swapped atomically, so a read
    can miss it for an instant)."""
    try:
        return json.loads(state_json.read_text())["step"]
    except (OSError, ValueError):
        return -1


def test_a_sigterm_stopped_sft_cli_run_resumes_to_the_uninterrupted_history(tmp_path, capsys):
    reference = tmp_path / "reference"
    assert main(["sft", *SFT_RUN, "--out", str(reference)]) == 0
    out, rng = tmp_path / "run", random.Random(f"{SEED}-sft")
    stop_after = rng.randint(2, 40)  # a random step of the 60; the signal lands a little after its save
    process = subprocess.Popen([sys.executable, "-m", "rlhf_lab", "sft", *SFT_RUN, "--out", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    state = out / "resume" / "addition_sft"
    end = time.monotonic() + 120
    while saved_step(state / "trainer_state.json") < stop_after and process.poll() is None and time.monotonic() < end:
        time.sleep(0.005)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    what = f"SIGTERM after step {stop_after}'s save (RLHF_LAB_FAULT_SEED={SEED}), exit {process.returncode}"
    print(what)
    assert process.returncode == 130, f"{what}: the run was not stopped\n{stderr[-2000:]}"
    assert "Traceback" not in stderr and f"python -m rlhf_lab sft --resume {out}" in stdout + stderr, stderr[-2000:]
    assert (out / "run.json").is_file() and not (out / "addition_sft").exists()  # stopped, not finished
    saved = torch.load(state / "trainer_state.pt", weights_only=True)["rows"]
    assert 0 < saved[-1]["step"] < 60, what

    assert main(["sft", "--resume", str(out), "--quiet", "--threads", "1"]) == 0
    history = out / "addition_sft.history.csv"
    wall_times = [float(text) for text in pd.read_csv(history, dtype=str)["wall_time"]]  # exact parse
    assert wall_times[: len(saved)] == [row["wall_time"] for row in saved], f"{what}: not continued"
    pd.testing.assert_frame_equal(comparable(history), comparable(reference / "addition_sft.history.csv"), obj=what)
    weights = [load_file(folder / "addition_sft" / "model.safetensors") for folder in (out, reference)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0]), f"{what}: other final weights"
    # Finished: the run's own files are gone, the checkpoint folder holds no run to resume.
    assert sorted(p.name for p in out.iterdir()) == [".lock", "README.md", "addition_sft", "addition_sft.history.csv"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:  # the finished checkpoint is not replaced without --overwrite
        main(["sft", *SFT_RUN, "--out", str(out)])
    assert exc.value.code == 2 and "already holds the checkpoint(s) addition_sft; pass --overwrite" in capsys.readouterr().err
    (out / "notes.txt").write_text("mine")  # a folder of checkpoints takes another preset, not foreign files
    with pytest.raises(SystemExit) as exc:
        main(["sft", *SFT_RUN, "--preset", "addition_rl_start", "--out", str(out)])
    assert exc.value.code == 2 and "is not empty (notes.txt)" in capsys.readouterr().err


def test_an_sft_run_refuses_a_folder_in_use_and_settings_a_resume_would_change(tmp_path, capsys):
    out = tmp_path / "shared"
    with FolderLock(out):  # another writer (in this process: the lock is per open file, so it counts too)
        with pytest.raises(SystemExit) as exc:
            main(["sft", *SFT_RUN, "--out", str(out)])
        assert exc.value.code == 2 and "in use by another run (pid" in capsys.readouterr().err
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # the refused run wrote nothing
    for args, message in ((["--resume", str(out), "--seed", "0"], "--seed cannot be combined with --resume"),
                          (["--resume", str(out)], "holds no run"),
                          (["--preset", "addition_sft", "--set", "learnig_rate=1"], "did you mean 'learning_rate'"),
                          ([], "sft needs --preset")):
        with pytest.raises(SystemExit) as exc:
            main(["sft", *args, "--out", str(tmp_path / "new")] if "--resume" not in args else ["sft", *args])
        assert exc.value.code == 2 and message in capsys.readouterr().err, args


# ------------------------------------------------------------------------------- resume in-process


def tiny(algo: str, **overrides):
    return make_config(algo, {"steps": 4, "prompts_per_step": 4, "eval_every": 2, "eval_examples": 10, "seed": 5},
                       **overrides)


def drop_process_columns(history: pd.DataFrame) -> pd.DataFrame:
    return history.drop(columns=[c for c in PROCESS_COLUMNS if c in history.columns]).reset_index(drop=True)


@pytest.mark.parametrize("algo, overrides", [("ppo", {"critic": "separate", "adaptive_kl": True, "target_kl": 0.01}),
                                             ("grpo", {"num_iterations": 2, "num_minibatches": 2})])
def test_trainer_resume_continues_exactly(tmp_path, algo, overrides):
    """PPO with its own critic and an adaptive KL weight; GRPO off-policy (stored old log-probs,
    shuffled minibatches): every piece of state matters to the next step."""
    straight = Trainer(tiny(algo, **overrides)).train()
    first = Trainer(tiny(algo, **overrides))
    first.train(steps=2)
    first.save_state(tmp_path / "state")
    second = Trainer(tiny(algo, **overrides)).resume(tmp_path / "state")
    assert second.step == 2
    resumed = second.train(steps=2)
    pd.testing.assert_frame_equal(drop_process_columns(resumed), drop_process_columns(straight))
    assert len(second.distributions) == len(first.distributions) + 2  # the live plots' data came back too


def test_sft_resume_continues_exactly_with_the_same_checkpointer(tmp_path):
    config = SFTConfig(steps=6, batch_size=8, eval_every=3, eval_examples=10, n_train=100, n_test=20)
    straight = SFTTrainer(config, default_tokenizer()).train()
    first = SFTTrainer(config, default_tokenizer(), callbacks=[Checkpointer(tmp_path / "state", every=2)])
    first.train(steps=3)  # ends on an odd step: the end-of-train save, not the periodic one, holds it
    second = SFTTrainer(config, default_tokenizer()).resume(tmp_path / "state")
    resumed = second.train(steps=3)
    pd.testing.assert_frame_equal(drop_process_columns(resumed), drop_process_columns(straight))


def test_a_stop_during_an_evaluation_is_finished_by_the_next_train():
    class StopDuringEvaluation(SFTTrainer):
        stop_at: int | None = 3

        def evaluate(self, examples=None):
            if self.step == self.stop_at:
                self.stop_at = None
                raise KeyboardInterrupt
            return super().evaluate(examples)

    config = SFTConfig(steps=6, batch_size=8, eval_every=3, eval_examples=10, n_train=100, n_test=20)
    straight = SFTTrainer(config, default_tokenizer()).train()
    trainer = StopDuringEvaluation(config, default_tokenizer())
    trainer.train()
    assert trainer.stop_reason == "interrupted" and trainer.step == 3
    resumed = trainer.train(steps=3)
    pd.testing.assert_frame_equal(drop_process_columns(resumed), drop_process_columns(straight))


def test_resume_refuses_a_different_run(tmp_path):
    trainer = Trainer(tiny("grpo"))
    trainer.train(steps=1)
    trainer.save_state(tmp_path / "state")
    with pytest.raises(ValueError, match="learning_rate"):
        Trainer(tiny("grpo", learning_rate=1e-3)).resume(tmp_path / "state")
    Trainer(tiny("grpo", steps=9)).resume(tmp_path / "state")  # a longer run of the same settings is fine


# ------------------------------------------------------------------------------------- integrity


def test_non_finite_weights_after_a_step_stop_training_and_keep_the_last_good_ones():
    class Diverging(SFTTrainer):  # a step whose loss and gradient were finite but whose update was not
        def _step(self):
            row = super()._step()
            if self.step == 2:
                with torch.no_grad():
                    self.model.lm_head.weight.view(-1)[0] = float("nan")
            return row

    trainer = Diverging(SFTConfig(steps=4, batch_size=8, eval_every=0, n_train=50, n_test=10, eval_examples=10),
                        default_tokenizer())
    trainer.train(steps=1)
    after_one = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.warns(RuntimeWarning, match="non-finite weights"):
        trainer.train(steps=3)
    assert trainer.stop_reason == "non_finite" and trainer.step == 1 and len(trainer.rows) == 2
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, after_one[name]), name


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_the_weight_check_names_the_parameter_holding_a_non_finite_value(bad):
    trainer = SFTTrainer(SFTConfig(n_train=50, n_test=10, eval_examples=10), default_tokenizer())
    trainer.check_finite_weights()  # fresh weights: nothing to report
    with torch.no_grad():
        trainer.model.model.layers[1].mlp.up_proj.weight.view(-1)[-1] = bad
    with pytest.raises(NonFiniteLossError, match=r"model\.model\.layers\.1\.mlp\.up_proj\.weight"):
        trainer.check_finite_weights()


def test_the_weight_check_lets_huge_finite_weights_pass():
    # The one-look test sums the weights' norms. Weights of 3e38 (float32's largest is ~3.4e38) have a
    # norm of 3e38 * sqrt(numel), past float32's range however a platform computes it: inf, although
    # every weight is finite. The look per parameter then finds nothing to report.
    trainer = SFTTrainer(SFTConfig(n_train=50, n_test=10, eval_examples=10), default_tokenizer())
    with torch.no_grad():
        trainer.model.lm_head.weight.fill_(3e38)
    assert not torch.isfinite(torch.linalg.vector_norm(trainer.model.lm_head.weight))
    trainer.check_finite_weights()


def test_a_nan_or_negative_learning_rate_set_after_construction_is_refused():
    trainer = Trainer(tiny("grpo"))
    for bad in (float("nan"), -1e-3, float("inf")):
        with pytest.raises(ValueError, match="learning_rate"):
            trainer.config.learning_rate = bad
    assert trainer.config.learning_rate == tiny("grpo").learning_rate
    config = SFTConfig()
    with pytest.raises(ValueError, match="weight_decay"):
        config.weight_decay = float("nan")


def corrupt(path: Path) -> None:
    """Overwrite the last 64 bytes (tensor data, not the header) with 0xFF: NaN in float32, same size."""
    data = bytearray(path.read_bytes())
    data[-64:] = b"\xff" * 64
    path.write_bytes(bytes(data))


def test_a_corrupted_tensor_is_refused_at_load(tmp_path):
    model, tokenizer, _ = load_checkpoint("addition_rl_start")
    folder = save_pretrained(model, tmp_path / "ckpt", tokenizer=tokenizer)
    size = (folder / "model.safetensors").stat().st_size
    corrupt(folder / "model.safetensors")
    assert (folder / "model.safetensors").stat().st_size == size
    with pytest.raises(CheckpointError, match="checksum"):
        from_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())  # a checkpoint without checksums (made elsewhere)
    del config["rlhf_lab"]["sha256"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="non-finite"):
        from_pretrained(folder)


def test_a_corrupted_resume_state_is_refused(tmp_path):
    trainer = Trainer(tiny("grpo"))
    trainer.train(steps=1)
    trainer.save_state(tmp_path / "state")
    corrupt(tmp_path / "state" / "policy.safetensors")
    fresh = Trainer(tiny("grpo"))
    with pytest.raises(CheckpointError, match="checksum"):
        fresh.resume(tmp_path / "state")
    assert fresh.step == 0  # nothing was half-loaded


def test_a_save_killed_between_its_two_renames_is_recovered(tmp_path):
    model, tokenizer, _ = load_checkpoint("addition_rl_start")
    folder = save_pretrained(model, tmp_path / "ckpt", tokenizer=tokenizer)
    dead = 2**22 + 12345  # above Linux's default pid_max (2**22): no live process has it
    # the kill came after `folder -> .ckpt.old-PID` and before `.ckpt.new-PID -> folder`:
    os.replace(folder, tmp_path / f".ckpt.old-{dead}")
    (tmp_path / f".ckpt.tmp-{dead}-x1").mkdir()  # and a half-written copy of another killed save
    reloaded, _, _ = load_checkpoint(folder)  # recovers instead of failing
    assert torch.equal(reloaded.lm_head.weight, model.lm_head.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    # when the complete new copy exists, it wins over the old one
    save_pretrained(model, tmp_path / "ckpt2", tokenizer=tokenizer)
    os.replace(folder, tmp_path / f".ckpt.old-{dead}")
    os.replace(tmp_path / "ckpt2", tmp_path / f".ckpt.new-{dead}")
    (tmp_path / f".ckpt.new-{dead}" / "marker").write_text("new")
    assert recover_folder(folder) and (folder / "marker").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_an_interrupted_save_keeps_the_previous_folder(tmp_path):
    replace_folder(tmp_path / "f", lambda tmp: (tmp / "a").write_text("old"))

    def interrupted(tmp):
        (tmp / "a").write_text("new")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replace_folder(tmp_path / "f", interrupted)
    assert (tmp_path / "f" / "a").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


# -------------------------------------------------------------------------------- bounded inputs


@pytest.fixture(scope="module")
def lab_model():
    model, tokenizer, _ = load_checkpoint("addition_rl_start")
    return model, tokenizer


def test_oversized_generations_are_refused_before_any_allocation(lab_model, monkeypatch):
    generate_module = importlib.import_module("rlhf_lab.sampling.generate")  # the module, not the function
    model, tokenizer = lab_model

    def no_allocation(*args, **kwargs):
        raise AssertionError("generate allocated its cache before refusing the request")

    monkeypatch.setattr(generate_module, "make_cache", no_allocation)
    prompts = ["123+456="] * 16
    with pytest.raises(ValueError, match="max_new_tokens must be <= 119"):  # 128 positions - 9 prompt tokens
        generate(model, prompts, SamplingConfig(max_new_tokens=10**6), tokenizer=tokenizer, num_return_sequences=8)
    # A fixed-length run may pass 128 positions (said out loud), not the RAM.
    with pytest.warns(UserWarning, match="past max_position_embeddings=128"), pytest.raises(ValueError, match="GiB"):
        generate(model, prompts, SamplingConfig(max_new_tokens=10**9), tokenizer=tokenizer, num_return_sequences=8,
                 stop_at_eos=False)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        generate(model, [[1, 5, 999]], SamplingConfig(max_new_tokens=2))


def test_oversized_rollouts_are_refused_at_construction(tmp_path, capsys):
    with pytest.raises(ValueError, match="max_completion_length must be <= "):
        Trainer(make_config("grpo", max_completion_length=10**6))
    with pytest.raises(SystemExit) as exc:
        main(["train", "--algo", "grpo", "--set", "max_completion_length=1000000", "--out", str(tmp_path / "run")])
    assert exc.value.code == 2 and "max_completion_length" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # a refused run leaves no folder behind


@pytest.mark.parametrize("careless, message", [
    (lambda: make_config("grpo", learnig_rate=1e-4), "unknown GRPOConfig field 'learnig_rate'; did you mean 'learning_rate'"),
    (lambda: make_config("grpo", task_params=3), "task_params must be a dict"),
    (lambda: make_config("grpo", eval_examples=10**6, n_test=20), r"eval_examples \(1000000\) must be <= n_test \(20\)"),
    (lambda: SFTConfig(learning_rate=float("inf")), "learning_rate must be a number, got inf"),
    (lambda: setattr(SamplingConfig(), "max_new_tokens", 0), "max_new_tokens must satisfy 1 <= max_new_tokens"),
], ids=["unknown field", "task_params", "eval_examples", "sft lr inf", "assigned max_new_tokens"])
def test_careless_settings_get_an_error_naming_the_field(careless, message):
    with pytest.raises(ValueError, match=message):
        careless()


def test_careless_checkpoints_and_tokenizers_get_clear_errors(tmp_path, lab_model):
    model, tokenizer = lab_model
    folder = save_pretrained(model, tmp_path / "ckpt", tokenizer=tokenizer)
    config_text = (folder / "config.json").read_text()
    for text, message in (("[1, 2]", "must hold a JSON object"), ('{"hidden_size": 64}', "lacks .*vocab_size")):
        (folder / "config.json").write_text(text)
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(folder)
    (folder / "config.json").write_text(config_text)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        load_checkpoint(folder)
    assert load_checkpoint(folder, default_tokenizer=True)[1] is not None  # unless the caller asks for the default
    wide = type(tokenizer)("0123456789+=:;,abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    with pytest.raises(ValueError, match=f"the tokenizer has {len(wide)} tokens but the model's vocab_size is"):
        Trainer(tiny("grpo"), model=load_checkpoint("addition_rl_start")[0], tokenizer=wide)


# -------------------------------------------------- broken files, bad settings, rewards, large inputs


def broken_state(tmp_path: Path, how: str) -> Path:
    """A saved GRPO state, then broken `how`; the checksums in trainer_state.json are kept up to date
    (a careful hand edit), so only the content can tell."""
    state = tmp_path / "state"
    trainer = Trainer(tiny("grpo"))
    trainer.train(steps=1)
    trainer.save_state(state)
    summary_path, pt = state / "trainer_state.json", state / "trainer_state.pt"
    summary = json.loads(summary_path.read_text())
    if how == "no config":
        del summary["config"]
    elif how == "a JSON string":
        summary = "trainer state"
    elif how == "empty state":
        torch.save({}, pt)
    elif how == "truncated":
        pt.write_bytes(pt.read_bytes()[: pt.stat().st_size // 2])
    elif how == "unsafe pickle":
        torch.save({"step": collections.OrderedDict(), "hook": Path("x")}, pt)  # a Path: a full unpickler
    if isinstance(summary, dict):
        summary["sha256"]["trainer_state.pt"] = hashlib.sha256(pt.read_bytes()).hexdigest()
    summary_path.write_text(json.dumps(summary))
    return state


@pytest.mark.parametrize("how, message", [
    ("no config", r"trainer_state.json has no 'config' dict"),
    ("a JSON string", r"trainer_state.json must hold a JSON object, got a str"),
    ("empty state", r"trainer_state.pt has no 'step' int"),
    ("truncated", r"trainer_state.pt is corrupt or truncated"),
    ("unsafe pickle", r"trainer_state.pt was refused as unsafe"),
])
def test_a_broken_resume_state_is_named_and_nothing_is_loaded(tmp_path, how, message):
    state = broken_state(tmp_path, how)
    fresh = Trainer(tiny("grpo"))
    before = {k: v.clone() for k, v in fresh.policy.state_dict().items()}
    with pytest.raises(CheckpointError, match=message):
        fresh.resume(state)
    assert fresh.step == 0 and not fresh.optimizer.state
    assert all(torch.equal(before[k], v) for k, v in fresh.policy.state_dict().items())  # weights untouched


def test_resume_refuses_starting_weights_that_changed(tmp_path):
    """The reference model (KL to pi_ref, beta > 0) is not saved: it is the starting checkpoint, loaded
    again. Changed on disk between the stop and the resume, it would silently be another pi_ref."""
    model, tokenizer, _ = load_checkpoint("addition_rl_start")
    start = save_pretrained(model, tmp_path / "start", tokenizer=tokenizer)
    config = tiny("grpo", beta=0.1, init_checkpoint=str(start))
    trainer = Trainer(config)
    trainer.train(steps=1)
    trainer.save_state(tmp_path / "state")
    Trainer(config).resume(tmp_path / "state")  # the same weights: fine
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)
    save_pretrained(model, start, tokenizer=tokenizer)
    fresh = Trainer(config)
    changed = r"the run's reference \(sha256 \w+ when the run started, \w+ now\) changed"
    with pytest.raises(CheckpointError, match=changed):
        fresh.resume(tmp_path / "state")
    assert fresh.step == 0


def test_resume_refuses_a_reward_model_that_changed(tmp_path):
    reward_model = RewardModel.from_pretrained("reward_model")
    trainer = Trainer(tiny("grpo"), reward_fn=TimedReward(reward_model))  # found inside a wrapper too
    trainer.train(steps=1)
    trainer.save_state(tmp_path / "state")
    with torch.no_grad():
        reward_model.model.value_head.weight.add_(0.01)
    with pytest.raises(CheckpointError, match=r"the run's reward_model \(sha256 \w+ when the run started"):
        Trainer(tiny("grpo"), reward_fn=reward_model).resume(tmp_path / "state")


def test_every_shipped_checkpoint_carries_the_sha256_of_its_weights(tmp_path, monkeypatch):
    shipped = [p for p in CHECKPOINT_DIR.iterdir() if (p / "config.json").is_file()]
    assert len(shipped) >= 6
    for folder in shipped:
        checksums = json.loads((folder / "config.json").read_text())["rlhf_lab"]["sha256"]
        files = sorted(p.name for p in folder.glob("*.safetensors"))
        assert sorted(checksums) == files, folder.name
        for name in files:
            assert checksums[name] == hashlib.sha256((folder / name).read_bytes()).hexdigest(), (folder, name)
    # a flipped weight byte is refused, and a shipped checkpoint without checksums too
    copies = tmp_path / "checkpoints"
    shutil.copytree(CHECKPOINT_DIR / "addition_sft", copies / "addition_sft")
    monkeypatch.setattr(loader, "CHECKPOINT_DIR", copies)
    weights = copies / "addition_sft" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01  # a tiny change of one weight: finite, so only the checksum can tell
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint("addition_sft")
    config = json.loads((copies / "addition_sft" / "config.json").read_text())
    del config["rlhf_lab"]["sha256"]
    (copies / "addition_sft" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="carries no sha256 of model.safetensors"):
        load_checkpoint("addition_sft")


def shard_with_a_broken_index(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "model-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text("{weight_map: ")


def rope_theta_abc(folder: Path) -> None:
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"rope_theta": 10000.0', '"rope_theta": "abc"'))


@pytest.mark.parametrize("damage, message", [
    (lambda f: (f / "tokenizer.json").write_text("{}"), r"tokenizer files \(tokenizer.json"),
    (lambda f: (f / "tokenizer.json").write_bytes(random.Random(0).randbytes(2048)), r"tokenizer files"),
    (shard_with_a_broken_index, r"index.json is not a JSON object"),
    (rope_theta_abc, r"config.json: rope_theta must be a number, got 'abc'"),
], ids=["tokenizer {}", "tokenizer random bytes", "index not JSON", "rope_theta abc"])
def test_a_damaged_checkpoint_file_is_named(tmp_path, lab_model, damage, message):
    model, tokenizer = lab_model
    folder = save_pretrained(model, tmp_path / "ckpt", tokenizer=tokenizer)
    damage(folder)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(folder)


def test_sft_and_dpo_refuse_a_batch_that_cannot_fit_before_allocating():
    with pytest.raises(ValueError, match="an SFT step of 100000000000 examples would need .* batch_size"):
        SFTTrainer(SFTConfig(batch_size=10**11, n_train=50, n_test=10, eval_examples=10), default_tokenizer())
    trainer = SFTTrainer(SFTConfig(n_train=50, n_test=10, eval_examples=10), default_tokenizer())
    trainer.config.batch_size = 10**11  # raised after construction: refused when train() starts
    with pytest.raises(ValueError, match="lower batch_size"):
        trainer.train(steps=1)
    assert trainer.step == 0
    pairs = [("12+34=", "64", "65")] * 4
    with pytest.raises(ValueError, match="a DPO step of 100000000000 pairs would need .* lower batch_size"):
        DPOTrainer(DPOConfig(batch_size=10**11), pairs=pairs)


def test_sequences_past_the_models_context_are_refused(lab_model):
    model, tokenizer = lab_model
    long = "1" * 200
    too_long = r"the longest training pair \(prompt \+ completion\) has 2\d\d tokens, more than the model's "
    with pytest.raises(ValueError, match=too_long + r"max_position_embeddings \(128\)"):
        DPOTrainer(DPOConfig(), pairs=[("12+34=", long, "65")])
    reward_model = RewardModel(copy.deepcopy(model), tokenizer)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        reward_model.score_batch(["12+34="], [long])


@pytest.mark.parametrize("make, field", [
    (lambda: DPOConfig(eval_examples=501), r"eval_examples \(501\) must be <= n_test \(500\)"),
    (lambda: setattr(DPOConfig(), "beta", -1), "beta must satisfy 0 < beta"),
    (lambda: setattr(DPOConfig(), "learning_rate", -1), "learning_rate must satisfy 0 < learning_rate <= 1"),
    (lambda: setattr(RewardConfig(), "learning_rate", -1), "learning_rate must satisfy 0 < learning_rate"),
    (lambda: setattr(RewardConfig(), "batch_size", 0), "batch_size must satisfy 1 <= batch_size"),
    (lambda: make_config("grpo", learning_rate=1e30), "learning_rate must satisfy 0 < learning_rate <= 1"),
    (lambda: SFTConfig(learning_rate=1e6), "learning_rate must satisfy 0 < learning_rate <= 1"),
    (lambda: DPOConfig(learning_rate=2.0), "learning_rate must satisfy 0 < learning_rate <= 1"),
], ids=["dpo eval_examples", "dpo beta", "dpo lr", "reward lr", "reward batch", "rl lr 1e30", "sft lr 1e6",
        "dpo lr 2"])
def test_every_config_refuses_bad_values_at_construction_and_on_assignment(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_a_run_whose_accuracy_collapses_to_zero_says_so():
    model, tokenizer, _ = load_checkpoint("addition_rl_start")  # ~45% on these problems
    config = SFTConfig(steps=3, learning_rate=1.0, warmup_steps=0, eval_every=3, n_train=200, n_test=40,
                       eval_examples=40, batch_size=8)
    trainer = SFTTrainer(config, tokenizer, model=model)
    with pytest.warns(RuntimeWarning, match=r"held-out accuracy collapsed from \d+\.\d% to 0 by step 3.*"
                                            r"learning_rate=1.0"):
        history = trainer.train()
    assert history["eval_accuracy"].iloc[0] > 0 and history["eval_accuracy"].iloc[-1] == 0


def test_bad_preference_data_is_named_by_line(tmp_path):
    pair = json.loads(load_preferences("validation")[0].to_json())
    path = tmp_path / "pairs.jsonl"
    for change, message in (({"chosen": 5}, "chosen must be a string, got 5"),
                            ({"votes": "x"}, "votes must be a dict, got 'x'"),
                            ({"votes": {"ann": "x"}}, "votes must map annotator names to 1"),
                            ({"gold_chosen": "high"}, "gold_chosen must be a number")):
        path.write_text(json.dumps(pair) + "\n" + json.dumps({**pair, **change}) + "\n")
        with pytest.raises(ValueError, match=f"pairs.jsonl:2: not a preference pair \\({message}"):
            read_preferences(path)


def test_empty_evaluation_sets_and_bad_reward_callables_are_refused():
    trainer = Trainer(tiny("grpo"))
    with pytest.raises(ValueError, match="examples must hold at least one Example"):
        trainer.evaluate(examples=[])
    contract = r"reward_fn must be a callable \(prompt, completion, answer, finished\).*got 5"
    with pytest.raises(ValueError, match=contract):
        Trainer(tiny("grpo"), reward_fn=5)
    with pytest.raises(ValueError, match=r"cannot take those four arguments"):
        Trainer(tiny("grpo"), reward_fn=lambda prompt, completion: 1.0)


@pytest.mark.parametrize("value, shown", [(10**400, "an integer of about 401 digits"), (1e39, "1.000e+39")])
def test_a_reward_beyond_float32_is_named_as_such(value, shown):
    trainer = Trainer(tiny("grpo"), reward_fn=lambda prompt, completion, answer, finished: value)
    with pytest.warns(RuntimeWarning, match=f"returned {re.escape(shown)} .* beyond float32's range"):
        trainer.train(steps=1)
    assert trainer.stop_reason == "non_finite" and trainer.step == 0


def test_settings_that_cannot_work_are_refused_at_construction():
    with pytest.raises(ValueError, match=r"overlong_buffer must satisfy 0 <= overlong_buffer <= 8"):
        make_config("dapo", overlong_buffer=1000, max_completion_length=8)
    with pytest.raises(ValueError, match=r"overlong_buffer must satisfy 0 <= overlong_buffer <= \d"):
        Trainer(tiny("dapo", overlong_buffer=1000))  # the budget comes from the task
    with pytest.raises(ValueError, match="task 'countdown' writes free text.*needs a BPE tokenizer"):
        SFTTrainer(SFTConfig(task="countdown", task_params={}, n_train=20, n_test=10, eval_examples=10),
                   default_tokenizer())


class within_seconds:
    """A watchdog: fail the block if it runs for more than `seconds` (a hang, not a speed test: the
    limit is hundreds of times what the block needs)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds

    def _fail(self, signum, frame):
        raise AssertionError(f"still running after {self.seconds} s: a hang")

    def __enter__(self):
        self.previous = signal.signal(signal.SIGALRM, self._fail)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)


def every_reward():
    """Every rule-based reward of every registered task (its default reward and its accuracy)."""
    tasks = {name: get_task(name) for name in TASKS}
    rewards = {f"{name}.{kind}": getattr(task, kind) for name, task in tasks.items()
               for kind in ("reward", "score")}
    return {**rewards, "number": number_answer_reward, "countdown": countdown_answer_reward}


def test_rewards_never_raise_on_model_output():
    prompt = "Using the numbers [3, 5, 7], create an equation that equals 22."
    for text in ("<think>x</think><answer>" + "1" * 5000 + "</answer>", "<answer>" + "9" * 5000 + "</answer>",
                 "<answer>1e99999</answer>", "\x00\udcff<answer>", ""):
        for name, reward in every_reward().items():
            assert reward(prompt, text, "12", True) in (0.0, 0.1), (name, text[:40])


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="the watchdog needs SIGALRM")
def test_rewards_take_linear_time_on_a_megabyte_completion():
    """1 MB of each pattern that made a backtracking regex quadratic (4 s at 80 kB, hours at 1 MB)."""
    size = 1 << 20
    prompt = "Using the numbers [3, 5, 7], create an equation that equals 22."
    with within_seconds(120):
        for unit in ("<answer>", "<think>", "</think><answer>", "<answer>1", "1", "7+5=12;"):
            for tail in ("", "</answer>", "</think><answer>1</answer>"):
                text = unit * (size // len(unit)) + tail
                for name, reward in every_reward().items():
                    assert 0.0 <= reward(prompt, text, "12", True) <= 1.1, name


def test_the_think_answer_parsers_equal_their_regular_expressions():
    """is_think_answer and extract_tagged_answer read the tags in one pass; the regular expressions
    they replace are the definition, compared on 20,000 random mixes of tags, whitespace and text."""
    tag = r"</?(?:think|answer)>"
    shape = re.compile(r"\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*", re.DOTALL)

    def is_shape(text):
        match = shape.fullmatch(text)
        return match is not None and not any(re.search(tag, match.group(g)) for g in ("think", "answer"))

    def last_answer(text):
        blocks = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
        return None if not blocks or re.search(tag, blocks[-1]) else blocks[-1].strip()

    pieces = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "\u00a0", "x", "12", "<", ">",
              "answer>"]
    rng = random.Random(0)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 9)))
        assert is_think_answer(text) == is_shape(text), text
        assert extract_tagged_answer(text) == last_answer(text), text
