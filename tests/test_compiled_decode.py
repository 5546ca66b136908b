"""`generate(..., compile=True)`: the compiled decode step gives the eager step's results.

The compiled step attends over the whole static cache (the unwritten slots masked) and its generated
kernels sum in their own order, so log-probs agree to float32 rounding, not bit for bit; tokens must be
the same (greedy, and sampled with the same generator: the processors and the draw run eagerly, as
without compile). Compiling costs time once per shape: the first call here takes ~10-20 s on 2 cores
(TorchInductor generates and builds C++ kernels; its on-disk cache makes later runs faster), which is
why the tests share one shape (6 prompts, 8 new tokens) and one more (2 samples per prompt). The file
took 25 s with an empty on-disk cache (1-minute load average 2.5).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from rlhf_lab.checkpoints import load_checkpoint
from rlhf_lab.sampling import SamplingConfig, generate
from rlhf_lab.sampling import compiled as compiled_module

EPS = torch.finfo(torch.float32).eps
TEXTS = ["12+7=", "345+678=", "9+9=", "1000+23=", "5+55=", "87+1="]  # different lengths: left padding
CONFIGS = {
    "greedy": SamplingConfig(do_sample=False, max_new_tokens=8, return_logprobs=True),
    "sampled": SamplingConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, seed=3, max_new_tokens=8,
                              return_logprobs=True),
}
# Processors that read the context or the step number, after the compiled step's logits
CONTEXT_PROCESSORS = {
    "repetition_penalty": CONFIGS["greedy"].replace(repetition_penalty=1.3),
    "no_repeat_ngram": CONFIGS["greedy"].replace(no_repeat_ngram_size=2),
    "min_new_tokens": CONFIGS["greedy"].replace(min_new_tokens=4),
}

FALLBACK = "generate\\(compile=True\\): torch.compile failed"  # the start of the fallback's warning


@pytest.fixture(scope="module")
def shipped():
    model, tokenizer, _ = load_checkpoint("addition_rl_start")
    return model, tokenizer


def assert_same_generation(model, compiled, eager):
    """Same tokens and masks; log-probs equal to float32 rounding."""
    assert torch.equal(compiled.completion_ids, eager.completion_ids)
    assert torch.equal(compiled.completion_mask, eager.completion_mask)
    # log_softmax(s) = s - logsumexp(s): its rounding error scales with the largest |logit|, and the
    # compiled kernels sum each logit's products in their own order: fp32 eps times that scale, times a
    # margin of 64 for the sums (as tests/test_fast_decode.py).
    with torch.no_grad():
        scale = model(eager.sequences, attention_mask=eager.attention_mask).logits.abs().max().item()
    torch.testing.assert_close(compiled.logprobs, eager.logprobs, atol=64 * EPS * scale, rtol=0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_compiled_generate_equals_eager(shipped, name):
    model, tokenizer = shipped
    config = CONFIGS[name]
    eager = generate(model, TEXTS, config, tokenizer=tokenizer)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", FALLBACK)  # a failed compilation warns and decodes eagerly: not here
        compiled = generate(model, TEXTS, config, tokenizer=tokenizer, compile=True)
    assert_same_generation(model, compiled, eager)
    assert compiled.finished.any()  # EOS stops rows, so the padding path runs
    assert compiled.timings["first_step_s"] > 0


@pytest.mark.parametrize("name", list(CONTEXT_PROCESSORS))
def test_processors_that_read_the_context_follow_the_compiled_step(shipped, name):
    """The repetition penalty and no-repeat-ngram read the growing context, min_new_tokens the step
    number: eager after the compiled logits, they give the eager call's results."""
    model, tokenizer = shipped
    config = CONTEXT_PROCESSORS[name]
    eager = generate(model, TEXTS, config, tokenizer=tokenizer)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", FALLBACK)
        compiled = generate(model, TEXTS, config, tokenizer=tokenizer, compile=True)
    assert_same_generation(model, compiled, eager)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_second_call_does_not_recompile(shipped, name):
    """Same shapes, other prompts of the same width: torch's cache serves the compiled graph, also after a
    call with other shapes (2 samples per prompt: twice the rows) compiled a second one. Under
    `fail_on_recompile` a recompilation raises, which the fallback would turn into a warning: an error
    here."""
    model, tokenizer = shipped
    config = CONFIGS[name]
    generate(model, TEXTS, config, tokenizer=tokenizer, compile=True)
    wrapper = compiled_module.COMPILED[compiled_module.decode_step]  # torch.compile's, made once per process
    two = generate(model, TEXTS, config, tokenizer=tokenizer, compile=True, num_return_sequences=2)
    assert_same_generation(model, two, generate(model, TEXTS, config, tokenizer=tokenizer,
                                                num_return_sequences=2))
    others = ["11+7=", "346+678=", "9+8=", "1001+23=", "5+56=", "88+1="]  # same lengths, same padding
    with torch.compiler.set_stance("fail_on_recompile"), warnings.catch_warnings():
        warnings.filterwarnings("error", FALLBACK)
        compiled = generate(model, others, config, tokenizer=tokenizer, compile=True)
    assert_same_generation(model, compiled, generate(model, others, config, tokenizer=tokenizer))
    assert compiled_module.COMPILED[compiled_module.decode_step] is wrapper


def test_compiled_steps_follow_weight_updates(shipped):
    """An RL loop changes the weights in place between calls: the compiled graph must read them, not
    keep the values it saw when it was compiled."""
    model, tokenizer = shipped
    model = copy.deepcopy(model)
    config = CONFIGS["greedy"]
    before = generate(model, TEXTS, config, tokenizer=tokenizer, compile=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.05)
    eager = generate(model, TEXTS, config, tokenizer=tokenizer)
    assert not torch.equal(eager.logprobs, before.logprobs)  # the change is visible
    assert_same_generation(model, generate(model, TEXTS, config, tokenizer=tokenizer, compile=True), eager)


def test_failed_compilation_warns_and_decodes_eagerly(shipped, monkeypatch):
    model, tokenizer = shipped
    config = CONFIGS["sampled"]

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", no_compiler)
    monkeypatch.setattr(compiled_module, "COMPILED", {})  # no wrapper left from the tests above
    with pytest.warns(RuntimeWarning,
                      match="torch.compile failed .*no C\\+\\+ compiler found.*decoding eagerly"):
        fallback = generate(model, TEXTS, config, tokenizer=tokenizer, compile=True)
    assert_same_generation(model, fallback, generate(model, TEXTS, config, tokenizer=tokenizer))


@pytest.mark.parametrize("kwargs, match", [
    ({"compile": "yes"}, "compile must be True or False"),
    ({"compile": 1}, "compile must be True or False"),
    ({"compile": True, "cache": "dynamic"}, "compile=True needs cache='static'"),
])
def test_bad_compile_settings_name_the_field(shipped, kwargs, match):
    model, tokenizer = shipped
    with pytest.raises(ValueError, match=match):
        generate(model, TEXTS, CONFIGS["greedy"], tokenizer=tokenizer, **kwargs)
