"""Each fast path (rlhf_lab/model/fast.py, rlhf_lab/sampling/fast.py) against its plain definition, the
plain model against transformers, and `reference_paths()` switching both layers.

Bit for bit where the arithmetic is the same; otherwise within a tolerance derived from float32 eps
and the scale of the values (each test says how).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from test_checkpoints import EPS32, SIGMAS, summed_terms
from torch.overrides import TorchFunctionMode

from rlhf_lab.checkpoints import load_checkpoint
from rlhf_lab.model import DynamicCache, LlamaModel, ModelConfig, StaticCache, fast, from_hf
from rlhf_lab.model.paged_cache import PagedKVCache
from rlhf_lab.model.quantized_cache import QuantizedKVCache
from rlhf_lab.model.rope import RotaryEmbedding, apply_rope
from rlhf_lab.model.transformer import RMSNorm, eager_attention
from rlhf_lab.sampling import SamplingConfig, generate, left_pad, sample_next_token
from rlhf_lab.sampling import fast as sampling_fast
from rlhf_lab.sampling.generate import token_chooser
from rlhf_lab.util import fast_paths
from rlhf_lab.util.fast_paths import reference_paths

UNIT_ROUNDOFF_BF16 = torch.finfo(torch.bfloat16).eps / 2  # 2^-8: bf16 keeps 8 significant bits
TEXTS = ["12+7=", "345+678=", "9+9=", "1000+23=", "5+55=", "87+1="]  # different lengths: left padding


@pytest.fixture(scope="module")
def shipped():
    model, tokenizer, _ = load_checkpoint("addition_rl_start")
    return model, tokenizer


def both(fn):
    """fn() with the fast paths (the default), then inside `reference_paths()`."""
    assert fast_paths.enabled()
    fast_result = fn()
    with reference_paths():
        plain_result = fn()
    return fast_result, plain_result


# ------------------------------------------------------------------------------------------ RoPE


@pytest.mark.parametrize("interleaved", [False, True], ids=["half_split", "interleaved"])
@pytest.mark.parametrize("table_shape", ["per_row", "shared"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rotate_is_apply_rope_bit_for_bit(interleaved, table_shape, dtype):
    """fast.rotate(x, *rope_factors(cos, sin)) is apply_rope(x, cos, sin): with a, b the halves of x,
    x [cos | cos] + [b | a] [-sin | sin] against x [cos | cos] + [-b | a] [sin | sin]: (-b) s and b (-s)
    are the same float (IEEE negation is exact), so equal bits; interleaved pairs run the same code."""
    g = torch.Generator().manual_seed(0)
    B, H, T, D = 3, 4, 5, 16
    x = torch.randn(B, T, H, D, generator=g).transpose(1, 2).to(dtype)  # the strided layout the model passes
    angles = torch.rand((B, T, D // 2) if table_shape == "per_row" else (T, D // 2), generator=g) * 6.3
    cos, sin = angles.cos(), angles.sin()
    expected = apply_rope(x, cos, sin, interleaved)
    assert expected.dtype == dtype
    assert torch.equal(fast.rotate(x, *fast.rope_factors(cos, sin, interleaved), interleaved), expected)


@pytest.mark.parametrize("table_shape", ["per_row", "shared"])
def test_half_split_rope_is_the_pairwise_rotation_bit_for_bit(table_shape):
    """apply_rope's rotate_half form x [cos | cos] + rotate_half(x) [sin | sin] against the definition
    (a cos - b sin, b cos + a sin): a + (-b) s is exactly a - b s in IEEE arithmetic, so equal bits."""
    g = torch.Generator().manual_seed(0)
    B, H, T, D = 3, 4, 5, 16
    x = torch.randn(B, T, H, D, generator=g).transpose(1, 2)
    angles = torch.rand((B, 1, T, D // 2) if table_shape == "per_row" else (T, D // 2), generator=g) * 6.3
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., : D // 2], x[..., D // 2 :]
    expected = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    assert torch.equal(apply_rope(x, cos, sin), expected)


def test_rope_table_rows_equal_the_module_output():
    rope = RotaryEmbedding(16, 10000.0, {"rope_type": "yarn", "factor": 2.0}, 32)
    cos, sin = fast.cos_sin_table(rope, 40)  # longer than max_position_embeddings: the table grows
    assert cos.shape == (40, 8)
    positions = torch.tensor([[0, 5, 39], [17, 3, 31]])
    cos_direct, sin_direct = rope(positions)
    # cos and sin are at most attention_scaling in size; vectorised and scalar kernels may differ by an ulp.
    tolerance = 4 * EPS32 * rope.attention_scaling
    torch.testing.assert_close(cos[positions], cos_direct, atol=tolerance, rtol=0)
    torch.testing.assert_close(sin[positions], sin_direct, atol=tolerance, rtol=0)
    assert fast.cos_sin_table(rope, 8)[0].data_ptr() == cos.data_ptr()  # kept, not recomputed
    rope.inv_freq = rope.inv_freq * 2  # new frequencies (as a move to another device makes): a new table
    new_cos = fast.cos_sin_table(rope, 40)[0]
    torch.testing.assert_close(new_cos[positions], rope(positions)[0], atol=tolerance, rtol=0)
    with pytest.raises(ValueError, match="dynamic"):
        fast.cos_sin_table(RotaryEmbedding(16, 10000.0, {"rope_type": "dynamic", "factor": 2.0}, 32), 8)
    with pytest.raises(ValueError, match="length"):
        fast.cos_sin_table(rope, 0)


# ------------------------------------------------------------------------------ RMSNorm, attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_the_plain_rms_norm_bit_for_bit(dtype):
    """F.rms_norm with the weight inside computes weight * (x * rsqrt(mean(x^2) + eps)) with the same
    products in the same order: output and both gradients equal the plain RMSNorm's bits (for bf16
    input the float32 weight multiplies the rounded bf16 output, in both)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(7, 5, 64, generator=g).to(dtype)
    norm = RMSNorm(64, 1e-6)
    norm.weight.data.copy_(1 + 0.3 * torch.randn(64, generator=g))
    results = []
    for run in (norm, lambda inputs: fast.rms_norm(norm, inputs)):
        norm.weight.grad = None
        inputs = x.clone().requires_grad_()
        out = run(inputs)
        out.backward(torch.ones_like(out) + torch.arange(64) / 64)  # a gradient that differs per dim
        results.append((out.detach(), inputs.grad, norm.weight.grad))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_plain_rms_norm_is_llama_rms_norm_bit_for_bit():
    """The plain RMSNorm is transformers' LlamaRMSNorm, op for op: equal output and gradients."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    g = torch.Generator().manual_seed(2)
    x = torch.randn(7, 5, 64, generator=g)
    weight = 1 + 0.3 * torch.randn(64, generator=g)
    results = []
    for norm in (RMSNorm(64, 1e-6), LlamaRMSNorm(64, eps=1e-6)):
        norm.weight.data.copy_(weight)
        inputs = x.clone().requires_grad_()
        out = norm(inputs)
        out.backward(torch.ones_like(out) + torch.arange(64) / 64)
        results.append((out.detach(), inputs.grad, norm.weight.grad))
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("queries, keys",
                         [(4, 3), (4, 13), (4, 16), (4, 21), (1, 1), (1, 9), (1, 12), (1, 13)])
@pytest.mark.parametrize("masked", [True, False], ids=["mask", "no_mask"])
def test_grouped_attention_equals_eager_attention(queries, keys, masked):
    """grouped_attention (one bmm per kv head, key axes under 16 padded with -inf keys on the CPU) against
    eager_attention (repeat_kv, softmax(q k^T / sqrt(D) + mask) v), for the update's shapes (4 queries) and
    a decoding step's (1 query).

    The two sum the same terms in other orders. A score q.k / sqrt(D) is a sum of D products: its rounding
    error is at most D eps sum_d |q_d k_d| / sqrt(D) (first order, every rounding the same way). Such an
    error de in a score moves exp(score) by the factor (1 + de), so each probability moves by at most
    2 max(de) relative to it (numerator and denominator), plus the rounding of the softmax's sum of S terms,
    S eps; weights @ v sums S products, S eps max|v| more. Together, for outputs of size <= max|v|
    (probabilities sum to 1): max|v| (2 max(de) + 2 (S + 1) eps), a worst case, not a typical error."""
    g = torch.Generator().manual_seed(1)
    B, H, K, T, D = 2, 4, 2, queries, 16
    q, k, v = (torch.randn(B, n, t, D, generator=g) for n, t in ((H, T), (K, keys), (K, keys)))
    mask = None
    if masked or T > 1:  # a step of several queries always has a mask (build_attention_mask's contract)
        mask = torch.rand(B, 1, T, keys, generator=g) > 0.3
        mask[..., -1] = True  # every query sees at least one key
    expected = eager_attention(q, k, v, mask)
    k_repeated = k.repeat_interleave(H // K, 1)
    score_error = D * EPS32 * (q.abs() @ k_repeated.abs().transpose(-1, -2)).max().item() / math.sqrt(D)
    atol = v.abs().max().item() * (2 * score_error + 2 * (keys + 1) * EPS32)
    torch.testing.assert_close(fast.grouped_attention(q, k, v, mask), expected, rtol=0, atol=atol)


def test_eager_attention_is_the_formula_written_out():
    """eager_attention's repeat_kv reads kv head h // (H / K) for query head h, and hides masked keys."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 3, 8, generator=g)
    k, v = torch.randn(1, 2, 5, 8, generator=g), torch.randn(1, 2, 5, 8, generator=g)
    mask = torch.rand(1, 1, 3, 5, generator=g) > 0.4
    mask[..., 0] = True
    out = eager_attention(q, k, v, mask)
    for h in range(4):
        j = h // 2
        for t in range(3):
            scores = torch.tensor([float(q[0, h, t] @ k[0, j, s]) / math.sqrt(8) if mask[0, 0, t, s]
                                   else -math.inf for s in range(5)])
            expected = scores.softmax(-1) @ v[0, j]
            # a dot product of 8 terms and a weighted sum of 5, in other orders: tens of eps of |v| ~ 1
            torch.testing.assert_close(out[0, h, t], expected, rtol=0, atol=64 * EPS32 * v.abs().max().item())


