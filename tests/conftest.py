"""Shared test settings."""

import os

import torch

# Tiny models: one thread avoids oversubscribing small CPUs (2 cores in CI) and is faster for
# the small matrix multiplies used everywhere in these tests.
torch.set_num_threads(1)
os.environ.setdefault("RLHF_LAB_FAST", "1")
