"""Mechanism exercises: sampling filters, the repetition penalty, RoPE in both forms, one attention
decode step with a KV cache, and the backward pass of softmax attention by hand.

References are the package's functions (sampling/processors.py, model/rope.py, model/kv_cache.py,
model/transformer.py), composed where the exercise asks for several at once. The attention backward
pass is the one reference written here (the package leaves it to autograd); the tests check it
against autograd.
"""

from __future__ import annotations

import torch

from ..model.kv_cache import DynamicCache
from ..model.rope import RotaryEmbedding, apply_rope, rotate_half
from ..model.transformer import eager_attention
from ..sampling.processors import apply_repetition_penalty, apply_temperature, apply_top_k, apply_top_p
from .core import Case, Exercise, Mistake, spec_cases


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------------------------
# temperature -> top-k -> top-p


def filter_logits(scores: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The package's warpers in generate()'s order (processors.py): temperature, top-k, top-p."""
    return apply_top_p(apply_top_k(apply_temperature(scores, temperature), top_k), top_p)


def _top_p_drops_crossing(scores, temperature, top_k, top_p):
    scores = apply_top_k(scores / temperature, top_k)
    sorted_scores, order = torch.sort(scores, descending=True)
    cumulative = sorted_scores.softmax(-1).cumsum(-1)
    remove_sorted = cumulative > top_p  # drops the token whose probability crosses p
    remove_sorted[..., 0] = False
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return scores.masked_fill(remove, float("-inf"))


def _top_p_before_temperature(scores, temperature, top_k, top_p):
    return apply_top_p(apply_top_k(scores, top_k), top_p) / temperature


def _top_p_ignores_top_k(scores, temperature, top_k, top_p):
    tempered = scores / temperature
    nucleus = apply_top_p(tempered, top_p)  # nucleus of the full distribution, not of what top-k kept
    kept = apply_top_k(tempered, top_k)
    return torch.where(torch.isinf(nucleus), nucleus, kept)


def _top_p_empties_nucleus(scores, temperature, top_k, top_p):
    scores = apply_top_k(scores / temperature, top_k)
    sorted_scores, order = torch.sort(scores, descending=True)
    cumulative = sorted_scores.softmax(-1).cumsum(-1)
    remove_sorted = cumulative > top_p  # the natural first try: also removes the top token when p_top > p
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return scores.masked_fill(remove, float("-inf"))


def _top_k_drops_ties(scores, temperature, top_k, top_p):
    tempered = scores / temperature
    if top_k:
        # with stable=, dim must be a keyword (argsort(-1, ..., stable=True) raises TypeError)
        order = torch.argsort(tempered, dim=-1, descending=True, stable=True)
        keep = torch.zeros_like(tempered, dtype=torch.bool).scatter(1, order[:, :top_k], True)
        tempered = tempered.masked_fill(~keep, float("-inf"))  # exactly k, ties with the k-th dropped
    return apply_top_p(tempered, top_p)


def _temperature_multiplied(scores, temperature, top_k, top_p):
    return apply_top_p(apply_top_k(scores * temperature, top_k), top_p)


def filter_cases(seed: int) -> list[Case]:
    probs = torch.tensor([[0.3, 0.1, 0.1, 0.5]])
    cases = spec_cases([("known value: probs [0.3, 0.1, 0.1, 0.5], p 0.8 keeps {0.5, 0.3}", {
        "scores": probs.log(), "temperature": 1.0, "top_k": 0, "top_p": 0.8},
        [[probs[0, 0].log().item(), -float("inf"), -float("inf"), probs[0, 3].log().item()]],
        "已知值：概率 [0.3, 0.1, 0.1, 0.5]，p = 0.8 时保留 {0.5, 0.3}")])
    cases.append(Case("ties at the k-th score", {"scores": torch.tensor([[2.0, 1.0, 1.0, 0.5, -1.0]]),
                                                  "temperature": 1.0, "top_k": 2, "top_p": 1.0},
                      name_zh="第 k 大的 logit 有并列"))
    confident = torch.tensor([[0.9, 0.05, 0.03, 0.02]])
    cases.append(Case("a confident distribution: the top token alone has 0.9 > p = 0.8", {
        "scores": confident.log(), "temperature": 1.0, "top_k": 0, "top_p": 0.8},
        name_zh="分布很集中：概率最高的 token 单独就有 0.9 > p = 0.8"))
    g = _generator(seed)
    for i, (temperature, top_k, top_p) in enumerate([(0.7, 0, 0.9), (1.5, 5, 0.8), (1.0, 3, 0.95),
                                                     (0.5, 8, 0.6), (2.0, 0, 0.5)]):
        cases.append(Case(f"random {i}: T {temperature}, k {top_k}, p {top_p}", {
            "scores": torch.randn(3, 12, generator=g) * 2, "temperature": temperature, "top_k": top_k,
            "top_p": top_p}, name_zh=f"随机用例 {i}：温度 {temperature}，k = {top_k}，p = {top_p}"))
    return cases


FILTER_MISTAKES = (
    Mistake("top_p_drops_crossing_token", "top-p keeps the token whose probability CROSSES p (the smallest "
            "set with mass >= p): for probs [0.3, 0.1, 0.1, 0.5], p = 0.8 keeps {0.5, 0.3}. Remove a token "
            "only when the mass before it already reaches p.", _top_p_drops_crossing,
            zh="top-p 要保留让累计概率越过 p 的那个 token（取累计概率 ≥ p 的最小集合）：概率为 [0.3, 0.1, "
               "0.1, 0.5]、"
               "p = 0.8 时保留 {0.5, 0.3}。只有当排在它前面的累计概率已经达到 p，才删掉这个 token。"),
    Mistake("top_p_empties_nucleus", "`cumsum > p` also removes the token that crosses p, and when the "
            "most likely token alone has probability > p it removes EVERY token: the nucleus is empty "
            "and all scores are -inf (sampling from that fails). Remove a token only when the mass "
            "before it reaches p (shift the mask right by one), which always keeps the top token.",
            _top_p_empties_nucleus,
            zh="`cumsum > p` 会把越过 p 的那个 token 也删掉；当概率最高的 token 单独就超过 p 时，所有 token "
               "都被删光，候选集（核）为空，logits 全是 -inf，无法采样。只有排在前面的累计概率已达到 p "
               "时才删掉一个 token（把删除掩码右移一位），这样概率最高的 token 总会保留。"),
    Mistake("filter_before_temperature", "temperature comes first: top-p's nucleus is computed on the "
            "TEMPERED distribution (HF's order: temperature -> top-k -> top-p).", _top_p_before_temperature,
            zh="温度要最先作用：top-p 的核是在除以温度之后的分布上算的（HF 的顺序：温度 → top-k → top-p）。"),
    Mistake("top_p_ignores_top_k", "top-p works on what top-k left (renormalised), not on the full "
            "distribution.", _top_p_ignores_top_k,
            zh="top-p 作用在 top-k 留下的 token 上（重新归一化之后），而不是完整的分布。"),
    Mistake("top_k_drops_ties", "top-k keeps every token scoring at least the k-th largest score, ties "
            "included (HF's rule), not exactly k indices.", _top_k_drops_ties,
            zh="top-k 保留 logit 不低于第 k 大值的所有 token，并列的也保留（HF 的规则），而不是恰好 k "
               "个下标。"),
    Mistake("temperature_multiplied", "divide the logits by the temperature (T < 1 sharpens).",
            _temperature_multiplied, zh="logits 要除以温度，而不是乘（T < 1 时分布更尖锐）。"),
)


# ----------------------------------------------------------------------------------------------
# repetition penalty


def _penalty_ignores_sign(scores, input_ids, penalty):
    seen = torch.zeros_like(scores, dtype=torch.bool).scatter(1, input_ids, True)
    return torch.where(seen, scores / penalty, scores)


def _penalty_per_occurrence(scores, input_ids, penalty):
    ones = torch.ones_like(input_ids, dtype=scores.dtype)
    counts = torch.zeros_like(scores).scatter_add(1, input_ids, ones)
    factor = penalty ** counts
    return torch.where(scores < 0, scores * factor, scores / factor)


def _penalty_inverted(scores, input_ids, penalty):
    seen = torch.zeros_like(scores, dtype=torch.bool).scatter(1, input_ids, True)
    return torch.where(seen, torch.where(scores < 0, scores / penalty, scores * penalty), scores)


def penalty_cases(seed: int) -> list[Case]:
    cases = [Case("one negative, one positive seen logit", {
        "scores": torch.tensor([[2.0, -1.0, 0.5, 3.0]]), "input_ids": torch.tensor([[0, 1, 1]]),
        "penalty": 1.2},
        name_zh="出现过的 token 中，一个 logit 为负、一个为正")]
    g = _generator(seed)
    for i, penalty in enumerate([1.2, 1.5, 0.8]):
        cases.append(Case(f"random {i}: penalty {penalty}", {
            "scores": torch.randn(3, 10, generator=g) * 2,
            "input_ids": torch.randint(0, 10, (3, 6), generator=g), "penalty": penalty},
            name_zh=f"随机用例 {i}：惩罚系数 {penalty}"))
    return cases


PENALTY_MISTAKES = (
    Mistake("ignores_logit_sign", "dividing a NEGATIVE logit by the penalty raises it (-2 / 1.2 = -1.67): "
            "the seen token becomes MORE likely. Multiply negative logits, divide positive ones (HF's form).",
            _penalty_ignores_sign,
            zh="负的 logit 除以惩罚系数反而变大（−2 / 1.2 = −1.67），出现过的 token 更容易被选中。"
               "应当负数乘、正数除（HF 的写法）。"),
    Mistake("penalised_per_occurrence", "each token id is penalised once, however many times it occurs "
            "(HF gathers the unique ids); counts are the frequency penalty, a different knob.",
            _penalty_per_occurrence,
            zh="每个 token id 只惩罚一次，不论出现多少次（HF 取的是去重后的 id）；按出现次数惩罚的是频率惩罚"
               "，那是另一个参数。"),
    Mistake("inverted", "a penalty > 1 must LOWER the seen token: positive logits / penalty, negative "
            "logits * penalty.", _penalty_inverted,
            zh="惩罚系数大于 1 时，出现过的 token 应当变得更不可能：正的 logit 除以系数，负的乘以系数。"),
)


# ----------------------------------------------------------------------------------------------
# RoPE, both forms


def rope_half_split(x: torch.Tensor, position_ids: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """HF / GPT-NeoX form: the package's RotaryEmbedding tables and apply_rope(interleaved=False)."""
    cos, sin = RotaryEmbedding(x.shape[-1], base)(position_ids)
    return apply_rope(x, cos, sin, interleaved=False)


def rope_complex(x: torch.Tensor, position_ids: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Meta's llama form (pairs (2i, 2i+1) as complex numbers): apply_rope(interleaved=True)."""
    cos, sin = RotaryEmbedding(x.shape[-1], base)(position_ids)
    return apply_rope(x, cos, sin, interleaved=True)


def _angles(x, position_ids, base, exponent_step=2):
    d = x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2).float() / d) if exponent_step == 2 else \
        1.0 / base ** (torch.arange(0, d // 2).float() / d)
    return position_ids[..., None].float() * inv_freq  # (batch, seq, d/2)


def _half_split_with(angles_fn=_angles, pairing="half", sign=1.0, layout="cat"):
    def variant(x, position_ids, base=10000.0):
        angles = angles_fn(x, position_ids, base)
        if layout == "cat":
            cos = torch.cat((angles.cos(), angles.cos()), -1)[:, None]
            sin = torch.cat((angles.sin(), angles.sin()), -1)[:, None]
        else:  # repeat_interleave: the interleaved layout's tables
            cos = angles.cos().repeat_interleave(2, -1)[:, None]
            sin = angles.sin().repeat_interleave(2, -1)[:, None]
        if pairing == "half":
            return x * cos + sign * rotate_half(x) * sin
        pairs = x.unflatten(-1, (-1, 2))
        rotated_pairs = torch.stack((-pairs[..., 1], pairs[..., 0]), -1).flatten(-2)
        return x * cos + sign * rotated_pairs * sin

    return variant


def _complex_with(angles_fn=_angles, conjugate=False, pairing="interleaved"):
    def variant(x, position_ids, base=10000.0):
        angles = angles_fn(x, position_ids, base)
        rotation = torch.polar(torch.ones_like(angles), -angles if conjugate else angles)[:, None]
        if pairing == "interleaved":
            z = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)).contiguous())
            return torch.view_as_real(z * rotation).flatten(-2)
        first, second = x.float().chunk(2, -1)
        z = torch.complex(first, second) * rotation
        return torch.cat((z.real, z.imag), -1)

    return variant


