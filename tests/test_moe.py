"""The mixture-of-experts model (Mixtral / Qwen3-MoE style): parity with transformers built in-process,
the auxiliary losses, routing replay, generation with the KV caches, and bad settings.

Tolerances: the lab and transformers compute the same function in a different summation order
(the lab runs every expert on every token and keeps k with a weight matrix; transformers dispatches
token by token), so logits agree to fp32 rounding: `parity_tolerance` (tests/test_checkpoints.py)
derives it from fp32 eps and the length of the sums on the way to a logit. Routing itself is a
discontinuous function (top-k): it agrees only where the k-th and (k+1)-th router probabilities are
further apart than that rounding, which `assert_routing_margin` checks rather than assumes, so a
failure says "near-tie in this random model", not "wrong code".
"""

from __future__ import annotations

import math

import pytest
import test_families as families
import torch
from test_checkpoints import EPS32, parity_tolerance

from rlhf_lab.model import (
    CheckpointError,
    LlamaModel,
    ModelConfig,
    config_from_hf,
    from_hf,
    from_pretrained,
    load_balancing_loss,
    moe_aux_loss,
    router_z_loss,
    to_hf,
)
from rlhf_lab.model.hf import save_pretrained
from rlhf_lab.model.moe import SparseMoeBlock
from rlhf_lab.sampling import SamplingConfig, generate

transformers = pytest.importorskip("transformers")
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func  # noqa: E402

VOCAB, HIDDEN, E, K = families.VOCAB, 64, 6, 2  # padded_batch draws ids below families.VOCAB
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    num_experts_per_tok=K,
    router_aux_loss_coef=0.01,
)
CASES = [
    (
        "mixtral-tied",
        "MixtralConfig",
        dict(intermediate_size=48, num_local_experts=E, tie_word_embeddings=True),
    ),
    # Qwen3-MoE without renormalised top-k weights (transformers' default) and with (the released models')
    (
        "qwen3_moe-untied",
        "Qwen3MoeConfig",
        dict(
            intermediate_size=80,
            moe_intermediate_size=40,
            num_experts=E,
            norm_topk_prob=False,
            head_dim=32,
            tie_word_embeddings=False,
            rope_theta=1e6,
        ),
    ),
    (
        "qwen3_moe-norm",
        "Qwen3MoeConfig",
        dict(
            intermediate_size=80,
            moe_intermediate_size=40,
            num_experts=E,
            norm_topk_prob=True,
            head_dim=16,
            tie_word_embeddings=True,
        ),
    ),
]


def build_hf(class_name: str, kwargs: dict, seed: int = 0):
    """A random transformers MoE model (test_families' recipe: weights of std 0.1, so router logits are of
    order 1 and the routing is decided, not a near-tie of ~0 logits; random norm gains)."""
    return families.build_hf(class_name, kwargs, seed, common=COMMON)


def padded_batch(seed: int = 1):
    """Three rows of different lengths, left-padded: (ids (3, 11), attention_mask (3, 11))."""
    ids, mask, _ = families.padded_batch(seed)
    return ids, mask


def assert_routing_margin(router_logits, top_k: int, tolerance: float) -> None:
    """Top-k is decided where p_(k) - p_(k+1) exceeds the rounding `tolerance` of the router probabilities."""
    for layer in router_logits:
        probs = torch.softmax(layer.float(), -1).sort(-1, descending=True).values
        gap = (probs[..., top_k - 1] - probs[..., top_k]).min().item()
        assert gap > tolerance, f"near-tie in the random model's routing ({gap:.2e}): pick another seed"


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def pair(request):
    """(transformers' random MoE model, the lab's copy of it)."""
    hf = build_hf(*request.param[1:])
    return hf, from_hf(hf).eval()


def test_config_maps_the_moe_options(pair):
    hf, lab = pair
    c, h = lab.config, hf.config
    assert c.model_type == h.model_type and c.is_moe
    assert c.num_local_experts == E and c.num_experts_per_tok == K
    assert c.router_aux_loss_coef == h.router_aux_loss_coef
    assert c.norm_topk_prob == (True if c.model_type == "mixtral" else h.norm_topk_prob)
    assert c.expert_intermediate_size == (h.intermediate_size if c.model_type == "mixtral"
                                          else h.moe_intermediate_size)
    names = {n for n, _ in lab.named_parameters()}
    assert any("q_norm" in n for n in names) == (c.model_type == "qwen3_moe")
    assert "model.layers.0.mlp.gate.weight" in names and "model.layers.0.mlp.experts.gate_up_proj" in names
    assert not any("up_proj.weight" in n for n in names)  # no dense MLP left


