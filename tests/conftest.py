"""Shared test settings, and `bench_script` for the tests of the scripts in bench/."""

import importlib.util
import os
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"

# Tiny models: one thread avoids oversubscribing small CPUs (2 cores in CI) and is faster for
# the small matrix multiplies used everywhere in these tests.
torch.set_num_threads(1)
os.environ.setdefault("RLHF_LAB_FAST", "1")


@pytest.fixture(scope="session")
def bench_script():
    """bench_script("rl_step") -> bench/rl_step.py imported as a module (the benchmarks are scripts, not
    a package). Loading trl_race.py needs no trl: it imports trl inside the functions that use it."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
