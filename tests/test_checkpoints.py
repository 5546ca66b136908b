"""The shipped checkpoints: loadable by the lab and by transformers, and as accurate as recorded."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys

import pytest
import torch

from rlhf_lab.checkpoints import CHECKPOINT_DIR, CheckpointError, checkpoint_folder, load_checkpoint
from rlhf_lab.checkpoints.presets import (
    MODEL_SIZE,
    PRESETS,
    TABLE_BEGIN,
    TABLE_END,
    model_size_line,
    write_readme,
)
from rlhf_lab.model.hf import from_pretrained
from rlhf_lab.tasks import get_task
from rlhf_lab.train.evaluate import greedy_accuracy

FILES = {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
         "tokenizer_config.json"}
MAX_TOTAL_BYTES = 10 * 1024 * 1024
TEXTS = ["047+085=231", "999+001=0001", "500+500=", "885+440=", "", "sort:3194= ok"]


@pytest.fixture(scope="module", params=sorted(PRESETS))
def shipped(request):
    name = request.param
    model, tokenizer, meta = load_checkpoint(name)
    return name, model, tokenizer, meta


def test_folder_is_a_complete_hf_checkpoint(shipped):
    name, *_ = shipped
    folder = CHECKPOINT_DIR / name
    assert FILES <= {p.name for p in folder.iterdir()}, f"{folder} is missing files"


# ------------------------------------------------------------------------ logits parity tolerance

EPS32 = torch.finfo(torch.float32).eps  # 1.19e-7
SIGMAS = 4.0  # the largest of ~10^3 roughly normal errors stays within 4 standard deviations


def summed_terms(config, seq_len: int) -> int:
    """How many terms are summed, stage after stage, on the way from an embedding to a logit.

    Per layer: RMSNorm's mean of squares (hidden), a q/k/v row (hidden), q.k (head_dim), the softmax
    denominator and weights @ v (seq_len each), o_proj (heads * head_dim), RMSNorm (hidden), gate/up
    (hidden), down (intermediate); then the final RMSNorm and the lm_head row (hidden each).
    """
    per_layer = (
        3 * config.hidden_size
        + config.head_dim
        + 2 * seq_len
        + config.num_attention_heads * config.head_dim
        + config.hidden_size
        + config.intermediate_size
    )
    return config.num_hidden_layers * per_layer + 2 * config.hidden_size


def parity_tolerance(config, logits: torch.Tensor) -> tuple[float, float]:
    """(atol, rtol) for comparing two fp32 implementations of the same model on trained weights.

    The lab and transformers compute the same function but sum in different orders (other matmul
    shapes and kernels, eager vs fused attention, and the BLAS itself picks its blocking and SIMD
    width by CPU: AVX2, AVX-512, NEON, MKL, OpenBLAS...), so they round differently, and differently
    on every machine. The rounding error of a sum of K fp32 terms is at most ~K * eps * sum|terms|
    (worst case, every rounding in the same direction) and typically ~sqrt(K) * eps * |terms|
    (independent roundings of either sign: a random walk). A logit is the end of a chain of such
    sums whose errors add (the residual stream carries them forward), so its typical error is
    ~sqrt(K_chain) * eps * scale, with K_chain = summed_terms(...) (1188 for the shipped size at 9
    tokens) and scale = max|logit| (the logits are the largest values in the chain; the terms of
    the lm_head dot product are of that order). The bound is absolute, from the scale, not relative
    to each element: a small logit is a cancellation of large terms and carries their error (the
    element that failed 1e-5 on AMD EPYC was one). SIGMAS standard deviations cover the largest
    error of the batch. For the shipped checkpoints this gives rtol = 4 * 1.19e-7 * sqrt(1188) =
    1.6e-5 and atol = rtol * max|logit| = 2.7e-4 (max|logit| 16.5) and 3.9e-4 (23.8), while the
    differences measured are 7e-6 and 2.5e-5 on one x86 CPU and 1.1e-5 on AMD EPYC; a real bug
    (permuted q heads, RoPE left out) moves logits by more than 1.
    """
    rtol = SIGMAS * EPS32 * math.sqrt(summed_terms(config, logits.shape[1]))
    return rtol * logits.abs().max().item(), rtol


def test_transformers_loads_it_with_equal_logits(shipped):
    from transformers import AutoModelForCausalLM

    name, model, tokenizer, _ = shipped
    folder = CHECKPOINT_DIR / name
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = [tokenizer.encode(t, add_bos=True) for t in TEXTS[:3]]
    width = min(len(row) for row in ids)
    batch = torch.tensor([row[:width] for row in ids])
    with torch.no_grad():
        ours = model(batch).logits
        theirs = hf_model(batch).logits
    atol, rtol = parity_tolerance(model.config, ours)
    assert atol < 1e-3 and rtol < 1e-4, "the tolerance must stay far below the effect of a real bug"
    torch.testing.assert_close(theirs.float(), ours, atol=atol, rtol=rtol)
    # And the lab's own loader, called on the folder directly, gives the very same weights.
    again = from_pretrained(folder)
    for (key, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), key


# ---------------------------------------------------------------------------- transformers alone


def test_autotokenizer_encodes_like_the_lab(shipped):
    from transformers import AutoTokenizer

    name, _, tokenizer, _ = shipped
    hf_tokenizer = AutoTokenizer.from_pretrained(CHECKPOINT_DIR / name)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_bos=True)
        assert ids.count(tokenizer.bos_token_id) == 1  # the lab adds one BOS, the post-processor none
        assert hf_tokenizer(text)["input_ids"] == ids, text  # add_special_tokens=True, the default
        assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == tokenizer.encode(text), text
        assert hf_tokenizer.decode(ids, skip_special_tokens=True) == text
    assert (hf_tokenizer.pad_token_id, hf_tokenizer.bos_token_id, hf_tokenizer.eos_token_id) == (
        tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)
    assert hf_tokenizer.padding_side == "left"


def hf_greedy(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[tuple[str, bool]]:
    """Greedy completions with transformers only: (text up to the first EOS, whether there was one)."""
    batch = tokenizer(prompts, return_tensors="pt", padding=True)  # left padding, BOS from tokenizer.json
    with torch.no_grad():
        out = model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens)
    results = []
    for row in out[:, batch["input_ids"].shape[1]:].tolist():
        finished = tokenizer.eos_token_id in row
        kept = row[: row.index(tokenizer.eos_token_id)] if finished else row
        results.append((tokenizer.decode(kept, skip_special_tokens=True), finished))
    return results


def test_transformers_alone_generates_the_recorded_accuracy(shipped):
    """AutoModelForCausalLM + AutoTokenizer + generate, no lab code until the score."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name, _, _, meta = shipped
    folder = CHECKPOINT_DIR / name
    hf_tokenizer = AutoTokenizer.from_pretrained(folder)
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert (hf_model.generation_config.eos_token_id, hf_model.generation_config.pad_token_id) == (2, 0)
    ev = meta["eval"]
    task = get_task(meta["task"], **meta["task_params"])
    _, test = task.make_split(ev["data_seed"], ev["n_train"], ev["n_test"])
    test = test[: ev["examples"]]
    budget = max(len(e.completion) for e in test) + 1 + 2  # the completion, EOS, slack
    completions = hf_greedy(hf_model, hf_tokenizer, [e.prompt for e in test], budget)
    accuracy = sum(task.score(e.prompt, text, e.answer, finished)
                   for e, (text, finished) in zip(test, completions)) / len(test)
    # The same two problems of slack as the lab's own recomputation below.
    assert accuracy == pytest.approx(meta["accuracy"], abs=2 / ev["examples"] + 1e-9), (
        f"{name}: transformers' greedy accuracy {accuracy:.3f}, recorded {meta['accuracy']:.3f}")
    # The test prompts all have one length; next to a longer prompt they are left-padded, and the
    # padding must not change their completions.
    padded = hf_greedy(hf_model, hf_tokenizer, ["1234+5678="] + [e.prompt for e in test[:8]], budget)
    assert padded[1:] == completions[:8]