def test_logits_router_logits_and_aux_loss_match_transformers(pair):
    hf, lab = pair
    ids, mask = padded_batch()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                      output_router_logits=True)
        got = lab(ids, attention_mask=mask)
    real = mask.bool()
    atol, rtol = parity_tolerance(lab.config, expected.logits)
    assert atol < 1e-3, (
        "the tolerance must stay far below the effect of a real bug (a wrong expert moves logits by ~0.1)"
    )
    # Router logits are one dot product of length `hidden` deeper than half a layer: the same bound, on their
    # scale.
    router_scale = max(r.abs().max().item() for r in got.router_logits)
    assert_routing_margin([r[real] for r in got.router_logits], K, 10 * rtol)
    for ours, theirs in zip(got.router_logits, expected.router_logits):
        assert ours.dtype == torch.float32 and ours.shape == (3, 11, E)
        torch.testing.assert_close(ours[real], theirs.view(3, 11, E)[real], atol=rtol * router_scale,
                                   rtol=rtol)
    torch.testing.assert_close(got.logits[real], expected.logits[real], atol=atol, rtol=rtol)
    # transformers' aux_loss is the bare load-balancing loss over the non-padding tokens (its loss adds coef *
    # it)
    torch.testing.assert_close(got.aux_loss, lab.config.router_aux_loss_coef * expected.aux_loss, atol=0,
                               rtol=rtol)


def test_to_hf_from_hf_round_trip_and_saved_folder(pair, tmp_path):
    hf, lab = pair
    back = to_hf(lab)
    assert type(back) is type(hf)
    assert set(back.state_dict()) == set(hf.state_dict())
    for name, tensor in hf.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name  # a copy: bit-equal
    assert from_hf(back).config == lab.config
    save_pretrained(lab, tmp_path / "ckpt")
    reloaded = from_pretrained(tmp_path / "ckpt")
    assert reloaded.config == lab.config
    auto = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "ckpt", attn_implementation="eager").float()
    assert type(auto) is type(hf)
    ids, mask = padded_batch(3)
    with torch.no_grad():
        a, b = reloaded(ids, attention_mask=mask).logits, lab(ids, attention_mask=mask).logits
        c = auto(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    assert torch.equal(a, b)
    atol, rtol = parity_tolerance(lab.config, c)
    torch.testing.assert_close(a[mask.bool()], c[mask.bool()], atol=atol, rtol=rtol)


def test_cached_generation_equals_uncached_and_transformers(pair):
    hf, lab = pair
    ids, mask = padded_batch(4)
    steps = 8
    runs = {
        kind: generate(
            lab,
            ids,
            SamplingConfig(do_sample=False, max_new_tokens=steps),
            attention_mask=mask,
            cache=kind,
            stop_at_eos=False,
        ).completion_ids
        for kind in ("none", "static", "dynamic", "paged")
    }
    assert all(torch.equal(runs[kind], runs["none"]) for kind in ("static", "dynamic", "paged"))
    # Cached and uncached decoding round differently (other matmul shapes); equal routing needs decided top-k.
    full = torch.cat([ids, runs["static"]], 1)
    with torch.no_grad():
        routing = lab(full, attention_mask=torch.cat([mask, torch.ones_like(runs["static"])],
                                                     1)).router_logits
    _, rtol = parity_tolerance(lab.config, routing[0])
    assert_routing_margin([r[:, ids.shape[1] - 4:] for r in routing], K, 10 * rtol)  # the shortest prompt on
    with torch.no_grad():
        theirs = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps,
                             do_sample=False, pad_token_id=0, eos_token_id=None)[:, ids.shape[1]:]
    assert torch.equal(runs["static"], theirs)
    sampled = [
        generate(
            lab,
            ids,
            SamplingConfig(do_sample=True, temperature=1.0, max_new_tokens=steps, seed=3),
            attention_mask=mask,
            cache=kind,
            stop_at_eos=False,
        ).completion_ids
        for kind in ("none", "static")
    ]
    assert torch.equal(*sampled)


# ------------------------------------------------------------------------------------- aux losses

def small_moe(seed: int = 0, model_type: str = "mixtral") -> LlamaModel:
    torch.manual_seed(seed)
    config = ModelConfig(
        model_type=model_type,
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=E,
        num_experts_per_tok=K,
        initializer_range=0.2,
    )
    return LlamaModel(config).eval()