# --------------------------------------------------------------------------------- whole forward


def small_model(seed: int = 0, **overrides) -> LlamaModel:
    """A small random model with large weights (logits of order 1..10, far from uniform)."""
    torch.manual_seed(seed)
    config = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  initializer_range=0.2)
    model = LlamaModel(ModelConfig(**{**config, **overrides})).eval()
    if model.value_head is not None:
        torch.nn.init.normal_(model.value_head.weight, std=0.2)
    return model


def padded_inputs(vocab: int, lengths=(11, 7, 4), seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(3, vocab, (n,), generator=g)
        mask[row, width - n:] = 1
    return ids, mask


def assert_close_logits(model, got, expected, seq_len=None, real=None):
    """Two float32 computations of the same function that sum in different orders: the bound of
    `parity_tolerance` (tests/test_checkpoints.py), SIGMAS eps sqrt(terms summed on the way to a logit)
    relative to max|logit|, for sequences of seq_len keys (default: expected's second axis)."""
    terms = summed_terms(model.config, expected.shape[1] if seq_len is None else seq_len)
    rtol = SIGMAS * EPS32 * math.sqrt(terms)
    atol = rtol * expected.abs().max().item()
    if real is not None:
        got, expected = got[real], expected[real]
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)


FORWARD_CASES = {
    "llama-gqa": {},
    "mha-tied": dict(num_key_value_heads=4, tie_word_embeddings=True),
    "interleaved": dict(rope_interleaved=True),
    "qwen3": dict(model_type="qwen3", attention_bias=True),
    "qwen2-bias": dict(model_type="qwen2", num_key_value_heads=1),
    "sdpa": dict(attn_implementation="sdpa"),
    "yarn": dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
    "dynamic": dict(max_position_embeddings=8, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    "value-head": dict(value_head=True),
    "moe": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, num_key_value_heads=1),
}


