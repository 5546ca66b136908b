"""Paged (vLLM-style) and int8 (KIVI-style) KV caches against a full forward without a cache."""

from __future__ import annotations

import pytest
import torch

from rlhf_lab.model import DynamicCache, LlamaModel, ModelConfig, StaticCache
from rlhf_lab.model.paged_cache import PagedKVCache
from rlhf_lab.model.quantized_cache import QuantizedKVCache, dequantize, quantize

ATOL = 1e-5
VOCAB = 59


def small_config(**overrides) -> ModelConfig:
    kwargs = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2)
    kwargs.update(overrides)
    return ModelConfig(**kwargs)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matmuls: a second thread only adds synchronisation (10x slower on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    torch.manual_seed(0)
    return LlamaModel(small_config()).eval()


def left_padded(lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Random left-padded prompts: ids (B, T) with pad id 0, attention mask (B, T)."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(3, VOCAB, (len(lengths), T), generator=g)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, T - n :] = 1
        ids[b, : T - n] = 0
    return ids, mask


def random_tokens(batch: int, steps: int, seed: int = 2) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, steps), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def cached_decode(model, cache, ids, mask, tokens, expand: int = 1) -> list[torch.Tensor]:
    """Prefill `ids`, optionally expand the cache, then feed `tokens` (B', steps) one per step.

    Returns the last-position logits (B', V) after the prefill and after every step, the way
    generation calls the model: model(new_ids, attention_mask=mask_so_far, cache=cache).
    """
    out = [model(ids, attention_mask=mask, cache=cache).logits[:, -1]]
    if expand > 1:
        cache = cache.expand(expand)
        mask = mask.repeat_interleave(expand, dim=0)
        out = [out[0].repeat_interleave(expand, dim=0)]
    for t in range(tokens.shape[1]):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out.append(model(tokens[:, t : t + 1], attention_mask=mask, cache=cache).logits[:, -1])
    return out


@torch.no_grad()
def full_decode(model, ids, mask, tokens) -> list[torch.Tensor]:
    """The same logits from a full forward over the whole sequence so far, no cache."""
    out = []
    for t in range(tokens.shape[1] + 1):
        full_ids = torch.cat([ids, tokens[:, :t]], dim=1)
        full_mask = torch.cat([mask, torch.ones_like(tokens[:, :t])], dim=1)
        out.append(model(full_ids, attention_mask=full_mask).logits[:, -1])
    return out


class Recorder:
    """Wraps a cache and keeps what `update` returned for each layer in the last forward."""

    def __init__(self, cache) -> None:
        self.cache, self.returned = cache, {}

    def update(self, layer_idx, key, value):
        keys, values = self.cache.update(layer_idx, key, value)
        self.returned[layer_idx] = (keys.clone(), values.clone())
        return keys, values

    def get_seq_length(self) -> int:
        return self.cache.get_seq_length()


# ---------------------------------------------------------------------------- paged cache
@pytest.mark.parametrize("block_size", [4, 16])
def test_paged_matches_full_forward(model, block_size):
    lengths = [5, 9, 3]  # left padded to 9; with block_size 4 decoding crosses blocks at 12 and 16
    ids, mask = left_padded(lengths)
    tokens = random_tokens(len(lengths), 8)
    cache = PagedKVCache(model.config, batch_size=3, max_len=9 + 8, block_size=block_size)
    got = cached_decode(model, cache, ids, mask, tokens)
    want = full_decode(model, ids, mask, tokens)
    for step, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0, msg=f"step {step}")
    assert cache.get_seq_length() == 17
    assert len(cache.block_table_rows()[0]) == -(-17 // block_size)
    assert cache.blocks_in_use() == 3 * -(-17 // block_size)  # no sharing: every row owns its blocks


def test_paged_prefix_sharing_saves_blocks(model):
    B, G, bs = 2, 4, 4
    ids, mask = left_padded([10, 10], seed=3)
    cache = PagedKVCache(model.config, batch_size=B, max_len=16, block_size=bs, max_sequences=B * G)
    with torch.no_grad():
        first = model(ids, attention_mask=mask, cache=cache).logits[:, -1]
    assert cache.blocks_in_use() == B * 3  # 10 tokens -> blocks of 4 + 4 + 2
    tables_before = cache.block_table_rows()

    cache = cache.expand(G)
    assert cache.blocks_in_use() == B * 3, "expand must share blocks, not copy them"
    assert cache.cow_copies == 0
    for row in range(B * G):
        assert cache.block_table_rows()[row] == tables_before[row // G]
        assert cache.refcounts(row) == [G, G, G]
    assert cache.blocks_if_contiguous() == B * G * 3

    # One more token per row, different for every row: each row must stop sharing its partial last block.
    tokens = random_tokens(B * G, 4, seed=4)
    mask_g = mask.repeat_interleave(G, dim=0)
    step_mask = torch.cat([mask_g, torch.ones(B * G, 1, dtype=torch.long)], dim=1)
    with torch.no_grad():
        step1 = model(tokens[:, :1], attention_mask=step_mask, cache=cache).logits[:, -1]
    tables = cache.block_table_rows()
    # Bookkeeping: the parent's reference passed to its first child, so within a group the first
    # G - 1 children copy the shared partial block and the last one finds refcount 1 and writes in place.
    assert cache.cow_copies == B * (G - 1)
    assert cache.blocks_in_use() == B * 3 + B * (G - 1)
    assert len({t[2] for t in tables}) == B * G, "every row now has a private last block"
    for row in range(B * G):
        assert tables[row][:2] == tables_before[row // G][:2], "full prompt blocks stay shared"
        assert cache.refcounts(row) == [G, G, 1]
    assert {t[2] for t in tables} >= {t[2] for t in tables_before}  # the last child kept the original
    assert cache.blocks_in_use() < 0.6 * cache.blocks_if_contiguous()  # 12 blocks instead of 24

    # Three more tokens (crossing into a 4th block at position 12); logits match 8 unshared rows.
    mask_so_far = step_mask
    got = [step1]
    for t in range(1, tokens.shape[1]):
        mask_so_far = torch.cat([mask_so_far, torch.ones(B * G, 1, dtype=torch.long)], dim=1)
        with torch.no_grad():
            got.append(model(tokens[:, t : t + 1], attention_mask=mask_so_far, cache=cache).logits[:, -1])
    want = full_decode(model, ids.repeat_interleave(G, dim=0), mask_g, tokens)
    torch.testing.assert_close(first.repeat_interleave(G, dim=0), want[0], atol=ATOL, rtol=0)
    for step, (g, w) in enumerate(zip(got, want[1:])):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0, msg=f"step {step}")
    # 14 tokens: two shared full blocks per prompt + 2 private blocks per row, vs 4 blocks per row.
    assert cache.blocks_in_use() == B * 2 + B * G * 2
    assert cache.blocks_if_contiguous() == B * G * 4


def test_paged_copy_on_write_isolates_children(model):
    bs = 4
    ids, mask = left_padded([6], seed=5)  # blocks: [4 tokens full][2 tokens partial]
    cache = PagedKVCache(model.config, batch_size=1, max_len=8, block_size=bs, max_sequences=2)
    with torch.no_grad():
        model(ids, attention_mask=mask, cache=cache)
    (full_block, partial_block), = cache.block_table_rows()
    parent_keys = [pool[[full_block, partial_block]].clone() for pool in cache.key_pool]
    parent_values = [pool[[full_block, partial_block]].clone() for pool in cache.value_pool]

    cache.expand(2)
    tokens = torch.tensor([[7], [40]])  # the two children diverge
    recorder = Recorder(cache)
    step_mask = torch.ones(2, 7, dtype=torch.long)
    with torch.no_grad():
        model(tokens, attention_mask=step_mask, cache=recorder)

    # An unshared reference: the same two sequences in a plain concatenating cache.
    reference = Recorder(DynamicCache())
    with torch.no_grad():
        model(ids.repeat(2, 1), attention_mask=mask.repeat(2, 1), cache=reference)
        model(tokens, attention_mask=step_mask, cache=reference)
    for layer in range(model.config.num_hidden_layers):
        for got, want in zip(recorder.returned[layer], reference.returned[layer]):
            assert got.shape == (2, 2, 7, model.config.head_dim)
            # Not bit for bit: the reference runs the prompt as a batch of 2, the paged cache as a batch
            # of 1, and BLAS / the CPU softmax (padded under 16 keys) may add in another order per batch
            # shape. A few dozen float32 ulps of the largest value along the chain (embeddings, two
            # layers' matmuls and softmax, all O(1) or less) bound that on any CPU and BLAS.
            atol = 32 * torch.finfo(torch.float32).eps * (1.0 + want.abs().max().item())
            torch.testing.assert_close(got, want, atol=atol, rtol=0)
        assert not torch.allclose(recorder.returned[layer][0][0, :, 6], recorder.returned[layer][0][1, :, 6])

    child0, child1 = cache.block_table_rows()
    assert child0[0] == child1[0] == full_block and cache.refcounts(0) == [2, 1]
    assert child0[1] != partial_block and child1[1] == partial_block  # child 0 copied; child 1 owns it now
    for layer in range(model.config.num_hidden_layers):
        pools = ((cache.key_pool[layer], parent_keys[layer]), (cache.value_pool[layer], parent_values[layer]))
        for pool, saved in pools:
            torch.testing.assert_close(pool[full_block], saved[0], atol=0, rtol=0)
            # The parent's 2 tokens in the partial block are untouched in the original and in the copy.
            torch.testing.assert_close(pool[partial_block, :2], saved[1, :2], atol=0, rtol=0)
            torch.testing.assert_close(pool[child0[1], :2], saved[1, :2], atol=0, rtol=0)


def test_paged_fork_and_select_free_blocks(model):
    ids, mask = left_padded([6, 6], seed=6)
    cache = PagedKVCache(model.config, batch_size=2, max_len=8, block_size=4, max_sequences=4)
    with torch.no_grad():
        model(ids, attention_mask=mask, cache=cache)
    assert cache.free_blocks() == 8 - 4
    cache.fork(1, copies=2)  # rows: 0, 1, 1', 1''
    assert len(cache.block_table_rows()) == 4 and cache.blocks_in_use() == 4
    assert cache.refcounts(0) == [1, 1] and cache.refcounts(3) == [3, 3]
    cache.select([2, 3])  # drop rows 0 and 1 (beam search pruning): row 0's blocks return to the pool
    assert cache.blocks_in_use() == 2 and cache.refcounts(0) == [2, 2]
    tokens = random_tokens(2, 2, seed=7)
    step_mask = mask[[1, 1]]
    got = []
    for t in range(2):
        step_mask = torch.cat([step_mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
        with torch.no_grad():
            got.append(model(tokens[:, t : t + 1], attention_mask=step_mask, cache=cache).logits[:, -1])
    want = full_decode(model, ids[[1, 1]], mask[[1, 1]], tokens)[1:]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)
    assert cache.blocks_in_use() == 3  # shared full block + one private partial block each


def test_paged_pool_exhaustion_raises(model):
    ids, mask = left_padded([10], seed=8)
    cache = PagedKVCache(model.config, batch_size=1, max_len=16, block_size=4, num_blocks=3)
    with torch.no_grad():
        model(ids, attention_mask=mask, cache=cache)  # 3 blocks: 4 + 4 + 2 tokens
        mask = torch.ones(1, 12, dtype=torch.long)
        model(torch.tensor([[5]]), attention_mask=mask[:, :11], cache=cache)
        model(torch.tensor([[5]]), attention_mask=mask, cache=cache)  # fills block 3
        assert cache.free_blocks() == 0
        with pytest.raises(RuntimeError, match="out of blocks.*num_blocks=3"):
            model(torch.tensor([[5]]), attention_mask=torch.ones(1, 13, dtype=torch.long), cache=cache)

    # Copy-on-write needs a block too: two children of a 10-token prompt in a 3-block pool.
    cache = PagedKVCache(model.config, batch_size=1, max_len=16, block_size=4, num_blocks=3)
    ids, mask = left_padded([10], seed=8)
    with torch.no_grad():
        model(ids, attention_mask=mask, cache=cache)
        cache.expand(2)
        with pytest.raises(RuntimeError, match="num_blocks=3"):
            model(torch.tensor([[5], [6]]), attention_mask=torch.ones(2, 11, dtype=torch.long), cache=cache)


def test_paged_validates_arguments(model):
    with pytest.raises(ValueError, match="block_size must satisfy 1 <= block_size"):
        PagedKVCache(model.config, batch_size=1, max_len=8, block_size=0)
    with pytest.raises(ValueError, match="max_sequences must satisfy 2 <= max_sequences"):
        PagedKVCache(model.config, batch_size=2, max_len=8, max_sequences=1)
    with pytest.raises(ValueError, match="num_blocks must be an integer"):
        PagedKVCache(model.config, batch_size=1, max_len=8, num_blocks=2.0)
    cache = PagedKVCache(model.config, batch_size=1, max_len=4, block_size=4)
    with pytest.raises(ValueError, match="max_len=4"):
        cache.update(0, torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 8))
    with pytest.raises(ValueError, match="1 sequences"):
        cache.update(0, torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8))


# ---------------------------------------------------------------------------- int8 cache
def test_quantize_roundtrip_error_is_half_a_step():
    x = torch.randn(3, 2, 8, 16, generator=torch.Generator().manual_seed(0))
    for dim in (2, 3):
        codes, scale, lo = quantize(x, dim)
        assert codes.dtype == torch.uint8 and codes.min() == 0 and codes.max() == 255
        error = (dequantize(codes, scale, lo) - x).abs()
        assert (error <= scale / 2 + 1e-6).all()  # |x - x_hat| <= scale / 2 = (max - min) / 510
        assert error.max() > scale.min() / 10  # rounding really happened


@torch.no_grad()
def test_quantized_cache_close_to_full_precision(model):
    ids, mask = left_padded([40, 33], seed=9)
    steps = 30
    # Greedy decoding with a full-precision cache gives the reference tokens and logits.
    full_cache, mask_so_far, tokens, full_logits = DynamicCache(), mask, [], []
    logits = model(ids, attention_mask=mask, cache=full_cache).logits[:, -1]
    full_logits.append(logits)
    for _ in range(steps):
        tokens.append(logits.argmax(-1, keepdim=True))
        mask_so_far = torch.cat([mask_so_far, torch.ones(2, 1, dtype=torch.long)], dim=1)
        logits = model(tokens[-1], attention_mask=mask_so_far, cache=full_cache).logits[:, -1]
        full_logits.append(logits)
    tokens = torch.cat(tokens, dim=1)

    cache = QuantizedKVCache(model.config, batch_size=2, residual_length=8)
    quant_logits = cached_decode(model, cache, ids, mask, tokens)
    assert cache.get_seq_length() == 70 and cache.quantized_length() == 64  # 8 groups of 8, 6 residual
    errors = torch.stack([(q - f).abs().max() for q, f in zip(quant_logits, full_logits)])
    # The prefill attends to its own, still exact, keys: identical logits.
    assert errors[0] == 0
    # Bound: each dequantized element is off by at most scale/2 = (max - min)/510 of its group. Here
    # keys span ~4.8 per channel and values ~3.3 per token, so elements are off by <= ~9e-3 and
    # ~6e-3 (0.2% of the range). Attention sums D = 8 such errors in each score q.k / sqrt(D) and
    # mixes up to 70 value rows, over 2 layers, then the lm_head (0.2-std weights) maps them to
    # logits of magnitude ~4. Measured: max logit error 0.040 over the 30 steps (mean 0.015, and
    # >= 0.006 at every step). 0.1 leaves a 2.5x margin; it is a quarter of the median gap between
    # the top two logits (0.36), so it still means "the same model".
    assert errors.max() < 0.1, errors
    # Not trivially satisfied: every decode step reads quantized keys, so some error must show.
    assert errors.max() > 1e-3 and errors[1:].min() > 0
    agree = torch.stack([q.argmax(-1) == f.argmax(-1) for q, f in zip(quant_logits, full_logits)])
    assert agree.float().mean() >= 0.95


def test_quantized_memory_ratio():
    # A realistic head_dim (64): per-token value scales cost 2 floats per 64 channels, not per 8.
    config = small_config(hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
    B, K, D, L, R, S = 2, 2, 64, 2, 32, 1000
    cache = QuantizedKVCache(config, batch_size=B, residual_length=R)
    g = torch.Generator().manual_seed(0)
    for layer in range(L):
        cache.update(layer, torch.randn(B, K, S, D, generator=g), torch.randn(B, K, S, D, generator=g))
    Sq, Sr = S // R * R, S % R
    codes = 2 * L * B * K * Sq * D  # 1 byte per element, keys and values
    key_params = 2 * 4 * L * B * K * (Sq // R) * D  # (scale, min) per group of R tokens per channel
    value_params = 2 * 4 * L * B * K * Sq  # (scale, min) per token
    residual = 2 * 4 * L * B * K * Sr * D
    assert cache.nbytes() == codes + key_params + value_params + residual
    assert cache.full_precision_nbytes() == 2 * 4 * L * B * K * S * D
    assert cache.nbytes() < 0.4 * cache.full_precision_nbytes()  # ~0.30: 1.19 bytes/element vs 4


@torch.no_grad()
def test_quantized_small_model_memory(model):
    ids, _ = left_padded([64, 64], seed=10)
    cache = QuantizedKVCache(model.config, batch_size=2, residual_length=32)
    model(ids, cache=cache)
    # head_dim 8: values cost 1 + 8/8 bytes, keys 1 + 8/32 bytes per element -> 1.625 / 4 = 0.406.
    assert cache.nbytes() / cache.full_precision_nbytes() == pytest.approx(1.625 / 4)


# ---------------------------------------------------------------------------- expand, both caches
@pytest.mark.parametrize("kind", ["paged", "quantized"])
def test_expand_equals_separately_prefilled_rows(model, kind):
    G = 3
    ids, mask = left_padded([7, 4], seed=11)
    tokens = random_tokens(2 * G, 5, seed=12)

    def make(batch):
        if kind == "paged":
            return PagedKVCache(model.config, batch_size=batch, max_len=12, block_size=4, max_sequences=2 * G)
        return QuantizedKVCache(model.config, batch_size=batch, residual_length=4)

    got = cached_decode(model, make(2), ids, mask, tokens, expand=G)
    want = cached_decode(model, make(2 * G), ids.repeat_interleave(G, dim=0),
                         mask.repeat_interleave(G, dim=0), tokens)
    for step, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0, msg=f"step {step}")
    if kind == "paged":  # and both equal the no-cache forward
        full = full_decode(model, ids.repeat_interleave(G, dim=0), mask.repeat_interleave(G, dim=0), tokens)
        torch.testing.assert_close(got[-1], full[-1], atol=ATOL, rtol=0)


def test_every_cache_validates_its_sizes(model):
    config = model.config
    with pytest.raises(ValueError, match="max_len must satisfy 1 <= max_len"):
        StaticCache(config, batch_size=1, max_len=0)
    with pytest.raises(ValueError, match="residual_length must satisfy 1 <= residual_length"):
        QuantizedKVCache(config, batch_size=1, residual_length=0)
    with pytest.raises(ValueError, match="batch_size must be an integer"):
        QuantizedKVCache(config, batch_size=True)
    caches = [DynamicCache(), StaticCache(config, 1, 8), PagedKVCache(config, 1, 8, block_size=4),
              QuantizedKVCache(config, 1, residual_length=4)]
    for cache in caches:  # expand(0) would silently empty the batch
        with pytest.raises(ValueError, match="repeats must satisfy 1 <= repeats"):
            cache.expand(0)
