"""Sampling: logits processors (repetition penalty, no-repeat-ngram, temperature, top-k, top-p, min-p),
in generate.py batched generation with the KV cache (compiled.py: the opt-in compiled decode step), and
in beam.py beam search on the paged cache. fast.py: the draw and the usual temperature + top-k + top-p
sampler in fewer ops, which `generate` runs unless `rlhf_lab.util.fast_paths.reference_paths()` is on."""

from rlhf_lab.sampling.beam import (
    BEAM_CACHE_KINDS,
    BeamSearchConfig,
    BeamSearchOutput,
    beam_search,
    measure_block_sharing,
    reorder_cache,
)
from rlhf_lab.sampling.config import SamplingConfig
from rlhf_lab.sampling.generate import CACHE_KINDS, GenerationOutput, complete, generate, left_pad, make_cache
from rlhf_lab.sampling.processors import (
    FILTER_VALUE,
    apply_min_p,
    apply_no_repeat_ngram,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    build_stages,
    explain_filters,
    make_generator,
    process_logits,
    sample_next_token,
)

__all__ = [
    "BEAM_CACHE_KINDS",
    "BeamSearchConfig",
    "BeamSearchOutput",
    "beam_search",
    "measure_block_sharing",
    "reorder_cache",
    "CACHE_KINDS",
    "GenerationOutput",
    "complete",
    "generate",
    "left_pad",
    "make_cache",
    "FILTER_VALUE",
    "SamplingConfig",
    "apply_min_p",
    "apply_no_repeat_ngram",
    "apply_repetition_penalty",
    "apply_temperature",
    "apply_top_k",
    "apply_top_p",
    "build_stages",
    "explain_filters",
    "make_generator",
    "process_logits",
    "sample_next_token",
]
