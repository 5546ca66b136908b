"""SFT: config validation, the learning-rate schedule, the completion-only loss mask, the trainer
(continue, time budget, Stop, NaN, distillation data), determinism, learning, and the `sft` CLI."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

import rlhf_lab.sft as sft_module
from rlhf_lab.checkpoints import load_checkpoint
from rlhf_lab.checkpoints.presets import PRESETS
from rlhf_lab.cli import main
from rlhf_lab.model import LlamaModel
from rlhf_lab.sft import (
    SFTConfig,
    SFTTrainer,
    completion_loss,
    encode_examples,
    lab_model_config,
    train_sft,
)
from rlhf_lab.tasks import Example, get_task
from rlhf_lab.text.tokenizer import default_tokenizer
from rlhf_lab.train.callbacks import Callback
from rlhf_lab.train.schedule import SCHEDULES, learning_rate_at

TOKENIZER = default_tokenizer()
# Small enough that 30-60 steps take a second or two; still a real (GQA, 2-layer) lab model.
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, initializer_range=0.06)


def tiny_config(steps: int, seed: int = 0, learning_rate: float = 3e-3, **overrides) -> SFTConfig:
    settings = dict(task_params={"digits": 2}, n_train=400, n_test=20, steps=steps, batch_size=16,
                    learning_rate=learning_rate, warmup_steps=5, eval_every=0, eval_examples=20, seed=seed)
    return SFTConfig(**(settings | overrides))


def tiny_model(seed: int = 0) -> LlamaModel:
    torch.manual_seed(seed)
    return LlamaModel(lab_model_config(TOKENIZER, **TINY))


def tiny_run(steps: int, seed: int = 0, learning_rate: float = 3e-3):
    return train_sft(tiny_config(steps, seed, learning_rate), TOKENIZER, model=tiny_model(seed),
                     progress=False)


def tiny_trainer(steps: int = 5, callbacks=(), **overrides) -> SFTTrainer:
    return SFTTrainer(tiny_config(steps, **overrides), TOKENIZER, model=tiny_model(), callbacks=callbacks)


def assert_same_weights(model_a, model_b, why: str) -> None:
    for (name, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs: {why}"


def assert_same_optimizer(trainer_a: SFTTrainer, trainer_b: SFTTrainer, why: str) -> None:
    state_a, state_b = trainer_a.optimizer.state_dict()["state"], trainer_b.optimizer.state_dict()["state"]
    assert state_a.keys() == state_b.keys(), why
    for key in state_a:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(state_a[key][name], state_b[key][name]), f"AdamW {name} of param {key}: {why}"


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"task_params": {"digits": 0}}, "digits"),
        ({"steps": -1}, "steps"),
        ({"batch_size": 0}, "batch_size"),
        ({"task": "multiplication"}, "task"),
        ({"task_params": {"digits": 3, "answer_format": "xml"}}, "answer_format"),
        ({"task_params": {"width": 3}}, "width"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"stop_at_accuracy": 1.5}, "stop_at_accuracy"),
        ({"data_seed": -2}, "data_seed"),
        ({"learning_rate": math.inf}, "learning_rate"),
        ({"weight_decay": math.nan}, "weight_decay"),
        ({"max_grad_norm": math.inf}, "max_grad_norm"),
        ({"time_budget": 0.0}, "time_budget"),
        ({"steps": True}, "steps"),
    ],
)
def test_invalid_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SFTConfig(**kwargs)


def test_loss_mask_covers_completion_and_eos_only():
    examples = [Example(prompt="047+085=", answer="231", completion="231"),
                Example(prompt="1+2=", answer="3", completion="3")]
    ids, mask = encode_examples(TOKENIZER, examples)
    bos, eos, pad = TOKENIZER.bos_token_id, TOKENIZER.eos_token_id, TOKENIZER.pad_token_id
    assert ids[0].tolist() == [bos, *TOKENIZER.encode("047+085=231"), eos]
    assert mask[0].tolist() == [0.0] * 9 + [1.0] * 4  # <bos> + 8 prompt chars unmasked; '2' '3' '1' <eos>
    assert ids[1].tolist() == [bos, *TOKENIZER.encode("1+2=3"), eos] + [pad] * 6
    assert mask[1].tolist() == [0.0] * 5 + [1.0] * 2 + [0.0] * 6  # padding is not trained on


def test_completion_loss_is_mean_cross_entropy_over_masked_targets():
    torch.manual_seed(0)
    model = LlamaModel(lab_model_config(TOKENIZER, **TINY))
    examples = [Example(
        prompt="12+34=", answer="64", completion="64"), Example(prompt="5+5=", answer="01", completion="01")]
    ids, mask = encode_examples(TOKENIZER, examples)
    with torch.no_grad():
        loss = completion_loss(model, ids, mask)
        logprobs = F.log_softmax(model(ids).logits.float(), dim=-1)
    # Recompute by hand: the token at position t is predicted from position t-1.
    terms = [-logprobs[row, t - 1, ids[row, t]] for row in range(len(ids)) for t in range(1, ids.shape[1])
             if mask[row, t]]
    assert len(terms) == 3 + 3  # two completion digits + EOS per example
    assert loss.item() == pytest.approx(torch.stack(terms).mean().item(), rel=1e-5)


def reference_sft_lr_at(step: int, learning_rate: float, warmup_steps: int, steps: int) -> float:
    """sft.py's schedule before schedule.py existed (0-based step), verbatim."""
    if step < warmup_steps:
        return learning_rate * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def reference_rl_lr(step: int, learning_rate: float, warmup_steps: int) -> float:
    """The RL trainer's schedule before schedule.py existed (1-based step), verbatim."""
    return learning_rate * min(1.0, step / warmup_steps) if warmup_steps else learning_rate