def random_router_logits(seed: int, layers: int = 3, shape=(4, 9, E)):
    g = torch.Generator().manual_seed(seed)
    return tuple(2 * torch.randn(shape, generator=g) for _ in range(layers))


def test_load_balancing_loss_equals_transformers():
    """Sums of ~100 products of values <= 1 (f_e, P_e): rounding ~sqrt(100) eps relative; 64 eps is ample."""
    logits = random_router_logits(0)
    flat = tuple(layer.reshape(-1, E) for layer in logits)  # transformers takes (B*T, E) per layer
    mask = torch.ones(4, 9, dtype=torch.long)
    mask[0, :3] = 0
    mask[2, :7] = 0
    for top_k in (1, 2, 3):
        for attention_mask in (None, mask):
            ours = load_balancing_loss(logits, E, top_k, attention_mask)
            theirs = load_balancing_loss_func(flat, E, top_k, attention_mask)
            torch.testing.assert_close(ours, theirs, atol=0, rtol=64 * EPS32)
    # Padding changes the value (the masked rows are excluded, not zero-weighted into the mean)
    assert not torch.isclose(load_balancing_loss(logits, E, K, mask), load_balancing_loss(logits, E, K))


def test_load_balancing_loss_is_top_k_when_balanced():
    """Each of E experts top-1 for one token with the same probabilities: f_e = k/E, P_e = 1/E, L_aux = k."""
    logits = (torch.eye(4) * 3.0,)  # token t prefers expert t; the others tie, and topk breaks ties alike
    assert load_balancing_loss(logits, 4, 1).item() == pytest.approx(1.0, rel=4 * EPS32)
    skewed = (torch.tensor([[3.0, 0, 0, 0]] * 4),)  # everyone on expert 0: f_0 = 1, P_0 = e^3 / (e^3 + 3)
    p0 = math.exp(3) / (math.exp(3) + 3)
    assert load_balancing_loss(skewed, 4, 1).item() == pytest.approx(4 * p0, rel=4 * EPS32)


def test_router_z_loss_by_hand():
    # rows [0, 0] and [ln 3, 0]: logsumexp = ln 2 and ln 4; two layers, second with one padded row
    a = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0]]])  # (1, 2, 2)
    assert router_z_loss((a,)).item() == pytest.approx((math.log(2) ** 2 + math.log(4) ** 2) / 2,
                                                       rel=4 * EPS32)
    mask = torch.tensor([[0, 1]])
    assert router_z_loss((a, a), mask).item() == pytest.approx(math.log(4) ** 2, rel=4 * EPS32)


def test_aux_loss_in_the_output_is_both_coefficients_over_real_tokens():
    config = ModelConfig(
        model_type="qwen3_moe",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=4,
        router_aux_loss_coef=0.02,
        router_z_loss_coef=0.003,
    )
    model = LlamaModel(config).eval()
    ids, mask = padded_batch(5)
    with torch.no_grad():
        out = model(ids, attention_mask=mask)
    lb = load_balancing_loss(out.router_logits, 4, 2, mask)
    z = router_z_loss(out.router_logits, mask)
    assert out.aux_loss.item() == pytest.approx(0.02 * lb.item() + 0.003 * z.item(), rel=8 * EPS32)
    assert moe_aux_loss(config, out.router_logits, mask).item() == out.aux_loss.item()
    dense = LlamaModel(
        ModelConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )(ids)
    assert dense.router_logits is None and dense.expert_indices is None and dense.aux_loss is None


def test_sft_loss_adds_the_router_losses_over_real_tokens():
    from rlhf_lab.sft import completion_loss

    model = small_moe(3, "qwen3_moe")
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    ids[1, 6:] = model.config.pad_token_id  # right padding, as SFT batches have
    loss_mask = torch.zeros(2, 9)
    loss_mask[0, 4:], loss_mask[1, 4:6] = 1, 1
    with torch.no_grad():
        out = model(ids[:, :-1])
        nll = torch.nn.functional.cross_entropy(out.logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1),
                                                reduction="none")
        ce = (nll * loss_mask[:, 1:].reshape(-1)).sum() / loss_mask[:, 1:].sum()
        aux = moe_aux_loss(model.config, out.router_logits, ids[:, :-1] != model.config.pad_token_id)
        assert aux.item() != pytest.approx(out.aux_loss.item(), rel=1e-4)  # the padding is left out
        assert completion_loss(
            model, ids, loss_mask).item() == pytest.approx((ce + aux).item(), rel=16 * EPS32)


# ---------------------------------------------------------------------------------- routing replay