@pytest.mark.parametrize("case", list(FORWARD_CASES))
def test_fast_forward_equals_the_plain_forward(case):
    """The whole forward, fast against plain: left padding, then explicit position ids past the model's
    length for dynamic RoPE, logits, values and MoE routing alike."""
    model = small_model(**FORWARD_CASES[case])
    ids, mask = padded_inputs(model.config.vocab_size)
    with torch.no_grad():
        out, ref = both(lambda: model(ids, attention_mask=mask))
        assert_close_logits(model, out.logits, ref.logits, real=mask.bool())
        if model.value_head is not None:
            assert_close_logits(model, out.values, ref.values, real=mask.bool())  # a head like the LM head
        if model.config.is_moe:
            # the routing is a top-k of probabilities that differ by rounding: equal unless two experts
            # tie within it, and then replay (below) makes both paths use the same experts anyway
            replay = out.expert_indices
            out, ref = both(lambda: model(ids, attention_mask=mask, expert_indices=replay))
            assert all(torch.equal(a, b) for a, b in zip(out.expert_indices, ref.expert_indices))
            assert all(torch.equal(a, b) for a, b in zip(out.expert_indices, replay))
            assert_close_logits(model, out.logits, ref.logits, real=mask.bool())
            torch.testing.assert_close(out.aux_loss, ref.aux_loss, atol=0, rtol=64 * EPS32)
        positions = torch.arange(20)[None].expand(2, 20) + torch.tensor([[0], [3]])  # beyond max_position (8)
        g = torch.Generator().manual_seed(4)
        long_ids = torch.randint(3, model.config.vocab_size, (2, 20), generator=g)
        out, ref = both(lambda: model(long_ids, position_ids=positions))
        assert_close_logits(model, out.logits, ref.logits)