@pytest.mark.parametrize("learning_rate", [3e-3, 1e-3, 7e-4, 1e-5])
@pytest.mark.parametrize("warmup_steps, "
                         "total_steps", [(100, 2000), (10, 100), (0, 50), (5, 3), (7, 7), (3, 1)])
def test_learning_rate_at_reproduces_the_old_schedules_bit_for_bit(learning_rate, warmup_steps, total_steps):
    for step in range(1, total_steps + warmup_steps + 20):
        sft = learning_rate_at(step, learning_rate, warmup_steps, total_steps, schedule="cosine")
        assert sft == reference_sft_lr_at(step - 1, learning_rate, warmup_steps, total_steps), (
            f"cosine, step {step}: is the step 1-based (old step + 1) and the warm-up lr * step / warmup?")
        rl = learning_rate_at(step, learning_rate, warmup_steps, schedule="constant")
        assert rl == reference_rl_lr(step, learning_rate, warmup_steps), (
            f"constant, step {step}: the RL warm-up is lr * (step / warmup), rounded that way")


def test_learning_rate_at_warms_up_then_decays_to_min_fraction():
    lr = 1e-3
    assert SCHEDULES == ("constant", "cosine")
    assert learning_rate_at(1, lr, warmup_steps=10, total_steps=100, schedule="cosine") == pytest.approx(1e-4)
    assert learning_rate_at(10, lr, warmup_steps=10, total_steps=100, schedule="cosine") == pytest.approx(lr)
    assert learning_rate_at(11, lr, warmup_steps=10, total_steps=100, schedule="cosine") == pytest.approx(lr)
    halfway = learning_rate_at(56, lr, warmup_steps=10, total_steps=100, schedule="cosine")
    assert halfway == pytest.approx(lr * (0.1 + 0.9 * 0.5))
    for step in (101, 500):  # a run continued past total_steps stays at the floor
        assert learning_rate_at(step, lr, 10, 100, schedule="cosine") == pytest.approx(1e-4)
    assert learning_rate_at(101, lr, 10, 100, schedule="cosine", min_fraction=0.0) == pytest.approx(0.0)
    assert learning_rate_at(1, lr) == lr and learning_rate_at(5000, lr, warmup_steps=10) == lr
    assert learning_rate_at(5, lr, warmup_steps=10) == pytest.approx(lr / 2)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"step": 0}, "step"),
        ({"learning_rate": math.inf}, "learning_rate"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"schedule": "linear"}, "schedule"),
        ({"schedule": "cosine"}, "total_steps"),  # a cosine needs to know where it ends
        ({"total_steps": 0}, "total_steps"),
        ({"min_fraction": 1.5}, "min_fraction"),
    ],
)
def test_learning_rate_at_rejects_bad_arguments(kwargs, field):
    arguments = dict(step=1, learning_rate=1e-3) | kwargs
    with pytest.raises(ValueError, match=field):
        learning_rate_at(**arguments)


