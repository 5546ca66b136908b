"""Helpers every notebook imports first: the FAST switch, seeding, and a one-line device report."""

from __future__ import annotations

import os
import random

import torch

FAST: bool = os.environ.get("RLHF_LAB_FAST", "0").lower() in ("1", "true", "yes", "on")


def setup(seed: int = 0, threads: int | None = None) -> dict:
    """Seed everything, pick a sensible thread count, return what the notebook should print."""
    from .device import describe, pick_device

    random.seed(seed)
    torch.manual_seed(seed)
    if threads is not None:
        torch.set_num_threads(threads)
    device = pick_device()
    return {"fast": FAST, "device": str(device), "description": describe(device)}