# ------------------------------------------------------------------------------ recorded accuracy


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


# ------------------------------------------------------------------------------------------ README


def test_readme_table_matches_the_metadata(shipped):
    name, model, _, meta = shipped
    readme = (CHECKPOINT_DIR / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}` |"))
    assert f"{meta['accuracy']:.1%}" in row
    assert f"{model.num_parameters():,}" in row
    assert re.search(rf"\| {meta['steps']} \|", row)


def test_write_readme_regenerates_the_committed_readme(tmp_path):
    copy = tmp_path / "checkpoints"
    shutil.copytree(CHECKPOINT_DIR, copy)
    committed = (CHECKPOINT_DIR / "README.md").read_text()
    write_readme(copy)
    assert (copy / "README.md").read_text() == committed, (
        "data/checkpoints/README.md is stale: run `python -c 'from rlhf_lab.checkpoints.presets import "
        "write_readme; write_readme()'`"
    )
    assert model_size_line(MODEL_SIZE) in committed, "the README's Model section must quote MODEL_SIZE"


def test_write_readme_rewrites_only_the_table(tmp_path):
    copy = tmp_path / "checkpoints"
    shutil.copytree(CHECKPOINT_DIR, copy)
    readme = copy / "README.md"
    text = readme.read_text()
    begin, end = text.index(TABLE_BEGIN), text.index(TABLE_END) + len(TABLE_END)
    edited = (
        "Edited prose.\n" + text[:begin] + f"{TABLE_BEGIN}\n| stale |\n{TABLE_END}" + text[end:] + "More.\n"
    )
    readme.write_text(edited)
    write_readme(copy)
    assert readme.read_text() == "Edited prose.\n" + text + "More.\n"

    readme.write_text("# no markers\n")
    with pytest.raises(ValueError, match="checkpoints table"):
        write_readme(copy)
    assert readme.read_text() == "# no markers\n"

    readme.unlink()  # a folder without README (`--out /tmp/ckpt`) gets a title and the table
    text = write_readme(copy).read_text()
    assert text.startswith("# Checkpoints\n") and "| `addition_sft` |" in text and TABLE_END in text