def test_trainer_uses_the_cosine_schedule_of_its_config():
    trainer = tiny_trainer(steps=8, warmup_steps=3)
    history = trainer.train()
    expected = [learning_rate_at(step, 3e-3, 3, 8, schedule="cosine") for step in range(1, 9)]
    assert history["lr"].iloc[1:].tolist() == expected


# ----------------------------------------------------------------------------------------------
# SFTTrainer


class Recorder(Callback):
    def __init__(self) -> None:
        self.events: list = []

    def on_train_begin(self, trainer) -> None:
        self.events.append(("begin", trainer.step))

    def on_step_end(self, trainer, metrics, distributions=None) -> None:
        self.events.append(("step", metrics["step"], distributions))

    def on_train_end(self, trainer) -> None:
        self.events.append(("end", trainer.step, trainer.stop_reason))


def test_trainer_history_callbacks_and_step_zero():
    recorder = Recorder()
    trainer = tiny_trainer(steps=4, callbacks=[recorder], eval_every=2)
    history = trainer.train()
    assert history["step"].tolist() == [0, 1, 2, 3, 4]
    assert list(history.columns[:8]) == ["step", "wall_time", "step_time", "loss", "eval_accuracy", "lr",
                                         "grad_norm", "tokens_per_s"]
    # 0, every 2, the last
    assert history["eval_accuracy"].notna().tolist() == [True, False, True, False, True]
    assert math.isnan(history["loss"].iloc[0]) and history["loss"].iloc[1:].gt(0).all()
    assert history["tokens_per_s"].iloc[1:].gt(0).all() and history["grad_norm"].iloc[1:].gt(0).all()
    # wall_time is training time: the sum of the step times, evaluations excluded
    assert history["wall_time"].iloc[-1] == pytest.approx(history["step_time"].sum())
    assert history["wall_time"].iloc[-1] == pytest.approx(trainer.train_time)
    assert recorder.events == [("begin", 0), ("step", 1, None), ("step", 2, None), ("step", 3, None),
                               ("step", 4, None), ("end", 4, "steps")]
    assert trainer.stop_reason == "steps" and trainer.step == 4 and not trainer.model.training
    assert history.attrs["config"]["steps"] == 4
    late = Recorder()
    trainer.add_callback(late)
    trainer.train(steps=1)
    assert late.events == [("begin", 4), ("step", 5, None), ("end", 5, "steps")]


def test_train_can_be_called_again_to_continue():
    once = tiny_trainer(steps=5)
    once.train()
    twice = tiny_trainer(steps=5)
    optimizer = twice.optimizer
    twice.train(steps=3)
    assert twice.step == 3 and twice.stop_reason == "steps"
    history = twice.train(steps=2)
    assert twice.optimizer is optimizer and twice.step == 5
    assert history["step"].tolist() == [0, 1, 2, 3, 4, 5]  # one step-0 row, the step counter goes on
    assert history["loss"].tolist()[1:] == once.history["loss"].tolist()[1:]
    assert_same_weights(once.model, twice.model, "3 + 2 steps should equal 5 steps (same batches, same lr)")
    assert_same_optimizer(once, twice, "3 + 2 steps should equal 5 steps")


def test_time_budget_stops_after_the_step_that_spends_it():
    trainer = tiny_trainer(steps=100, eval_every=50)
    history = trainer.train(time_budget=1e-9)
    assert trainer.step == 1 and trainer.stop_reason == "time_budget"
    assert not math.isnan(history["eval_accuracy"].iloc[-1]), "the last step of a budget is evaluated"
    budgeted = tiny_trainer(steps=100, time_budget=1e-9)  # the config's field is the default
    budgeted.train()
    assert budgeted.step == 1 and budgeted.stop_reason == "time_budget"
    assert budgeted.train(steps=2, time_budget=3600.0) is not None and budgeted.step == 3  # steps come first


