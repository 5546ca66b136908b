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

from rlhf_lab.util.validation import Validated, setting


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

    do_sample: bool = setting(True, help="draw from the filtered distribution; False: greedy")
    temperature: float = setting(1.0, ge=0, help="logits / temperature; > 0 when sampling")
    top_k: int = setting(0, ge=0, help="keep the k best tokens; 0 = off")
    top_p: float = setting(1.0, gt=0, le=1, help="nucleus mass; 1.0 = off")
    min_p: float = setting(0.0, ge=0, lt=1, help="relative probability floor; 0 = off")
    repetition_penalty: float = setting(1.0, gt=0, help="CTRL penalty on seen tokens; 1.0 = off")
    no_repeat_ngram_size: int = setting(0, ge=0, help="forbid repeating an n-gram of this size; 0 = off")
    max_new_tokens: int = setting(16, ge=1, help="tokens generated at most")
    min_new_tokens: int = setting(0, ge=0, help="EOS forbidden before this many tokens (<= max_new_tokens)")
    min_tokens_to_keep: int = setting(1, ge=1, help="no filter leaves fewer candidates")
    seed: int | None = setting(None, help="seed of the sampling generator; None = unseeded")
    return_logprobs: bool = setting(False, help="also return each sampled token's log-prob")

    def check(self) -> None:
        if self.do_sample and self.temperature == 0:  # 0 is fine when greedy: it is ignored
            raise ValueError(
                f"temperature must be > 0 when do_sample=True, got {self.temperature}; "
                "for greedy decoding use do_sample=False (SamplingConfig.greedy())"
            )
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens must satisfy 0 <= min_new_tokens <= {self.max_new_tokens} "
                             f"(max_new_tokens), got {self.min_new_tokens!r}")
        for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
            setattr(self, name, float(getattr(self, name)))  # ints are accepted, stored as floats

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
