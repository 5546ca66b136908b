"""The shipped checkpoints: loadable by the lab and by transformers, and as accurate as recorded."""

from __future__ import annotations

import re

import pytest
import torch

from rlhf_lab.evaluate import greedy_accuracy
from rlhf_lab.model.hf import from_pretrained
from rlhf_lab.presets import CHECKPOINT_DIR, PRESETS, load_checkpoint
from rlhf_lab.tasks import get_task

FILES = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
MAX_TOTAL_BYTES = 10 * 1024 * 1024


@pytest.fixture(scope="module", params=sorted(PRESETS))
def shipped(request):
    name = request.param
    model, tokenizer, meta = load_checkpoint(name)
    return name, model, tokenizer, meta


def test_folder_is_a_complete_hf_checkpoint(shipped):
    name, *_ = shipped
    folder = CHECKPOINT_DIR / name
    assert FILES <= {p.name for p in folder.iterdir()}, f"{folder} is missing files"


def test_transformers_loads_it_with_equal_logits(shipped):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name, model, tokenizer, _ = shipped
    folder = CHECKPOINT_DIR / name
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    hf_tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = ["047+085=231", "999+001=0001", "500+500="]
    ids = [tokenizer.encode(t, add_bos=True) for t in texts]
    assert [[tokenizer.bos_token_id] + hf_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts] == ids
    width = min(len(row) for row in ids)
    batch = torch.tensor([row[:width] for row in ids])
    with torch.no_grad():
        ours = model(batch).logits
        theirs = hf_model(batch).logits
    torch.testing.assert_close(theirs.float(), ours, atol=1e-5, rtol=1e-5)
    # And the lab's own loader, called on the folder directly, gives the very same weights.
    again = from_pretrained(folder)
    for (key, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), key


def test_recorded_accuracy_is_reproduced_and_in_band(shipped):
    name, model, tokenizer, meta = shipped
    low, high = PRESETS[name].accuracy_band
    assert meta["accuracy_band"] == [low, high], "the band next to the checkpoint must be the preset's"
    ev = meta["eval"]
    task = get_task(meta["task"], **meta["task_params"])
    _, test = task.make_split(ev["data_seed"], ev["n_train"], ev["n_test"])
    accuracy = greedy_accuracy(model, tokenizer, task, test[: ev["examples"]])
    assert ev["examples"] >= 500
    # Two problems of slack: a harmless change of float rounding in the model may flip a near-tie.
    assert accuracy == pytest.approx(meta["accuracy"], abs=2 / ev["examples"] + 1e-9), (
        f"{name}: recomputed held-out accuracy {accuracy:.3f}, recorded {meta['accuracy']:.3f}")
    assert low <= accuracy <= high, f"{name}: held-out accuracy {accuracy:.3f} outside [{low}, {high}]"
    assert meta["in_band"] is True


def test_readme_table_matches_the_metadata(shipped):
    name, model, _, meta = shipped
    readme = (CHECKPOINT_DIR / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}` |"))
    assert f"{meta['accuracy']:.1%}" in row
    assert f"{model.num_parameters():,}" in row
    assert re.search(rf"\| {meta['steps']} \|", row)


def test_rl_start_is_the_same_model_as_the_sft_checkpoint():
    start, _, _ = load_checkpoint("addition_rl_start")
    final, _, _ = load_checkpoint("addition_sft")
    assert start.config == final.config  # same architecture: RL and the demos share one model size


def test_checkpoints_fit_in_the_size_budget():
    total = sum(p.stat().st_size for p in CHECKPOINT_DIR.rglob("*") if p.is_file())
    assert 0 < total < MAX_TOTAL_BYTES, f"data/checkpoints holds {total / 2**20:.1f} MiB"