def test_stop_at_accuracy(monkeypatch):
    trainer = tiny_trainer(steps=20, eval_every=4, stop_at_accuracy=0.5)
    monkeypatch.setattr(trainer, "evaluate", lambda examples=None: 0.6)
    trainer.train()
    assert trainer.step == 4 and trainer.stop_reason == "stop_at_accuracy"


def test_interrupt_in_a_step_keeps_the_model_of_the_last_completed_step(capsys):
    reference = tiny_trainer(steps=5)
    reference.train(steps=2)
    trainer = tiny_trainer(steps=5)
    real_step = trainer.optimizer.step
    calls = []

    def step_then_stop(*args, **kwargs):
        calls.append(1)
        real_step(*args, **kwargs)  # the weights and AdamW state are already changed when Stop arrives
        if len(calls) == 3:
            raise KeyboardInterrupt

    trainer.optimizer.step = step_then_stop
    recorder = Recorder()
    trainer.add_callback(recorder)
    history = trainer.train()
    assert trainer.stop_reason == "interrupted" and trainer.step == 2
    assert history["step"].tolist() == [0, 1, 2]
    assert recorder.events[-1] == ("end", 2, "interrupted"), "on_train_end must run after Stop"
    assert "interrupted after step 2; model and history are intact" in capsys.readouterr().out
    assert_same_weights(reference.model, trainer.model, "a half-done step leaked into the model (restore it)")
    assert_same_optimizer(reference, trainer, "a half-done step leaked into the AdamW state")
    # Continuing gives exactly the uninterrupted run: the interrupted step's batch is drawn again.
    trainer.optimizer.step = real_step
    trainer.train(steps=3)
    reference.train(steps=3)
    assert_same_weights(reference.model, trainer.model, "resuming after Stop should redo the lost step")


def test_non_finite_loss_stops_and_keeps_the_last_good_weights(monkeypatch):
    reference = tiny_trainer(steps=5)
    reference.train(steps=2)
    calls = []

    def loss_that_explodes(model, input_ids, loss_mask):
        calls.append(1)
        loss = completion_loss(model, input_ids, loss_mask)
        return loss * math.nan if len(calls) == 3 else loss

    monkeypatch.setattr(sft_module, "completion_loss", loss_that_explodes)
    trainer = tiny_trainer(steps=5)
    with pytest.warns(RuntimeWarning, match="at step 3"):
        history = trainer.train()
    assert trainer.stop_reason == "non_finite" and trainer.step == 2 and history["step"].tolist() == [0, 1, 2]
    assert_same_weights(reference.model, trainer.model, "a NaN step must not change the weights")
    calls.clear()
    with pytest.raises(FloatingPointError, match="step 3"), pytest.warns(RuntimeWarning):
        train_sft(tiny_config(5), TOKENIZER, model=tiny_model(), progress=False)


class StopAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer, metrics, distributions=None):
        if metrics["step"] == self.step:
            raise KeyboardInterrupt


def test_train_sft_reraises_a_keyboard_interrupt():
    with pytest.raises(KeyboardInterrupt):  # a script must not save a half-trained checkpoint
        train_sft(tiny_config(5), TOKENIZER, model=tiny_model(), callbacks=[StopAt(2)], progress=False)


def test_train_sft_history_is_the_trainers():
    seen = []

    class Record(Callback):
        def on_step_end(self, trainer, metrics, distributions=None):
            seen.append(metrics["step"])

    config = tiny_config(6, eval_every=3)
    model, history = train_sft(config, TOKENIZER, model=tiny_model(), callbacks=[Record()], progress=False)
    assert history["step"].tolist() == [0, 1, 2, 3, 4, 5, 6]  # step 0: where training started
    assert history["eval_accuracy"].notna().tolist() == [True, False, False, True, False, False, True]
    assert seen == [1, 2, 3, 4, 5, 6]
    assert history.attrs["config"] == dataclasses.asdict(config)
    assert not model.training


