"""An int8 KV cache in the spirit of KIVI (Liu et al., 2024, arXiv 2402.02750).

KIVI's observation: keys have a few outlier *channels* (the same dimensions are large for every
token), while values have no channel structure but vary per *token*. So

    keys    are quantized per channel: one (scale, min) per (batch, head, channel) and group of R tokens
    values  are quantized per token:   one (scale, min) per (batch, head, token), over its D channels

Per-channel key groups need R tokens before they can be quantized, so the newest tokens wait in a
full-precision residual buffer; when it holds `residual_length` tokens they are quantized as one
group and moved to the int8 store. (KIVI uses 2 bits and group sizes of 32-128; we use 8 bits so
the lab's tiny model barely notices. Hugging Face's `QuantizedCache` keeps a residual buffer too.)

Asymmetric b-bit quantization of a group x with levels 0 .. 2^b - 1 (here 255):

    scale = (max(x) - min(x)) / 255
    code  = round((x - min(x)) / scale)            in 0 .. 255, stored as uint8
    x_hat = code * scale + min(x)                  |x - x_hat| <= scale / 2 = (max - min) / 510

Memory per element: 1 byte of code, plus the float (scale, min) pairs shared by a group:
keys 2 * 4 / R bytes (R tokens share a pair), values 2 * 4 / D bytes (D channels share a pair).
With R = 32 and a realistic head_dim D = 128: keys 1.25, values 1.06 bytes per element vs 4 for
fp32 (about 3.5x less, before the residual). With the lab's D = 16 the per-token value pairs cost
half as much as the codes themselves (1.5 bytes per value element): small heads eat the savings.
A residual_length of 1 or 2 makes the key pairs cost more than fp32: keep R >= 8.
"""

from __future__ import annotations

import torch

from ..util.validation import check_number

LEVELS = 255  # 8-bit codes 0 .. 255