# ------------------------------------------------------------------------------------------ loader


def test_folder_without_tokenizer_is_refused_unless_asked(tmp_path):
    folder = tmp_path / "no_tokenizer"
    shutil.copytree(CHECKPOINT_DIR / "addition_sft", folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError,
                       match=re.escape(str(folder)) + ".*no tokenizer.json.*default_tokenizer=True"):
        load_checkpoint(folder)
    model, tokenizer, meta = load_checkpoint(folder, default_tokenizer=True)
    assert meta["name"] == "addition_sft" and len(tokenizer) == model.config.vocab_size


def test_unknown_name_is_named():
    with pytest.raises(CheckpointError, match="'no_such_checkpoint'.*addition_rl_start, addition_sft"):
        checkpoint_folder("no_such_checkpoint")
    assert checkpoint_folder("addition_sft") == CHECKPOINT_DIR / "addition_sft"


def test_the_loader_does_not_import_the_training_code():
    code = (
        "import sys, rlhf_lab.checkpoints; "
        "print(sorted(m for m in sys.modules if m in ('rlhf_lab.sft', 'rlhf_lab.checkpoints.presets', "
        "'rlhf_lab.rl')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_rl_start_is_the_same_model_as_the_sft_checkpoint():
    start, _, _ = load_checkpoint("addition_rl_start")
    final, _, _ = load_checkpoint("addition_sft")
    assert start.config == final.config  # same architecture: RL and the demos share one model size


def test_checkpoints_fit_in_the_size_budget():
    total = sum(p.stat().st_size for p in CHECKPOINT_DIR.rglob("*") if p.is_file())
    assert 0 < total < MAX_TOTAL_BYTES, f"data/checkpoints holds {total / 2**20:.1f} MiB"