def rope_cases(seed: int) -> list[Case]:
    g = _generator(seed)
    cases = []
    for i, (batch, heads, seq, dim, base) in enumerate([(1, 1, 4, 8, 10000.0), (2, 3, 5, 16, 10000.0),
                                                       (2, 2, 3, 8, 100.0)]):
        positions = torch.randint(0, 50, (batch, seq), generator=g)
        positions[:, 0] = 0  # position 0 is the identity
        cases.append(Case(f"random {i}: head_dim {dim}, base {base}", {
            "x": torch.randn(batch, heads, seq, dim, generator=g), "position_ids": positions, "base": base},
            name_zh=f"随机用例 {i}：head_dim = {dim}，base = {base}"))
    return cases


ROPE_HALF_MISTAKES = (
    Mistake("interleaved_pairing", "HF's form pairs dim i with dim i + d/2 (rotate_half); pairing (2i, 2i+1) "
            "is Meta's interleaved convention. The two agree only after permuting q/k projection rows.",
            _half_split_with(pairing="interleaved", layout="repeat"),
            zh="HF 的写法把第 i 维与第 i + d/2 维配对（`rotate_half`）；相邻的 (2i, 2i+1) 配对是 Meta "
               "的交错写法。"
               "两者只有在对 q、k 投影矩阵的行做置换之后才等价。"),
    Mistake("rotate_half_sign", "rotate_half(x) = cat(-x2, x1); cat(x2, -x1) rotates by -m*theta.",
            _half_split_with(sign=-1.0), zh="`rotate_half(x) = cat(-x2, x1)`；写成 `cat(x2, -x1)` 就转成了 "
                                            "−mθ。"),
    Mistake("tables_repeat_interleaved", "with rotate_half the cos/sin tables are cat(freqs, freqs) "
            "(dim i and i + d/2 share theta_i), not repeat_interleave(freqs, 2).",
            _half_split_with(layout="repeat"),
            zh="配合 `rotate_half` 时，cos/sin 表是 `cat(freqs, freqs)`（第 i 维和第 i + d/2 维共用 θ_i），"
               "不是 `repeat_interleave(freqs, 2)`。"),
    Mistake("wrong_frequencies", "theta_i = base^(-2i/d) for i = 0..d/2-1 (torch.arange(0, d, 2) / d), not "
            "base^(-i/d).", _half_split_with(angles_fn=lambda x, p, b: _angles(x, p, b, exponent_step=1)),
            zh="θ_i = base^(−2i/d)，i = 0..d/2−1（`torch.arange(0, d, 2) / d`），不是 base^(−i/d)。"),
)

