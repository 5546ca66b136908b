"""`SamplingConfig`: how the next token is picked, validated at construction.

Field names and meanings follow Hugging Face's `GenerationConfig` (`do_sample`, `temperature`, `top_k`,
`top_p`, `min_p`, `repetition_penalty`, `no_repeat_ngram_size`, `max_new_tokens`), with one deliberate
difference: our `top_k` defaults to 0 (off), while transformers defaults to 50 even when you only asked
for top-p. `hf_generate_kwargs()` spells every field out, so a comparison with `model.generate` does
not silently pick up HF's default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rlhf_lab.util.validation import Validated, check_bool, check_number, check_optional


@dataclass
class SamplingConfig(Validated):
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
        min_new_tokens: EOS is forbidden (its score set to -inf) until this many tokens were generated,
            as transformers' `MinNewTokensLengthLogitsProcessor`; 0 = off. A way to get longer, "verbose"
            completions from the same model (the preference data uses it).
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
    min_new_tokens: int = 0
    min_tokens_to_keep: int = 1
    seed: int | None = None
    return_logprobs: bool = False

    def __post_init__(self) -> None:
        check_bool("do_sample", self.do_sample)
        check_bool("return_logprobs", self.return_logprobs)

        check_number("temperature", self.temperature, low=0)  # 0 is fine when greedy: it is ignored
        if self.do_sample and self.temperature == 0:
            raise ValueError(
                f"temperature must be > 0 when do_sample=True, got {self.temperature}; "
                "for greedy decoding use do_sample=False (SamplingConfig.greedy())"
            )
        check_number("top_p", self.top_p, low=0, high=1, low_open=True)
        check_number("min_p", self.min_p, low=0, high=1, high_open=True)
        check_number("repetition_penalty", self.repetition_penalty, low=0, low_open=True)  # 1.0 = off
        for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
            setattr(self, name, float(getattr(self, name)))  # ints are accepted, stored as floats

        for name in ("top_k", "no_repeat_ngram_size"):  # 0 = off
            check_number(name, getattr(self, name), low=0, integer=True)
        check_number("max_new_tokens", self.max_new_tokens, low=1, integer=True)
        check_number("min_new_tokens", self.min_new_tokens, low=0, high=self.max_new_tokens, integer=True)
        check_number("min_tokens_to_keep", self.min_tokens_to_keep, low=1, integer=True)
        check_optional(check_number, "seed", self.seed, integer=True)

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
            "min_new_tokens": self.min_new_tokens,
            "repetition_penalty": self.repetition_penalty,
            "no_repeat_ngram_size": self.no_repeat_ngram_size,
        }
        if self.do_sample:
            kwargs.update(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)
        else:
            # Explicit "off" values keep transformers from warning about sampling flags in greedy mode.
            kwargs.update(temperature=None, top_k=None, top_p=None, min_p=None)
        return kwargs
