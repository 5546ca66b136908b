"""bench/profile_step.py: the heap reserve that keeps the profiler's records from putting the step's
tensors on fresh pages, and the op table's report of page faults with and without the profiler.
(Timings are the benchmark's business, never a test's: only page counts and the printed table.)"""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "profile_step.py"
GLIBC = sys.platform.startswith("linux") and (ctypes.util.find_library("c") or "").startswith("libc.so")

# In a fresh process: optionally reserve 128 MB (more than the 64 MB the allocator tuning lets glibc keep: the
# reserve must raise that limit, or freeing it would hand it back to the system), then allocate and touch 16 tensors of 2 MB (8,192 pages
# of 4 KiB) and print how many page faults that took.
TOUCH = r"""
import sys
sys.path.insert(0, sys.argv[1])  # bench/
import torch
import profile_step
from rlhf_lab.util.allocator import keep_freed_memory
keep_freed_memory()  # what the CLI does: 2 MB blocks come from the heap
if sys.argv[2] == "reserve":
    assert profile_step.reserve_heap(128)
before = profile_step.minor_faults()
tensors = [torch.ones(2**19) for _ in range(16)]
print(profile_step.minor_faults() - before)
"""
PAGES = 16 * 2 * 2**20 // 4096


@pytest.fixture(scope="module")
def profile_step(bench_script):
    return bench_script("profile_step")


def touch_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", TOUCH, str(SCRIPT.parent), mode], capture_output=True, text=True,
                         timeout=120, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not GLIBC, reason="reserve_heap sets glibc's malloc thresholds")
def test_reserved_heap_is_reused_without_page_faults():
    """Without the reserve, 32 MB of new tensors fault in most of their 8,192 pages; after reserving
    128 MB, almost none (the pages were touched and kept). Page counts, not times: the same on any load."""
    assert touch_faults("none") > PAGES // 2
    assert touch_faults("reserve") < PAGES // 10


def test_op_table_reports_faults_with_and_without_the_profiler(profile_step, capsys):
    x = torch.randn(64, 64)
    profile_step.op_table("Toy", lambda: x @ x + 1, calls=3, gflops=50.0, top=5)
    out = capsys.readouterr().out
    assert "under the profiler" in out and "without it" in out
    assert "| mm | [64, 64], [64, 64] | 1 |" in out  # the matmul, once per call, with its shapes


def test_negative_reserve_is_refused_by_name():
    out = subprocess.run([sys.executable, str(SCRIPT), "--reserve-mb", "-1"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert "--reserve-mb must be 0" in out.stderr
