"""Shared test settings, and `bench_script` for the tests of the scripts in bench/."""

import importlib.util
import os
import time
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCREENSHOTS = Path(os.environ.get("RLHF_LAB_SCREENSHOTS",
                                  Path(__file__).resolve().parent / "browser" / "screenshots"))
SESSION_START = time.time()

# Tiny models: one thread avoids oversubscribing small CPUs (2 cores in CI) and is faster for
# the small matrix multiplies used everywhere in these tests. `make test` runs one such process per core.
torch.set_num_threads(1)
os.environ.setdefault("RLHF_LAB_FAST", "1")


def processes_at_once() -> int:
    """How many processes the tests run at once: one per CPU core this process may use (its affinity
    where the OS has one, as in a container), at most 4."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(4, cores))


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (`make test`): `processes_at_once()` workers. pytest-xdist's own count may be the physical
    cores, or all of a host's CPUs where a container may use only some."""
    return processes_at_once()


@pytest.fixture(scope="session")
def parallel_processes() -> int:
    """`processes_at_once()`, for tests that start processes side by side (the notebook runs)."""
    return processes_at_once()


def pytest_collection_modifyitems(items):
    """The slow tests first (a stable sort: each group keeps its order). With workers (`make test`,
    whole files per worker, in this order) the longest files start at the beginning, instead of
    one of them starting last and running alone while the other cores wait."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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


@pytest.fixture(scope="session")
def screenshots_dir():
    """Where the browser tests save their screenshots, emptied of earlier sessions' pictures."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob("*.png"):
        old.unlink()
    return SCREENSHOTS


def pytest_terminal_summary(terminalreporter):
    """List this session's screenshots in the test summary, so CI's log says where they are. Under
    `make test` the main process prints the summary and a worker took the pictures: it lists those
    written since the session started."""
    files = sorted(p.name for p in SCREENSHOTS.glob("*.png") if p.stat().st_mtime >= SESSION_START)
    if files:
        terminalreporter.write_sep("-", f"browser test screenshots: {len(files)} in {SCREENSHOTS}")
        terminalreporter.write_line(", ".join(files))