def naive_moe(block: SparseMoeBlock, x: torch.Tensor, expert_indices: torch.Tensor) -> torch.Tensor:
    """The definition, token by token: y_n = sum_j w_nj * down_e(silu(gate_e(x_n)) * up_e(x_n)),
    e = indices[n, j], w = the block's current softmax probabilities at those experts, renormalised.
    x (N, C) -> (N, C)."""
    probs = torch.softmax(block.gate(x).float(), -1)
    I = block.experts.intermediate_size
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        w = probs[n, expert_indices[n]]
        w = w / w.sum() if block.norm_topk_prob else w
        for j, e in enumerate(expert_indices[n].tolist()):
            gate_up = block.experts.gate_up_proj[e] @ x[n]
            hidden = torch.nn.functional.silu(gate_up[:I]) * gate_up[I:]
            out[n] += w[j] * (block.experts.down_proj[e] @ hidden)
    return out


def test_block_equals_the_token_by_token_definition_with_its_own_and_replayed_experts():
    model = small_moe(model_type="qwen3_moe")
    block = model.model.layers[0].mlp
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y, logits, chosen = block(x)
        assert torch.equal(chosen, torch.topk(torch.softmax(logits, -1), K, -1).indices)
        # Sums of ~I + k terms of order |y|: 16 eps of the output's scale covers their rounding.
        scale = y.abs().max().item()
        torch.testing.assert_close(y.view(10, 32), naive_moe(block, x.view(10, 32), chosen.view(10, K)),
                                   atol=16 * EPS32 * scale, rtol=16 * EPS32)
        other = (chosen + 1) % E  # experts the router did not choose
        y_replay, _, used = block(x, other)
        assert torch.equal(used, other)
        torch.testing.assert_close(y_replay.view(10, 32), naive_moe(block, x.view(10, 32), other.view(10, K)),
                                   atol=16 * EPS32 * scale, rtol=16 * EPS32)


def test_replay_reproduces_the_models_own_routing_exactly():
    model = small_moe()
    ids, mask = padded_batch(6)
    with torch.no_grad():
        first = model(ids, attention_mask=mask)
        again = model(ids, attention_mask=mask, expert_indices=first.expert_indices)
    assert torch.equal(again.logits, first.logits)  # same experts, same weights: the same arithmetic
    for a, b in zip(again.expert_indices, first.expert_indices):
        assert a.dtype == torch.long and a.shape == (3, 11, K) and torch.equal(a, b)


def test_after_an_update_replay_uses_the_old_experts_and_the_router_still_learns():
    model = small_moe(1)
    ids, mask = padded_batch(7)
    real = mask.bool()
    with torch.no_grad():
        old = model(ids, attention_mask=mask)
        for layer in model.model.layers:  # an "update" that moves the router: some tokens change experts
            layer.mlp.gate.weight.add_(0.3 * torch.randn_like(layer.mlp.gate.weight))
        new = model(ids, attention_mask=mask)
    changed = sum(int((a != b).any(-1)[real].sum()) for a, b in zip(new.expert_indices, old.expert_indices))
    assert changed > 0, "the perturbation must flip some routing for the test to mean anything"
    captured = []
    handle = model.model.layers[
        0].mlp.register_forward_hook(lambda m, inputs, output: captured.append(inputs[0]))
    model.train()
    replayed = model(ids, attention_mask=mask, expert_indices=old.expert_indices)
    handle.remove()
    for used, before in zip(replayed.expert_indices, old.expert_indices):
        assert torch.equal(used, before)
    # Which experts ran: layer 0's output equals the definition evaluated with the OLD experts.
    block = model.model.layers[0].mlp
    x = captured[0].detach().reshape(-1, 32)
    with torch.no_grad():
        y_replay = block(captured[0].detach(), old.expert_indices[0])[0].reshape(-1, 32)
        expected = naive_moe(block, x, old.expert_indices[0].reshape(-1, K))
        y_own = block(captured[0].detach())[0].reshape(-1, 32)
    scale = y_replay.abs().max().item()
    torch.testing.assert_close(y_replay, expected, atol=16 * EPS32 * scale, rtol=16 * EPS32)
    assert not torch.allclose(y_own, y_replay, atol=1e-4), "replay must differ from the new routing"
    # and the current router gets a gradient through the gate weights of the replayed experts
    (replayed.logits[real].logsumexp(-1).sum() + replayed.aux_loss).backward()
    assert all(layer.mlp.gate.weight.grad.abs().sum() > 0 for layer in model.model.layers)