ROPE_COMPLEX_MISTAKES = (
    Mistake("half_split_pairing", "the complex form pairs (2i, 2i+1) as one complex number "
            "(x.unflatten(-1, (-1, 2)) then view_as_complex); pairing i with i + d/2 is HF's convention.",
            _complex_with(pairing="half"),
            zh="复数写法把 (2i, 2i+1) 组成一个复数（先 `x.unflatten(-1, (-1, 2))` 再 `view_as_complex`）；"
               "第 i 维与第 i + d/2 维配对是 HF 的约定。"),
    Mistake("conjugate_rotation", "multiply by e^{+i m theta_i} (torch.polar(ones, angles)); the conjugate "
            "rotates backwards.", _complex_with(conjugate=True),
            zh="要乘以 e^{+i m θ_i}（`torch.polar(ones, angles)`）；乘它的共轭就转反了。"),
    Mistake("wrong_frequencies", "theta_i = base^(-2i/d) for i = 0..d/2-1, not base^(-i/d).",
            _complex_with(angles_fn=lambda x, p, b: _angles(x, p, b, exponent_step=1)),
            zh="θ_i = base^(−2i/d)，i = 0..d/2−1，不是 base^(−i/d)。"),
)


# ----------------------------------------------------------------------------------------------
# one attention decode step with a KV cache