CACHES = {
    "dynamic": lambda config, B: DynamicCache(),
    "static": lambda config, B: StaticCache(config, B, 24),
    "paged": lambda config, B: PagedKVCache(config, B, 24, block_size=4),
    "int8": lambda config, B: QuantizedKVCache(config, B, residual_length=4),
}


@pytest.mark.parametrize("kind", list(CACHES))
def test_cached_decoding_fast_equals_plain(kind):
    """A left-padded prefill then 6 one-token steps through each kind of cache, each path with its own
    cache: the same logits to float32 rounding at every step (the int8 cache quantizes both alike)."""
    model = small_model()
    ids, mask = padded_inputs(model.config.vocab_size)
    B = ids.shape[0]
    steps = torch.randint(3, model.config.vocab_size, (B, 6), generator=torch.Generator().manual_seed(5))

    def decode():
        cache = CACHES[kind](model.config, B)
        logits = [model(ids, attention_mask=mask, cache=cache).logits[:, -1]]
        full_mask = mask
        for t in range(steps.shape[1]):
            full_mask = torch.cat([full_mask, torch.ones_like(mask[:, :1])], dim=1)
            logits.append(model(steps[:, t : t + 1], attention_mask=full_mask, cache=cache).logits[:, -1])
        return torch.stack(logits, 1)

    with torch.no_grad():
        got, expected = both(decode)
    assert_close_logits(model, got, expected, seq_len=ids.shape[1] + steps.shape[1])