def test_gradient_checkpointing_keeps_logits_and_routing():
    model = small_moe(2).train()
    ids, mask = padded_batch(8)
    plain = model(ids, attention_mask=mask)
    model.gradient_checkpointing_enable()
    recomputed = model(ids, attention_mask=mask)
    assert torch.equal(plain.logits, recomputed.logits)
    assert all(torch.equal(a, b) for a, b in zip(plain.expert_indices, recomputed.expert_indices))
    recomputed.aux_loss.backward()
    assert model.model.layers[1].mlp.gate.weight.grad is not None


# ------------------------------------------------------------------------------------- bad settings

BASE = dict(vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1)
BAD_CONFIGS = [
    (dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=5), "num_experts_per_tok"),
    (dict(model_type="mixtral", num_local_experts=0), "num_local_experts"),
    (dict(model_type="llama", num_local_experts=4), "num_local_experts"),
    (dict(model_type="qwen3_moe", num_local_experts=4, num_experts_per_tok=0), "num_experts_per_tok"),
    (dict(model_type="mixtral", num_local_experts=4, norm_topk_prob=False), "norm_topk_prob"),
    (dict(model_type="mixtral", num_local_experts=4, moe_intermediate_size=8), "moe_intermediate_size"),
    (dict(model_type="qwen3_moe", num_local_experts=4, router_aux_loss_coef=-0.1), "router_aux_loss_coef"),
    (
        dict(model_type="qwen3_moe", num_local_experts=4, router_z_loss_coef=float("nan")),
        "router_z_loss_coef",
    ),
    (dict(model_type="qwen3_moe", num_local_experts=2.5), "num_local_experts"),
    (dict(model_type="mixtral_v2", num_local_experts=4), "model_type"),
]


@pytest.mark.parametrize("options,named", BAD_CONFIGS, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD_CONFIGS)])
def test_bad_settings_raise_naming_the_field(options, named):
    with pytest.raises(ValueError, match=named):
        ModelConfig(**BASE, **options)


def test_bad_expert_indices_raise_naming_the_problem():
    model = small_moe()
    ids = torch.randint(3, VOCAB, (2, 5))
    good = model(ids).expert_indices
    with pytest.raises(ValueError, match="one .* per MoE layer"):
        model(ids, expert_indices=good[:1])
    with pytest.raises(ValueError, match=r"shape \(B, T, num_experts_per_tok\)"):
        model(ids, expert_indices=(good[0][..., :1], good[1]))
    with pytest.raises(ValueError, match=r"\[0, num_local_experts\)"):
        model(ids, expert_indices=(good[0], good[1] + E))
    with pytest.raises(ValueError, match="long tensors"):
        model(ids, expert_indices=(good[0].float(), good[1]))
    dense = LlamaModel(ModelConfig(**BASE))
    with pytest.raises(ValueError, match="per MoE layer"):
        dense(ids.clamp(max=31), expert_indices=good)


REFUSED = [
    ("qwen3_moe", {"mlp_only_layers": [0]}, "mlp_only_layers"),
    ("qwen3_moe", {"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ("mixtral", {"sliding_window": 16}, "sliding_window"),
    ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise"),
]


@pytest.mark.parametrize("model_type,options,named", REFUSED, ids=[r[2] for r in REFUSED])
def test_unsupported_moe_options_are_refused_by_name(model_type, options, named):
    config = {
        "model_type": model_type,
        **BASE,
        "num_local_experts": 4,
        "num_experts": 4,
        "moe_intermediate_size": 8,
        **options,
    }
    with pytest.raises(CheckpointError, match=named):
        config_from_hf(config)


def test_released_config_keys_are_read():
    """Qwen3-30B-A3B's config.json says "num_experts" (transformers writes "num_local_experts"); Mixtral's
    says "num_local_experts" and has no norm_topk_prob (it always renormalises)."""
    qwen = config_from_hf({"model_type": "qwen3_moe", **BASE, "num_experts": 128, "num_experts_per_tok": 8,
                           "moe_intermediate_size": 8, "norm_topk_prob": True, "router_aux_loss_coef": 0.001})
    assert (qwen.num_local_experts, qwen.num_experts_per_tok, qwen.expert_intermediate_size) == (128, 8, 8)
    assert qwen.norm_topk_prob and qwen.qk_norm
    mixtral = config_from_hf(
        {
            "model_type": "mixtral",
            **BASE,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "sliding_window": None,
        }
    )
    assert (
        (mixtral.num_local_experts, mixtral.expert_intermediate_size, mixtral.norm_topk_prob) == (8, 16, True)
    )
    assert not mixtral.qk_norm
