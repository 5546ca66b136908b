"""One torch thread or two? Step times of the lab's SFT and GRPO steps, on an idle machine and beside
a busy core.

The notebooks and the CLI train with one torch thread. This measures what that choice costs and what
it protects against. For each workload one process trains, and the thread count alternates step by
step (1 2, 2 1, 1 2, ...: every pair of neighbouring steps is one paired measurement, so drifting
load and the run's changing steps fall on both counts alike):

    sft     an SFT step of the `addition_sft` preset (its batch of 64, the lab's 96k-parameter model)
    grpo    a default GRPO step (32 prompts x 8 completions, from the shipped `addition_rl_start`)

    idle    nothing else started by this script
    busy    another process spins on one core for the duration (`python -c "while True: pass"`):
            what another program, a second notebook or a CI job next door does to the step

Prints, per workload and condition: the median step time at 1 and at 2 threads, and the median and
quartiles of the paired ratio (1-thread time / 2-thread time: above 1, two threads are faster), with
the 1-minute load average before and after. Then whether two seeded GRPO runs, one per thread count,
give the same history (`--history-steps` steps; 0 skips it): whether the choice changes results here.

    python bench/threads.py [--steps 40] [--workloads sft grpo] [--conditions idle busy] [--history-steps 40]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from datetime import date

import torch

from rlhf_lab.checkpoints.presets import get_preset
from rlhf_lab.model import LlamaModel
from rlhf_lab.rl import Trainer, make_config
from rlhf_lab.sft import SFTTrainer, lab_model_config
from rlhf_lab.text.tokenizer import default_tokenizer
from rlhf_lab.util.allocator import keep_freed_memory
from rlhf_lab.util.device import cpu_name


def sft_trainer():
    preset = get_preset("addition_sft")
    tokenizer = default_tokenizer()
    torch.manual_seed(preset.sft.seed)
    model = LlamaModel(lab_model_config(tokenizer, **preset.model))
    return SFTTrainer(dataclasses.replace(preset.sft, eval_every=0), tokenizer, model=model)


def grpo_trainer():
    return Trainer(make_config("grpo", eval_every=0, eval_examples=1, seed=0))


WORKLOADS = {"sft": sft_trainer, "grpo": grpo_trainer}


def paired_steps(trainer, steps: int) -> dict[int, list[float]]:
    """`steps` pairs of steps, one at 1 thread and one at 2, the order alternating pair by pair."""
    times: dict[int, list[float]] = {1: [], 2: []}
    for pair in range(steps):
        for threads in ((1, 2) if pair % 2 == 0 else (2, 1)):
            torch.set_num_threads(threads)
            start = time.perf_counter()
            trainer.train_step()
            times[threads].append(time.perf_counter() - start)
    return times


def measure(workload: str, condition: str, steps: int) -> str:
    spinner = None
    if condition == "busy":
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(1.0)  # let it take its core
    try:
        torch.set_num_threads(1)
        trainer = WORKLOADS[workload]()
        for _ in range(3):  # warm-up: allocator, first-call costs
            trainer.train_step()
        load = [os.getloadavg()[0]]
        times = paired_steps(trainer, steps)
        load.append(os.getloadavg()[0])
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    ratios = [one / two for one, two in zip(times[1], times[2])]
    low, _, high = statistics.quantiles(ratios, n=4)
    return (f"| {workload} | {condition} | {statistics.median(times[1]) * 1e3:.1f} | "
            f"{statistics.median(times[2]) * 1e3:.1f} | {statistics.median(ratios):.2f}x ({low:.2f}-{high:.2f}) | "
            f"{min(load):.2f}-{max(load):.2f} |")


def same_history(steps: int) -> str:
    """Two seeded GRPO runs of `steps` steps, at 1 and at 2 threads: which history columns agree exactly."""
    histories = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        histories[threads] = grpo_trainer().train(steps=steps)
    columns = ["reward_mean", "accuracy", "policy_loss", "grad_norm", "entropy", "kl_k1", "kl_k3"]
    one, two = histories[1][columns], histories[2][columns]
    same = [c for c in columns if one[c].equals(two[c])]  # NaN (the row before training) equals NaN here
    differ = [c for c in columns if c not in same]
    return (f"Seeded GRPO, {steps} steps at 1 and at 2 threads: identical in {', '.join(same) or 'no column'}"
            + (f"; different in {', '.join(differ)}" if differ else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="pairs of steps per workload and condition")
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=["sft", "grpo"])
    parser.add_argument("--conditions", nargs="+", choices=["idle", "busy"], default=["idle", "busy"])
    parser.add_argument("--history-steps", type=int, default=40, help="steps of the same-history check (0: skip)")
    args = parser.parse_args()
    keep_freed_memory()  # the allocator tuning the CLI turns on (rlhf_lab/util/allocator.py)
    if args.steps < 2:
        parser.error(f"--steps must be at least 2 (quartiles need two pairs), got {args.steps}")
    print(f"\nThreads, {date.today()}, {cpu_name()}, {os.cpu_count()} logical "
          f"CPUs, torch {torch.__version__}; {args.steps} pairs of steps per row, 1 and 2 threads alternating\n")
    print("| workload | condition | 1 thread ms/step | 2 threads ms/step | 1 / 2 threads (median, quartiles) | load |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for workload in args.workloads:
        for condition in args.conditions:
            print(measure(workload, condition, args.steps), flush=True)
    if args.history_steps > 0:
        print(f"\n{same_history(args.history_steps)}")


if __name__ == "__main__":
    main()