def quantize(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 8-bit quantization with one (scale, min) per slice reduced over `dim`.

    Returns codes (uint8, shape of x), scale and minimum (x's dtype, size 1 along `dim`).
    """
    lo = x.amin(dim=dim, keepdim=True)
    hi = x.amax(dim=dim, keepdim=True)
    scale = ((hi - lo) / LEVELS).clamp(min=torch.finfo(x.dtype).tiny)  # a constant group has range 0
    codes = torch.round((x - lo) / scale).clamp(0, LEVELS).to(torch.uint8)  # code = round((x - min) / scale)
    return codes, scale, lo


def dequantize(codes: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """x_hat = code * scale + min (broadcast over the quantized dimension)."""
    return codes.to(scale.dtype) * scale + lo


class QuantizedKVCache:
    """int8 KV cache: keys per channel (groups of `residual_length` tokens), values per token.

    Per layer it stores
        key_codes   (B, K, Sq, D) uint8     key_scale, key_min     (B, K, Sq / R, D)
        value_codes (B, K, Sq, D) uint8     value_scale, value_min (B, K, Sq, 1)
        residual_keys, residual_values (B, K, Sr, D) full precision, 0 <= Sr < R after each update
    with Sq + Sr = S. `update` returns the dequantized store followed by the full-precision residual
    (the tokens of the current call are always returned exactly, then quantized if a group is full).
    """

    def __init__(self, config, batch_size: int, residual_length: int = 32, device=None, dtype=torch.float32):
        check_number("residual_length", residual_length, low=1, integer=True)
        check_number("batch_size", batch_size, low=1, integer=True)
        self.num_layers = config.num_hidden_layers
        self.residual_length = residual_length
        self.dtype = dtype
        B, K, D, L = batch_size, config.num_key_value_heads, config.head_dim, self.num_layers

        def empty(last: int, dt=dtype) -> list[torch.Tensor]:
            return [torch.empty(B, K, 0, last, device=device, dtype=dt) for _ in range(L)]

        self.key_codes, self.key_scale, self.key_min = empty(D, torch.uint8), empty(D), empty(D)
        self.value_codes, self.value_scale, self.value_min = empty(D, torch.uint8), empty(1), empty(1)
        self.residual_keys, self.residual_values = empty(D), empty(D)
        self.length = 0

    def _dequantized(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The int8 store back in full precision: keys and values (B, K, Sq, D)."""
        codes = self.key_codes[layer_idx]
        B, K, Sq, D = codes.shape
        groups = codes.view(B, K, Sq // self.residual_length, self.residual_length, D)
        scale, lo = self.key_scale[layer_idx].unsqueeze(3), self.key_min[layer_idx].unsqueeze(3)
        keys = dequantize(groups, scale, lo).view(B, K, Sq, D)  # (B, K, G, R, D) * (B, K, G, 1, D)
        v_scale, v_min = self.value_scale[layer_idx], self.value_min[layer_idx]  # (B, K, Sq, 1)
        values = dequantize(self.value_codes[layer_idx], v_scale, v_min)
        return keys, values

    def flush(self, layer_idx: int) -> None:
        """Quantize every complete group of R residual tokens and move it to the int8 store (`update` calls
        it after each write; the tokens still in the residual stay in full precision)."""
        R = self.residual_length
        res_k, res_v = self.residual_keys[layer_idx], self.residual_values[layer_idx]
        B, K, Sr, D = res_k.shape
        n = Sr // R * R
        if n == 0:
            return
        groups = res_k[:, :, :n].reshape(B, K, n // R, R, D)
        k_codes, k_scale, k_min = quantize(groups, dim=3)  # per channel: min/max over the R tokens
        v_codes, v_scale, v_min = quantize(res_v[:, :, :n], dim=3)  # per token: min/max over D channels
        cat = torch.cat
        self.key_codes[layer_idx] = cat([self.key_codes[layer_idx], k_codes.view(B, K, n, D)], dim=2)
        self.key_scale[layer_idx] = cat([self.key_scale[layer_idx], k_scale.squeeze(3)], dim=2)
        self.key_min[layer_idx] = cat([self.key_min[layer_idx], k_min.squeeze(3)], dim=2)
        self.value_codes[layer_idx] = cat([self.value_codes[layer_idx], v_codes], dim=2)
        self.value_scale[layer_idx] = cat([self.value_scale[layer_idx], v_scale], dim=2)
        self.value_min[layer_idx] = cat([self.value_min[layer_idx], v_min], dim=2)
        self.residual_keys[layer_idx] = res_k[:, :, n:].clone()  # clone: drop the quantized tokens' storage
        self.residual_values[layer_idx] = res_v[:, :, n:].clone()

    def update(
        self, layer_idx: int, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, K, T, D) keys/values; return (B, K, S, D): dequantized store + residual."""
        key, value = key.to(self.dtype), value.to(self.dtype)
        self.residual_keys[layer_idx] = torch.cat([self.residual_keys[layer_idx], key], dim=2)
        self.residual_values[layer_idx] = torch.cat([self.residual_values[layer_idx], value], dim=2)
        old_keys, old_values = self._dequantized(layer_idx)
        keys = torch.cat([old_keys, self.residual_keys[layer_idx]], dim=2)
        values = torch.cat([old_values, self.residual_values[layer_idx]], dim=2)
        self.flush(layer_idx)
        if layer_idx == self.num_layers - 1:
            self.length += key.shape[2]
        return keys, values

    def get_seq_length(self) -> int:
        return self.length

    def quantized_length(self) -> int:
        """Tokens held in int8 (the rest, get_seq_length() - this, are in the residual buffer)."""
        return self.key_codes[0].shape[2]

    def _tensors(self) -> list[torch.Tensor]:
        return (self.key_codes + self.key_scale + self.key_min + self.value_codes + self.value_scale
                + self.value_min + self.residual_keys + self.residual_values)

    def expand(self, repeats: int) -> QuantizedKVCache:
        """Row b becomes rows b*repeats .. b*repeats + repeats - 1 (every stored tensor is repeated)."""
        check_number("repeats", repeats, low=1, integer=True)
        out = QuantizedKVCache.__new__(QuantizedKVCache)
        out.num_layers, out.residual_length, out.dtype, out.length = (
            self.num_layers, self.residual_length, self.dtype, self.length)
        for name in ("key_codes", "key_scale", "key_min", "value_codes", "value_scale", "value_min",
                     "residual_keys", "residual_values"):
            setattr(out, name, [t.repeat_interleave(repeats, dim=0) for t in getattr(self, name)])
        return out

    def nbytes(self) -> int:
        """Bytes held: uint8 codes + float scales and minimums + the full-precision residual."""
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def full_precision_nbytes(self) -> int:
        """What a full-precision cache (this cache's dtype) of the same batch and length would hold."""
        B, K, _, D = self.residual_keys[0].shape
        element_size = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * B * K * self.length * D * element_size  # 2 (K and V) * L * B * K * S * D