def attention_decode_step(q, k_new, v_new, k_cache, v_cache):
    """The package's pieces: DynamicCache.update appends along the sequence axis, eager_attention
    attends (GQA by repeating each kv head for its query heads). Returns (out, k_cache, v_cache)."""
    cache = DynamicCache()
    cache.update(0, k_cache, v_cache)
    keys, values = cache.update(0, k_new, v_new)  # (B, K, S + 1, D)
    return eager_attention(q, keys, values, None), keys, values


def _decode_variant(no_scale=False, repeat_wrong=False, only_past=False, causal_mask=False):
    def variant(q, k_new, v_new, k_cache, v_cache):
        keys, values = torch.cat((k_cache, k_new), 2), torch.cat((v_cache, v_new), 2)
        k_att, v_att = (k_cache, v_cache) if only_past else (keys, values)
        group = q.shape[1] // k_att.shape[1]
        if repeat_wrong:
            def expand(t):
                return t.repeat(1, group, 1, 1)
        else:
            def expand(t):
                return t.repeat_interleave(group, 1)
        k_att, v_att = expand(k_att), expand(v_att)
        scores = q @ k_att.transpose(-1, -2)
        if not no_scale:
            scores = scores * q.shape[-1] ** -0.5
        if causal_mask:  # a (T x S) causal mask built for T = 1 hides every key but the first
            hidden = torch.triu(torch.ones(q.shape[2], k_att.shape[2], dtype=torch.bool), diagonal=1)
            scores = scores.masked_fill(hidden, float("-inf"))
        return torch.softmax(scores, -1) @ v_att, keys, values

    return variant