def test_trainer_learns_given_examples_and_scores_with_the_config_task():
    # Distillation's data path: a "teacher" that always answers "77". The student must imitate it,
    # while evaluation still scores real addition on the task's held-out split.
    config = tiny_config(40, learning_rate=1e-2)
    task = get_task(config.task, **config.task_params)
    train, test = task.make_split(config.data_seed, config.n_train, config.n_test)
    teacher = [Example(prompt=e.prompt, answer=e.answer, completion="77") for e in train[:64]]
    trainer = SFTTrainer(config, TOKENIZER, model=tiny_model(), train_examples=teacher)
    assert trainer.train_examples == teacher and len(trainer.input_ids) == 64
    assert trainer.eval_examples == test[: config.eval_examples]
    history = trainer.train()
    assert history["loss"].iloc[-5:].mean() < 0.3, "the student did not learn the teacher's constant answer"
    imitated = [Example(prompt=e.prompt, answer="77", completion="77") for e in test]
    assert trainer.evaluate(imitated) == 1.0
    assert trainer.evaluate() < 0.5, "evaluate() must score config.task's answers, not the teacher's"
    with pytest.raises(ValueError, match="train_examples"):
        SFTTrainer(config, TOKENIZER, model=tiny_model(), train_examples=[])


def test_sft_is_deterministic_for_a_seed():
    model_a, history_a = tiny_run(30, seed=3)
    model_b, history_b = tiny_run(30, seed=3)
    losses = lambda history: history["loss"].iloc[1:].tolist()  # noqa: E731  (row 0: before training, NaN)
    assert losses(history_a) == losses(history_b)
    assert_same_weights(model_a, model_b, "two runs with the same seed")
    _, history_c = tiny_run(30, seed=4)
    assert losses(history_c) != losses(history_a), "the seed should change the run"


def test_short_run_lowers_the_loss():
    _, history = tiny_run(60, learning_rate=1e-2)
    assert len(history) == 61 and history["step"].iloc[-1] == 60
    first, last = history["loss"].iloc[1:6].mean(), history["loss"].iloc[-5:].mean()
    assert first > 3.0  # ~log(vocab) at initialisation
    assert last < first - 1.0, f"loss went from {first:.2f} to {last:.2f} in 60 steps"


def test_cli_sft_writes_a_loadable_checkpoint(tmp_path, capsys):
    assert main(["sft", "--preset", "addition_rl_start", "--steps", "4", "--lr", "1e-3", "--seed", "1",
                 "--out", str(tmp_path), "--quiet"]) == 0
    folder = tmp_path / "addition_rl_start"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in folder.iterdir()}
    model, tokenizer, meta = load_checkpoint(folder)
    assert meta["steps"] == 4 and meta["sft"]["learning_rate"] == 1e-3 and meta["sft"]["seed"] == 1
    assert meta["overrides"] == {"steps": 4, "learning_rate": 1e-3, "seed": 1}
    # the rest is the preset's
    assert meta["sft"]["eval_every"] == PRESETS["addition_rl_start"].sft.eval_every
    assert not meta["in_band"] and 0.0 <= meta["accuracy"] < 0.3  # 4 steps cannot learn addition
    assert meta["num_parameters"] == model.num_parameters()
    logits = model(torch.tensor([tokenizer.encode("123+456=", add_bos=True)])).logits
    assert logits.shape == (1, 9, len(tokenizer)) and torch.isfinite(logits).all()
    assert "OUTSIDE the band" in capsys.readouterr().out
    readme = (tmp_path / "README.md").read_text()
    assert "`addition_rl_start`" in readme and "| 4 |" in readme
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llama"


def test_cli_rejects_invalid_overrides(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sft", "--preset", "addition_sft", "--batch-size", "0", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "batch_size must satisfy 1 <= batch_size, got 0" in capsys.readouterr().err
    assert not (tmp_path / "addition_sft").exists()


def test_cli_data_writes_the_task_files(tmp_path):
    out = tmp_path / "tasks"
    assert main(["data", "--out-dir", str(out), "--n-train", "12", "--n-test", "4", "--n-ood", "3"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tasks"]["addition"]["files"]["train"]["examples"] == 12
    assert len((out / "addition_test.jsonl").read_text().splitlines()) == 4
