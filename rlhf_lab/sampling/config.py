"""`SamplingConfig`: how the next token is picked, validated at construction.

Field names and meanings follow Hugging Face's `GenerationConfig` (`do_sample`, `temperature`, `top_k`,
`top_p`, `min_p`, `repetition_penalty`, `no_repeat_ngram_size`, `max_new_tokens`), with one deliberate
difference: our `top_k` defaults to 0 (off), while transformers defaults to 50 even when you only asked
for top-p. `hf_generate_kwargs()` spells every field out, so a comparison with `model.generate` does
not silently pick up HF's default.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool (True or False), got {value!r} ({type(value).__name__})")


def _check_int(name: str, value: Any, minimum: int) -> None:
    # bool is a subclass of int in Python; top_k=True is almost certainly a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")


def _as_float(name: str, value: Any, allowed: str) -> float:
    """Accept int or float (not bool, not str), finite; return it as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number {allowed}, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number {allowed}, got {value}")
    return value


@dataclass
class SamplingConfig:
    """Decoding settings for `rlhf_lab.sampling`.

    Attributes:
        do_sample: True draws from the filtered distribution; False is greedy (argmax). Greedy still
            applies `repetition_penalty` and `no_repeat_ngram_size` but ignores temperature/top-k/top-p/min-p,
            exactly like `model.generate(do_sample=False)`.
        temperature: logits / temperature before filtering; < 1 sharpens, > 1 flattens. Must be > 0 when
            sampling (use do_sample=False for greedy). When greedy it is ignored, and 0 is accepted.
        top_k: keep the k highest-scoring tokens (ties with the k-th are kept too); 0 = off.
        top_p: nucleus sampling: keep the smallest set of most likely tokens whose mass reaches top_p;
            1.0 = off.
        min_p: drop tokens whose probability is below min_p * (probability of the best token); 0 = off.
        repetition_penalty: CTRL-style penalty on every token id already in the context (prompt included);
            1.0 = off, > 1 discourages repeats, < 1 encourages them.
        no_repeat_ngram_size: forbid any token that would repeat an n-gram of this size; 0 = off.
        max_new_tokens: how many tokens to generate at most.
        min_tokens_to_keep: no filter (top-k, top-p, min-p) may leave fewer candidates than this.
        seed: seed for the sampling `torch.Generator` (see `make_generator`); None = unseeded.
        return_logprobs: whether generation should return the log-prob of each sampled token under the
            distribution it was sampled from (what an RL rollout stores as `old_logprobs`).
    """

    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    max_new_tokens: int = 16
    min_tokens_to_keep: int = 1
    seed: int | None = None
    return_logprobs: bool = False

    def __post_init__(self) -> None:
        _check_bool("do_sample", self.do_sample)
        _check_bool("return_logprobs", self.return_logprobs)

        self.temperature = _as_float("temperature", self.temperature, "> 0")
        if self.do_sample and not self.temperature > 0:
            raise ValueError(
                f"temperature must be > 0 when do_sample=True, got {self.temperature}; "
                "for greedy decoding use do_sample=False (SamplingConfig.greedy())"
            )
        if not self.do_sample and self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")

        self.top_p = _as_float("top_p", self.top_p, "in (0, 1]")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

        self.min_p = _as_float("min_p", self.min_p, "in [0, 1)")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")

        self.repetition_penalty = _as_float("repetition_penalty", self.repetition_penalty, "> 0")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0 (1.0 = off), got {self.repetition_penalty}")

        _check_int("top_k", self.top_k, minimum=0)
        _check_int("no_repeat_ngram_size", self.no_repeat_ngram_size, minimum=0)
        _check_int("max_new_tokens", self.max_new_tokens, minimum=1)
        _check_int("min_tokens_to_keep", self.min_tokens_to_keep, minimum=1)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an int or None, got {self.seed!r} ({type(self.seed).__name__})")

    @classmethod
    def greedy(cls, **kwargs: Any) -> SamplingConfig:
        """Greedy decoding (argmax each step); other fields as keyword arguments."""
        if kwargs.pop("do_sample", False):
            raise ValueError("do_sample must be False in SamplingConfig.greedy(); use SamplingConfig(...) to sample")
        return cls(do_sample=False, **kwargs)

    def replace(self, **changes: Any) -> SamplingConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def hf_generate_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for transformers' `model.generate` that mean the same thing.

        Every filter is written out (top_k=0 in particular), so HF's own defaults cannot creep in.
        `seed`, `min_tokens_to_keep` and `return_logprobs` have no direct `generate` argument: HF uses the
        global RNG (call `torch.manual_seed`), sets min_tokens_to_keep itself (1 without beam search) and
        returns scores via `output_scores=True`.
        """
        kwargs: dict[str, Any] = {
            "do_sample": self.do_sample,
            "max_new_tokens": self.max_new_tokens,
            "repetition_penalty": self.repetition_penalty,
            "no_repeat_ngram_size": self.no_repeat_ngram_size,
        }
        if self.do_sample:
            kwargs.update(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)
        else:
            # Explicit "off" values keep transformers from warning about sampling flags in greedy mode.
            kwargs.update(temperature=None, top_k=None, top_p=None, min_p=None)
        return kwargs