def decode_cases(seed: int) -> list[Case]:
    g = _generator(seed)
    cases = []
    shapes = [(1, 2, 2, 3, 4), (2, 4, 2, 5, 8), (2, 6, 2, 4, 4)]
    for i, (batch, heads, kv_heads, past, dim) in enumerate(shapes):
        cases.append(Case(f"random {i}: {heads} query heads, {kv_heads} kv heads, {past} cached", {
            "q": torch.randn(batch, heads, 1, dim, generator=g) * 2,
            "k_new": torch.randn(batch, kv_heads, 1, dim, generator=g),
            "v_new": torch.randn(batch, kv_heads, 1, dim, generator=g),
            "k_cache": torch.randn(batch, kv_heads, past, dim, generator=g),
            "v_cache": torch.randn(batch, kv_heads, past, dim, generator=g)},
            name_zh=f"随机用例 {i}：{heads} 个查询头，{kv_heads} 个 KV 头，缓存 {past} 个位置"))
    return cases


DECODE_MISTAKES = (
    Mistake("missing_scale", "scores are q k^T / sqrt(head_dim).", _decode_variant(no_scale=True),
            zh="注意力分数要除以 sqrt(head_dim)：q kᵀ / sqrt(d)。"),
    Mistake("gqa_wrong_head", "query head h reads kv head h // (H / K): expand with repeat_interleave "
            "along the head axis (HF's repeat_kv), not repeat.", _decode_variant(repeat_wrong=True),
            zh="第 h 个查询头读取第 h // (H / K) 个 KV 头：沿头的维度用 `repeat_interleave` 扩展（HF 的 "
               "`repeat_kv`），不是 `repeat`。"),
    Mistake("new_token_not_attended", "append the new key/value to the cache FIRST, then attend: the new "
            "token attends to itself too.", _decode_variant(only_past=True),
            zh="先把新的键和值追加进缓存，再算注意力：新 token 也要关注它自己。"),
    Mistake("causal_mask_on_decode", "one new query may see every cached key; a causal mask built as "
            "triu(ones(1, S), 1) hides all but the first.", _decode_variant(causal_mask=True),
            zh="单个新查询可以看到缓存里所有的键；按 `triu(ones(1, S), 1)` "
               "构造的因果掩码会把第一个以外的键全部遮住。"),
)


# ----------------------------------------------------------------------------------------------
# the backward pass of softmax attention, by hand


def attention_backward(q, k, v, grad_out, causal: bool = False):
    """Gradients of O = softmax(Q K^T / sqrt(d) + mask) V by hand. q, k, v, grad_out: (batch, heads,
    seq, d). Returns (dq, dk, dv), each like its input.

        S  = Q K^T / sqrt(d)             P = softmax(S) (row-wise)       O = P V
        dV = P^T dO                      dP = dO V^T
        dS = P * (dP - rowsum(dP * P))   (the softmax Jacobian; rowsum(dP * P) = rowsum(dO * O))
        dQ = dS K / sqrt(d)              dK = dS^T Q / sqrt(d)
    """
    scale = q.shape[-1] ** -0.5
    scores = (q @ k.transpose(-1, -2)) * scale  # S
    if causal:
        hidden = torch.triu(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device), 1)
        scores = scores.masked_fill(hidden, float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # P
    grad_v = probs.transpose(-1, -2) @ grad_out  # dV = P^T dO
    grad_probs = grad_out @ v.transpose(-1, -2)  # dP = dO V^T
    grad_scores = probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True))  # dS = P (dP - rowsum)
    grad_q = grad_scores @ k * scale  # dQ = dS K / sqrt(d)
    grad_k = grad_scores.transpose(-1, -2) @ q * scale  # dK = dS^T Q / sqrt(d)
    return grad_q, grad_k, grad_v


def _backward_variant(no_rowsum=False, no_scale=False, dv_untransposed=False, dk_untransposed=False):
    def variant(q, k, v, grad_out, causal=False):
        scale = 1.0 if no_scale else q.shape[-1] ** -0.5
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        if causal:
            scores = scores.masked_fill(torch.triu(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool), 1),
                                        float("-inf"))
        probs = torch.softmax(scores, -1)
        grad_v = (probs if dv_untransposed else probs.transpose(-1, -2)) @ grad_out
        grad_probs = grad_out @ v.transpose(-1, -2)
        grad_scores = probs * grad_probs if no_rowsum else probs * (
            grad_probs - (grad_probs * probs).sum(-1, keepdim=True))
        grad_k = (grad_scores if dk_untransposed else grad_scores.transpose(-1, -2)) @ q * scale
        return grad_scores @ k * scale, grad_k, grad_v

    return variant


