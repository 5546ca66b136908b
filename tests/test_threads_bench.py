"""bench/threads.py: its pairs alternate the thread count, its busy condition leaves no spinning process
behind, and its table row and history line say what was measured. (What the numbers are is the
benchmark's business, never a test's: timings here are not asserted.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "threads.py"


@pytest.fixture(scope="module")
def threads(bench_script):
    return bench_script("threads")


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class CountingTrainer:
    def __init__(self):
        self.seen = []

    def train_step(self):
        self.seen.append(torch.get_num_threads())


def test_pairs_alternate_which_count_goes_first(threads, restore_threads):
    trainer = CountingTrainer()
    times = threads.paired_steps(trainer, 4)
    assert trainer.seen == [1, 2, 2, 1, 1, 2, 2, 1]
    assert len(times[1]) == len(times[2]) == 4


def spinners_of_this_process() -> list[int]:
    """Children of this process running the spin loop (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == os.getpid() and "while True: pass" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads child processes from Linux /proc")
def test_busy_row_stops_its_spinner(threads, restore_threads):
    row = threads.measure("sft", "busy", steps=2)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:2] == ["sft", "busy"]
    assert cells[4].endswith(")") and "x (" in cells[4]  # median ratio and its quartiles
    assert spinners_of_this_process() == []


def test_history_line_names_every_compared_column(threads, restore_threads):
    line = threads.same_history(2)
    for column in ("reward_mean", "accuracy", "policy_loss", "grad_norm", "entropy", "kl_k1", "kl_k3"):
        assert column in line


def test_too_few_steps_is_refused_by_name():
    out = subprocess.run([sys.executable, str(SCRIPT), "--steps", "1"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "--steps must be at least 2" in out.stderr