def test_gradient_checkpointing_gives_the_plain_gradients():
    """Training mode with checkpointing (the layers recomputed in the backward) on both paths: every
    gradient is a sum over the batch's n real tokens of per-token terms carrying the logits' float32
    rounding, so the two differ by a few times n eps of the largest entry (as tests/test_model.py)."""
    model = small_model()
    model.train()
    model.gradient_checkpointing_enable()
    ids, mask = padded_inputs(model.config.vocab_size)
    real = mask.bool()
    targets = torch.randint(3, model.config.vocab_size, ids.shape, generator=torch.Generator().manual_seed(2))

    def gradients():
        model.zero_grad(set_to_none=True)
        logits = model(ids, attention_mask=mask).logits
        torch.nn.functional.cross_entropy(logits[real], targets[real]).backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    got, expected = both(gradients)
    n = int(real.sum())
    for name, grad in expected.items():
        tolerance = 4 * n * EPS32 * grad.abs().max().item()
        torch.testing.assert_close(got[name], grad, atol=tolerance, rtol=0,
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_bf16_autocast_fast_equals_plain():
    """Under bf16 autocast the matmul outputs are rounded to 8 significant bits, and the two paths round
    other sums (grouped vs repeated attention): each of the 9 matmul stages per layer may differ by a
    unit roundoff u = 2^-8 relative, the differences adding like a random walk along the residual stream:
    SIGMAS u sqrt(stages) max|logit| (the bound of tests/test_families.py's bf16 test)."""
    model = small_model(model_type="qwen3")
    ids, mask = padded_inputs(model.config.vocab_size)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out, ref = both(lambda: model(ids, attention_mask=mask).logits)
    assert out.dtype == ref.dtype == torch.float32
    stages = 9 * model.config.num_hidden_layers + 1
    atol = SIGMAS * UNIT_ROUNDOFF_BF16 * math.sqrt(stages) * ref.abs().max().item()
    real = mask.bool()
    torch.testing.assert_close(out[real], ref[real], atol=atol, rtol=0)


def test_fused_projections_change_no_logit_and_leave_training_alone():
    for overrides in ({}, dict(model_type="qwen3", attention_bias=True),
                      dict(mlp_bias=True, attention_bias=True)):
        model = small_model(**overrides)
        ids = torch.randint(0, model.config.vocab_size, (3, 7), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            unfused = model(ids).logits
            with fast.fused_projections(model):
                qkv, gate_up = fast.layer_stacks(model)[0]
                assert gate_up is not None and (qkv is None) == (model.config.model_type == "qwen3")
                fused = model(ids).logits
                with reference_paths():  # the plain forward reads no stack
                    plain = model(ids).logits
        assert fast.layer_stacks(model)[0] == (None, None)  # dropped on exit
        # Each stacked output column is the same dot product as before: equal up to the rounding of a
        # sum of hidden_size terms, scaled by the logits' magnitude.
        scale = unfused.abs().max().item()
        torch.testing.assert_close(fused, unfused, atol=model.config.hidden_size * EPS32 * scale, rtol=0)
        assert_close_logits(model, plain, unfused)
        # With gradients the stacks are ignored, so the weights still get their gradients.
        with fast.fused_projections(model):
            model(ids).logits.sum().backward()
        assert model.model.layers[0].self_attn.q_proj.weight.grad is not None
        assert model.model.layers[0].mlp.gate_proj.weight.grad is not None


def test_lora_wrapped_projections_on_both_paths(shipped):
    """peft wraps the projections: neither path may bypass the adapters (the stacks are not made for
    them), and the two paths agree to float32 rounding."""
    from rlhf_lab.model.lora import add_lora

    model, tokenizer = shipped
    lora = add_lora(copy.deepcopy(model), r=4)
    with torch.no_grad():  # a nonzero update, so that ignoring the adapters would change the logits
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([tokenizer.encode("345+678=", add_bos=True)])
    with torch.no_grad():
        out, ref = both(lambda: lora(ids).logits)
        with fast.fused_projections(lora):
            fused = lora(ids).logits
        base = model(ids).logits
    assert not torch.allclose(out, base)  # the adapters matter here
    assert torch.equal(fused, out)
    assert_close_logits(model, out, ref)


# ------------------------------------------------------------------------- plain vs transformers


def test_plain_model_is_transformers_llama_bit_for_bit():
    """The plain definitions are transformers' Llama op for op (RMSNorm, separate q/k/v, rotate_half RoPE
    with cos/sin of the same angles, repeat_kv, the float32 softmax of eager attention, SwiGLU), so in
    float32 with eager attention the logits are EXACTLY equal, for GQA and MHA and every RoPE scaling, when
    both get the same position ids. The fast forward differs from them by float32 rounding only
    (other sums: grouped attention, the padded softmax)."""
    from test_model import HF_CASES, make_hf
    from test_model import padded_batch as llama_batch

    for case in sorted(HF_CASES):
        hf = make_hf(**HF_CASES[case])
        lab = from_hf(hf)
        ids, mask = llama_batch(97, [12, 7, 12, 3])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # the lab's position ids under left padding
        real = mask.bool()
        with torch.no_grad():
            expected = hf(input_ids=ids, attention_mask=mask, position_ids=positions).logits
            fast_logits, plain_logits = both(lambda lab=lab, ids=ids, mask=mask:
                                             lab(ids, attention_mask=mask).logits)
        assert torch.equal(plain_logits[real], expected[real]), case
        assert_close_logits(lab, fast_logits, expected, real=real)


@pytest.mark.parametrize("family", ["llama-bias-headdim-untied", "qwen2-gqa-tied", "qwen3-untied-yarn"])
def test_plain_model_is_transformers_families_bit_for_bit(family):
    """Qwen2 (q/k/v biases) and Qwen3 (per-head q/k RMSNorm): the same op-for-op equality as Llama's, so
    in float32 eager the logits are exactly transformers'."""
    from test_families import CASES, build_hf
    from test_families import padded_batch as family_batch

    _, class_name, kwargs = next(c for c in CASES if c[0] == family)
    hf = build_hf(class_name, kwargs)
    lab = from_hf(hf).eval()
    ids, mask, positions = family_batch()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        with reference_paths():
            got = lab(ids, attention_mask=mask).logits
    real = mask.bool()
    assert torch.equal(got[real], expected[real])


# ------------------------------------------------------------------------------------- sampling


def test_the_race_draws_multinomials_tokens():
    """torch.multinomial(p, 1) draws by the same exponential race with the same Exp(1) numbers, so the
    plain draw and the race give the same tokens and log-probs and leave the generator in the same state
    (a property of torch's implementation: if it changes, seeded runs of the two paths part ways)."""
    torch.manual_seed(0)
    scores = torch.randn(64, 58) * 2
    scores[:, :5] = float("-inf")  # removed tokens are never drawn
    config = SamplingConfig(do_sample=True)
    one, other = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    ours, our_logprobs = sampling_fast.sample_by_race(scores, config, one)
    theirs, their_logprobs = sample_next_token(scores, config, other)
    assert torch.equal(ours, theirs) and torch.equal(our_logprobs, their_logprobs)
    assert torch.equal(one.get_state(), other.get_state())
    assert (ours >= 5).all()
    greedy = SamplingConfig(do_sample=False)
    assert all(torch.equal(a, b) for a, b in zip(sampling_fast.sample_by_race(scores, greedy),
                                                 sample_next_token(scores, greedy)))


def test_the_race_and_multinomial_sample_the_same_distribution():
    """Both draws, 20,000 rows of one distribution each, from generators of different seeds: every
    token's frequency is within 5 binomial standard errors sqrt(p (1 - p) / n) of its probability.
    The seeds are fixed, so the test is deterministic; a wrong draw (say p^2 or the argmax) misses by
    hundreds of standard errors, while a right one leaves the band with probability < 6e-7 per token."""
    row = torch.tensor([[0.0, 1.0, 2.0, -1.0, 0.5, float("-inf")]]).expand(20000, 6)
    config = SamplingConfig(do_sample=True)
    p = row[0].softmax(-1)
    bound = 5 * (p * (1 - p) / row.shape[0]).sqrt()
    draws = {"race": sampling_fast.sample_by_race(row, config, torch.Generator().manual_seed(0))[0],
             "multinomial": sample_next_token(row, config, torch.Generator().manual_seed(1))[0]}
    for name, tokens in draws.items():
        frequency = torch.bincount(tokens, minlength=6).float() / len(tokens)
        assert ((frequency - p).abs() <= bound).all(), (name, frequency, p)
        assert frequency[5] == 0  # a removed token is never drawn


CHOOSER_SETTINGS = {
    "greedy": SamplingConfig(do_sample=False),
    "greedy-logprobs": SamplingConfig(do_sample=False, return_logprobs=True),
    "plain-sampling": SamplingConfig(do_sample=True, temperature=0.9),
    "fused": SamplingConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.9),
    "repetition": SamplingConfig(do_sample=True, top_k=10, repetition_penalty=1.3),
    "min-p": SamplingConfig(do_sample=True, min_p=0.1),
}


@pytest.mark.parametrize("name", list(CHOOSER_SETTINGS))
def test_fast_token_chooser_equals_the_plain_one(name):
    """generate's step choice, sampling/fast.py's against the plain processors + sample_next_token with the
    same generator: the same tokens, the generator in the same state, log-probs equal to float32 rounding
    (a log-softmax over k survivors or V tokens: eps times the largest |score / T|, times a margin of 16)."""
    config = CHOOSER_SETTINGS[name]
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(256, 58, generator=g) * 3
    ids = torch.randint(0, 58, (256, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[:5, :4] = 0  # left padding: the repetition penalty must skip it
    for return_logprobs in (False, True):
        one, other = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
        fast_choose, plain_choose = both(lambda flag=return_logprobs: token_chooser(config, False, flag))
        tokens, logprobs = fast_choose(logits, ids, mask, 10, one)
        expected, expected_logprobs = plain_choose(logits, ids, mask, 10, other)
        assert torch.equal(tokens, expected)
        assert torch.equal(one.get_state(), other.get_state())
        if return_logprobs:
            scale = (logits / config.temperature).abs().max()
            torch.testing.assert_close(logprobs, expected_logprobs, rtol=0, atol=16 * EPS32 * scale)
        elif not config.do_sample:
            assert logprobs is None


@pytest.mark.parametrize("cache", ["static", "dynamic", "paged", "int8", "none"])
def test_generate_fast_equals_plain(shipped, cache):
    """Whole seeded generations on the shipped model, sampled with the usual warpers, fast paths against
    the plain definitions (model and draw): the same tokens, log-probs to float32 rounding of the scores
    (eps times the largest |logit / T|, times a margin of 64 for the forward's sums)."""
    model, tokenizer = shipped
    config = SamplingConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, seed=3, max_new_tokens=8,
                            return_logprobs=True)
    out, ref = both(lambda: generate(model, TEXTS, config, tokenizer=tokenizer, cache=cache,
                                     num_return_sequences=2))
    assert torch.equal(out.completion_ids, ref.completion_ids)
    assert out.finished.any()  # EOS stops rows, so the padding path runs
    with torch.no_grad():
        logits = model(ref.sequences, attention_mask=ref.attention_mask).logits
    scale = logits.abs().max().item() / config.temperature
    torch.testing.assert_close(out.logprobs, ref.logprobs, atol=64 * EPS32 * scale, rtol=0)


# ----------------------------------------------------------------------------- the switch itself


class CallLog(TorchFunctionMode):
    """Records the name of every torch function called inside it (no patching: torch's own hook)."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_reference_paths_switches_the_model_and_the_draw(shipped):
    """The same seeded generate call, with and without `reference_paths()`: the functions torch sees
    show which code ran. The fast paths pad short softmaxes, roll for RoPE, call F.rms_norm and torch.bmm,
    and race (no multinomial); the plain definitions call multinomial and none of those. The switch is
    back on after the block."""
    model, tokenizer = shipped
    ids, mask = left_pad([tokenizer.encode(t, add_bos=True) for t in TEXTS], model.config.pad_token_id)
    config = SamplingConfig(do_sample=True, temperature=0.9, seed=1, max_new_tokens=4, return_logprobs=True)

    def calls():
        with CallLog() as log:
            generate(model, ids, config, attention_mask=mask)
        return log.names

    fast_calls, plain_calls = both(calls)
    assert fast_paths.enabled()
    fast_only = {"pad", "roll", "rms_norm", "bmm", "uniform_"}  # uniform_: exponential_like's draw
    if not sampling_fast.uniform_gives_exponential():
        fast_only = fast_only - {"uniform_"} | {"exponential_"}
    assert fast_only <= fast_calls and "multinomial" not in fast_calls
    assert "multinomial" in plain_calls and not fast_only & plain_calls
