"""The one switch between the plain definitions and their fast versions.

The code a notebook prints is the plain definition of an idea: separate q, k and v projections,
RoPE as its formula, sampling with `torch.multinomial`, one teacher-forced forward per row. The lab
runs faster versions of some of them. Each lives beside its definition, in one file per layer, and
a test holds it equal to the definition (bit for bit where the arithmetic is the same, otherwise
within a tolerance derived from float32 rounding):

    model/fast.py          the decoder's forward with fewer ops
    sampling/fast.py       the sampling draw and the processor chain with fewer ops
    rl/prefix_sharing.py   the G completions of a prompt share one forward of that prompt

Each of those files lists what it changes and the test that holds it equal.

The fast versions are on by default. Turn them off to run the plain definitions:

    from rlhf_lab.util.fast_paths import reference_paths
    with reference_paths():
        trainer.train(steps=5)        # every forward and every draw through the plain code
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_enabled = True


def enabled() -> bool:
    """True when the fast versions run (the default), False inside `reference_paths()`."""
    return _enabled


@contextlib.contextmanager
def reference_paths() -> Iterator[None]:
    """Within this block every layer runs its plain definition instead of its fast version."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


@contextlib.contextmanager
def fast_paths() -> Iterator[None]:
    """Within this block the fast versions run (the default; for nesting inside `reference_paths()`)."""
    global _enabled
    before, _enabled = _enabled, True
    try:
        yield
    finally:
        _enabled = before