def backward_cases(seed: int) -> list[Case]:
    g = _generator(seed)
    cases = []
    for i, (batch, heads, seq, dim, causal) in enumerate(
        [(1, 1, 3, 4, False), (2, 2, 5, 8, False), (2, 1, 4, 4, True), (1, 3, 6, 8, True)]):
        cases.append(Case(f"random {i}: seq {seq}, d {dim}, causal {causal}", {
            **{name: torch.randn(batch, heads, seq, dim, generator=g)
               for name in ("q", "k", "v", "grad_out")},
            "causal": causal}, name_zh=f"随机用例 {i}：序列长度 {seq}，d = {dim}，causal = {causal}"))
    return cases


BACKWARD_MISTAKES = (
    Mistake("softmax_jacobian_rowsum_missing", "the softmax Jacobian is diag(P) - P P^T per row: "
            "dS = P * (dP - rowsum(dP * P)), not P * dP.", _backward_variant(no_rowsum=True),
            zh="softmax 的雅可比矩阵每一行是 diag(P) − P Pᵀ："
               "dS = P ∘ (dP − rowsum(dP ∘ P))，而不是 P ∘ dP。"),
    Mistake("missing_scale", "S = Q K^T / sqrt(d), so dQ and dK carry the 1/sqrt(d) too.",
            _backward_variant(no_scale=True), zh="S = Q Kᵀ / sqrt(d)，所以 dQ 和 dK 也要带上 1/sqrt(d)。"),
    Mistake("dv_not_transposed", "O = P V, so dV = P^T dO (shape check: (S x T)(T x d)).",
            _backward_variant(dv_untransposed=True), zh="O = P V，所以 dV = Pᵀ dO（核对形状：(S×T)(T×d)）。"),
    Mistake("dk_not_transposed", "S = Q K^T, so dK = dS^T Q / sqrt(d), not dS Q / sqrt(d).",
            _backward_variant(dk_untransposed=True),
            zh="S = Q Kᵀ，所以 dK = dSᵀ Q / sqrt(d)，不是 dS Q / sqrt(d)。"),
)


