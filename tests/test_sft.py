"""SFT: config validation, the completion-only loss mask, determinism, learning, and the `sft` CLI."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from rlhf_lab.cli import main
from rlhf_lab.model import LlamaModel
from rlhf_lab.presets import PRESETS, load_checkpoint
from rlhf_lab.sft import SFTConfig, completion_loss, encode_examples, lab_model_config, lr_at, train_sft
from rlhf_lab.tasks import Example
from rlhf_lab.tokenizer import default_tokenizer

TOKENIZER = default_tokenizer()
# Small enough that 30-60 steps take a second or two; still a real (GQA, 2-layer) lab model.
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, initializer_range=0.06)


def tiny_run(steps: int, seed: int = 0, learning_rate: float = 3e-3):
    config = SFTConfig(task_params={"digits": 2}, n_train=400, n_test=20, steps=steps, batch_size=16,
                       learning_rate=learning_rate, warmup_steps=5, eval_every=0, eval_examples=20, seed=seed)
    torch.manual_seed(seed)
    model = LlamaModel(lab_model_config(TOKENIZER, **TINY))
    return train_sft(config, TOKENIZER, model=model, progress=False)


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
    examples = [Example(prompt="12+34=", answer="64", completion="64"), Example(prompt="5+5=", answer="01", completion="01")]
    ids, mask = encode_examples(TOKENIZER, examples)
    with torch.no_grad():
        loss = completion_loss(model, ids, mask)
        logprobs = F.log_softmax(model(ids).logits.float(), dim=-1)
    # Recompute by hand: the token at position t is predicted from position t-1.
    terms = [-logprobs[row, t - 1, ids[row, t]] for row in range(len(ids)) for t in range(1, ids.shape[1]) if mask[row, t]]
    assert len(terms) == 3 + 3  # two completion digits + EOS per example
    assert loss.item() == pytest.approx(torch.stack(terms).mean().item(), rel=1e-5)


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    config = SFTConfig(steps=100, warmup_steps=10, learning_rate=1e-3)
    assert lr_at(0, config) == pytest.approx(1e-4)
    assert lr_at(9, config) == pytest.approx(1e-3)
    assert lr_at(55, config) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # half way through the cosine
    assert lr_at(100, config) == pytest.approx(1e-4)


def test_sft_is_deterministic_for_a_seed():
    model_a, history_a = tiny_run(30, seed=3)
    model_b, history_b = tiny_run(30, seed=3)
    assert history_a["loss"].tolist() == history_b["loss"].tolist()
    for (name, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs between two runs with the same seed"
    _, history_c = tiny_run(30, seed=4)
    assert history_c["loss"].tolist() != history_a["loss"].tolist(), "the seed should change the run"


def test_short_run_lowers_the_loss():
    _, history = tiny_run(60, learning_rate=1e-2)
    assert len(history) == 60 and history["step"].iloc[-1] == 60
    first, last = history["loss"].iloc[:5].mean(), history["loss"].iloc[-5:].mean()
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
    assert meta["sft"]["eval_every"] == PRESETS["addition_rl_start"].sft.eval_every  # the rest is the preset's
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
    assert "batch_size must be" in capsys.readouterr().err
    assert not (tmp_path / "addition_sft").exists()


def test_cli_data_writes_the_task_files(tmp_path):
    out = tmp_path / "tasks"
    assert main(["data", "--out-dir", str(out), "--n-train", "12", "--n-test", "4", "--n-ood", "3"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tasks"]["addition"]["files"]["train"]["examples"] == 12
    assert len((out / "addition_test.jsonl").read_text().splitlines()) == 4