EXERCISES = [
    Exercise(
        name="filter_logits", title="temperature + top-k + top-p filtering", topic="sampling",
        difficulty="medium", minutes=15,
        signature='''def filter_logits(scores: torch.Tensor, temperature: float, top_k: int,
                  top_p: float) -> torch.Tensor:
    """Temperature, then top-k, then top-p, as HF's generate(). scores: (batch, vocab) -> (batch, vocab);
    removed tokens get -inf, kept ones keep their (tempered) score.

    top_k = 0 and top_p = 1.0 switch a filter off. top-k keeps scores >= the k-th largest (ties kept).
    top-p keeps the smallest set of most likely tokens whose probability reaches p: the token that
    crosses p is kept. (Holtzman et al. 2020; transformers TopPLogitsWarper.)
    """''',
        reference=filter_logits, make_cases=filter_cases, mistakes=FILTER_MISTAKES,
        hints=("Sort ascending and cumsum the softmax: remove a token when the mass up to and including it "
               "is <= 1 - p.", "torch.topk(scores, k).values[..., -1:] is the k-th largest score.",
               "Order: scores / T first."),
        source="transformers generation/logits_process.py",
        title_zh="温度 + top-k + top-p 过滤",
        question="Implement temperature, top-k and top-p as generate() does.",
        question_zh="按 generate() 的做法实现温度、top-k 和 top-p（核采样）。",
        explanation="Temperature rescales the logits; top-k keeps the k best scores; top-p keeps the "
                    "smallest set of most likely tokens whose mass reaches p, including the token that "
                    "crosses p.",
        explanation_zh="温度对 logits 做缩放；top-k 保留 logit 最高的 k 个；top-p 保留累计概率达到 p "
                       "的最小高概率 token 集合，包括让累计概率越过 p 的那个 token。",
        hints_zh=("升序排序后对 softmax 求累计和：当包含它自己在内的累计概率 ≤ 1 − p 时删掉这个 token。",
                  "`torch.topk(scores, k).values[..., -1:]` 就是第 k 大的 logit。",
                  "顺序：先算 scores / T。"),
    ),
    Exercise(
        name="repetition_penalty", title="repetition penalty (sign-aware)", topic="sampling",
        difficulty="easy", minutes=10,
        signature='''def repetition_penalty(scores: torch.Tensor, input_ids: torch.Tensor,
                       penalty: float) -> torch.Tensor:
    """Penalise every token id present in input_ids (batch, seq); scores (batch, vocab) -> (batch, vocab).

    For a seen id: a positive logit is divided by the penalty, a negative one multiplied by it, once per
    id however often it occurs. (CTRL, Keskar et al. 2019; transformers RepetitionPenaltyLogitsProcessor.)
    """''',
        reference=apply_repetition_penalty, make_cases=penalty_cases, mistakes=PENALTY_MISTAKES,
        hints=("torch.gather(scores, 1, input_ids) reads the seen logits; scatter writes them back.",
               "What does -2 / 1.2 do to a token's probability?"),
        source="transformers RepetitionPenaltyLogitsProcessor",
        title_zh="区分 logit 正负的重复惩罚",
        question="How does the repetition penalty treat a negative logit?",
        question_zh="重复惩罚遇到负的 logit 怎么处理？",
        explanation="A seen token should become less likely whatever the sign of its logit, so positive "
                    "logits are divided and negative ones multiplied by the penalty.",
        explanation_zh="不管 logit 是正是负，出现过的 token 都应当变得更不可能：正的 logit 除以惩罚系数，"
                       "负的乘以惩罚系数。",
        hints_zh=("`torch.gather(scores, 1, input_ids)` 读出出现过的 token 的 logit，再用 scatter 写回去。",
                  "−2 / 1.2 会让这个 token 的概率怎么变？"),
    ),
    Exercise(
        name="rope_half_split", title="RoPE, rotate-half form (HF / GPT-NeoX)", topic="attention",
        difficulty="medium", minutes=15,
        signature='''def rope_half_split(x: torch.Tensor, position_ids: torch.Tensor,
                    base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding, HF's layout. x: (batch, heads, seq, d); position_ids: (batch, seq) int.
    Returns x rotated, same shape. Compute the angles in float32.

        theta_i = base^(-2i/d), i = 0..d/2-1        angle = position * theta_i
        cos = cat(cos(angle), cos(angle)), sin likewise            (batch, 1, seq, d)
        x' = x * cos + rotate_half(x) * sin,   rotate_half(x) = cat(-x2, x1)   (x1, x2 the two halves)

    (RoFormer arXiv 2104.09864; transformers modeling_llama.py.)
    """''',
        reference=rope_half_split, make_cases=rope_cases, mistakes=ROPE_HALF_MISTAKES,
        hints=("torch.arange(0, d, 2).float() / d gives the exponents 2i/d.",
               "Dim i and dim i + d/2 form one pair and share the angle theta_i.",
               "cos/sin need a heads axis: [:, None]."),
        source="RoFormer (arXiv 2104.09864); transformers",
        title_zh="旋转位置编码 RoPE：HF / GPT-NeoX 的前后两半配对写法",
        question="Write RoPE the way Hugging Face does.",
        question_zh="按 Hugging Face 的写法实现旋转位置编码（RoPE）。",
        explanation="Each pair of dimensions is rotated by an angle proportional to the position; HF pairs "
                    "dimension i with i + d/2 and writes the rotation with rotate_half.",
        explanation_zh="每一对维度按与位置成正比的角度旋转；HF 把第 i 维与第 i + d/2 维配成一对，用 "
                       "`rotate_half` 写出旋转。",
        hints_zh=("`torch.arange(0, d, 2).float() / d` 就是各个指数 2i/d。",
                  "第 i 维和第 i + d/2 维是一对，共用角度 θ_i。",
                  "cos/sin 要补出头的维度：`[:, None]`。"),
    ),
    Exercise(
        name="rope_complex", title="RoPE, complex form (Meta's llama)", topic="attention",
        difficulty="medium", minutes=15,
        signature='''def rope_complex(x: torch.Tensor, position_ids: torch.Tensor,
                 base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding, Meta's layout: dims (2i, 2i+1) form the complex number x_2i + i x_2i+1,
    multiplied by e^{i * position * theta_i}, theta_i = base^(-2i/d). x: (batch, heads, seq, d);
    position_ids: (batch, seq) int. Returns float32 of x's shape.

    (RoFormer arXiv 2104.09864; meta-llama model.py: view_as_complex, torch.polar.)
    """''',
        reference=rope_complex, make_cases=rope_cases, mistakes=ROPE_COMPLEX_MISTAKES,
        hints=("x.float().unflatten(-1, (-1, 2)) then torch.view_as_complex.",
               "torch.polar(torch.ones_like(angles), angles) is e^{i angle}.",
               "torch.view_as_real(z).flatten(-2) puts the pairs back."),
        source="RoFormer (arXiv 2104.09864); meta-llama model.py",
        title_zh="旋转位置编码 RoPE：Meta llama 的复数写法",
        question="Write RoPE the way Meta's llama does.",
        question_zh="按 Meta llama 的写法实现旋转位置编码（复数形式）。",
        explanation="The same rotation written with complex numbers: adjacent dimensions (2i, 2i+1) form one "
                    "complex number, multiplied by a unit complex number of angle m theta_i.",
        explanation_zh="同一个旋转，用复数来写：相邻的两维 (2i, 2i+1) 组成一个复数，乘以角度为 m·θ_i "
                       "的单位复数。",
        hints_zh=("先 `x.float().unflatten(-1, (-1, 2))`，再 `torch.view_as_complex`。",
                  "`torch.polar(torch.ones_like(angles), angles)` 就是 e^{i·angle}。",
                  "`torch.view_as_real(z).flatten(-2)` 把每一对放回原位。"),
    ),
    Exercise(
        name="attention_decode_step", title="one attention decode step with a KV cache", topic="attention",
        difficulty="medium", minutes=15,
        signature='''def attention_decode_step(q, k_new, v_new, k_cache, v_cache):
    """One generation step of attention with a KV cache and grouped-query heads.

    q: (batch, H, 1, d) the new token's queries; k_new, v_new: (batch, K, 1, d); k_cache, v_cache:
    (batch, K, S, d) the past, after RoPE. H is a multiple of K; query head h reads kv head h // (H / K).
    Returns (out (batch, H, 1, d), k_cache (batch, K, S + 1, d), v_cache (batch, K, S + 1, d)):

        K' = cat(k_cache, k_new), V' = cat(v_cache, v_new)      along the sequence axis
        out = softmax(q K'^T / sqrt(d)) V'

    (transformers cache_utils.py / modeling_llama.py repeat_kv.)
    """''',
        reference=attention_decode_step, make_cases=decode_cases, mistakes=DECODE_MISTAKES,
        hints=("torch.cat along dim 2 (the sequence axis).",
               "k.repeat_interleave(H // K, dim=1) gives every query head its kv head.",
               "A single new query may attend to everything in the cache: no mask."),
        source="transformers cache_utils.py, modeling_llama.py",
        outputs=("out", "k_cache", "v_cache"),
        title_zh="带 KV cache 的单步解码注意力",
        question="What happens in one decode step with a KV cache?",
        question_zh="用 KV cache 解码一步时发生了什么？",
        explanation="The new token's key and value are appended to the cache, and its single query attends "
                    "to every cached position; with grouped-query attention several query heads share one kv "
                    "head.",
        explanation_zh="新 token 的键和值先追加进缓存，它唯一的查询再对缓存里的所有位置做注意力；"
                       "用分组查询注意力（GQA）时，几个查询头共用一个 KV 头。",
        hints_zh=("沿第 2 维（序列维）做 `torch.cat`。",
                  "`k.repeat_interleave(H // K, dim=1)` 让每个查询头都拿到自己对应的 KV 头。",
                  "单个新查询可以关注缓存里的所有位置：不需要掩码。"),
    ),
    Exercise(
        name="attention_backward", title="the backward pass of softmax attention by hand", topic="attention",
        difficulty="hard", minutes=30,
        signature='''def attention_backward(q, k, v, grad_out, causal: bool = False):
    """Gradients of O = softmax(Q K^T / sqrt(d) + mask) V without autograd. q, k, v, grad_out:
    (batch, heads, seq, d); causal=True masks keys after the query. Returns (dq, dk, dv).

    Derive dV, dP, dS (through the row-wise softmax), dQ and dK. The checker compares with autograd.
    """''',
        reference=attention_backward, make_cases=backward_cases, mistakes=BACKWARD_MISTAKES,
        hints=("O = P V: dV = P^T dO and dP = dO V^T.",
               "For one softmax row p: dS_j = p_j (dP_j - sum_k p_k dP_k).",
               "S = Q K^T * scale: dQ = dS K * scale, dK = dS^T Q * scale."),
        source="FlashAttention (arXiv 2205.14135), appendix B (the standard attention backward pass)",
        outputs=("dq", "dk", "dv"),
        title_zh="手推 softmax 注意力的反向传播",
        question="Derive the gradient of softmax attention by hand.",
        question_zh="手推 softmax 注意力的梯度（注意力梯度推导）。",
        explanation="Back-propagate through O = PV, then through the row-wise softmax, whose Jacobian is "
                    "diag(p) - p p^T, then through S = QK^T / sqrt(d).",
        explanation_zh="依次反向传播：先过 O = PV，再过按行的 softmax（雅可比矩阵为 diag(p) − p pᵀ），最后过 "
                       "S = QKᵀ / sqrt(d)。",
        hints_zh=("由 O = P V 得：dV = Pᵀ dO，dP = dO Vᵀ。",
                  "对 softmax 的一行 p：dS_j = p_j (dP_j − Σ_k p_k dP_k)。",
                  "由 S = Q Kᵀ · scale 得：dQ = dS K · scale，dK = dSᵀ Q · scale。"),
    ),
]
