"""How much does the live dashboard slow training down?

Trains GRPO from a random initialisation (so the numbers do not depend on a checkpoint) with a
`LiveDashboard` in png mode (the notebook mode renders the same PNG and hands it to IPython), for
refresh_every in {1, 5, 10} with the time guards off, then with the defaults; on a tiny model
(hidden 32, 1 layer: fast steps, the worst case for overhead) and on the lab's standard model
with RLConfig's batch (a real lab step). Prints markdown tables:

    draw            median seconds per redraw (12 axes rendered by Agg + PNG encoding), wall clock
                    and CPU time of this process (on a shared machine the two differ: CPU time is
                    what the redraw costs on an idle machine of the same speed)
    overhead        dashboard seconds / training seconds during the steps, measured on this run
    @0.5 s, @1 s    the same, projected for the lab's typical RL steps of 0.5 s and 1 s from the
                    CPU draw time: draw / (seconds between redraws); with the defaults the time
                    guards set that gap

    python bench/dashboard_overhead.py [--steps 30] [--lab-steps 60] [--models tiny,lab]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import tempfile
import time

import matplotlib
import torch

from rlhf_lab.model import LlamaModel
from rlhf_lab.rl import Trainer, make_config
from rlhf_lab.sft import lab_model_config
from rlhf_lab.text.tokenizer import default_tokenizer
from rlhf_lab.util.allocator import keep_freed_memory
from rlhf_lab.util.device import cpu_name
from rlhf_lab.viz import LiveDashboard


def machine() -> str:
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return (f"{cpu_name()}, {os.cpu_count()} logical CPUs{load}; torch {torch.__version__} "
            f"({torch.get_num_threads()} thread), matplotlib {matplotlib.__version__}, "
            f"Python {platform.python_version()}")


class TimedDashboard(LiveDashboard):
    """Also records the CPU time of each redraw."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.cpu_times: list[float] = []

    def draw(self, trainer) -> None:
        start = time.process_time()
        super().draw(trainer)
        self.cpu_times.append(time.process_time() - start)


MODELS = {  # name -> (model size overrides, prompts per step); G = 8 for both
    "tiny": (dict(hidden_size=32, num_hidden_layers=1, intermediate_size=64), 16),
    "lab": ({}, 32),  # the lab's standard model (hidden 128, 4 layers) and RLConfig's batch: a real lab step
}


def run(steps: int, dashboard: LiveDashboard | None, model_name: str) -> Trainer:
    tokenizer = default_tokenizer()
    torch.manual_seed(0)
    sizes, prompts = MODELS[model_name]
    model = LlamaModel(lab_model_config(tokenizer, **sizes))
    config = make_config("grpo", steps=steps, prompts_per_step=prompts, num_generations=8, eval_every=0,
                         eval_examples=16, n_train=500, n_test=50, learning_rate=1e-3)
    trainer = Trainer(config, model=model, tokenizer=tokenizer, callbacks=[dashboard] if dashboard else [])
    trainer.train()
    return trainer


def projected(draw: float, dashboard: LiveDashboard, step_time: float) -> float:
    """Dashboard seconds per training second for a given step time (what `due()` lets through)."""
    gap = max(dashboard.min_interval, draw / dashboard.max_overhead if dashboard.max_overhead else 0.0)
    steps_between = max(dashboard.refresh_every, math.ceil(gap / step_time - 1e-9))
    return draw / (steps_between * step_time)


def table(model_name: str, steps: int, settings: list[tuple[str, dict]]) -> None:
    baseline = run(steps, None, model_name)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, kwargs in settings:
            dashboard = TimedDashboard(mode="png", png_dir=folder, raise_errors=True, **kwargs)
            trainer = run(steps, dashboard, model_name)
            draw, draw_cpu = statistics.median(dashboard.draw_times), statistics.median(dashboard.cpu_times)
            during = sum(dashboard.draw_times[1:-1])  # redraws between steps, not the first and last frames
            rows.append((name, len(dashboard.draw_times), draw, draw_cpu, trainer.train_time, during,
                         projected(draw_cpu, dashboard, 0.5), projected(draw_cpu, dashboard, 1.0)))
    sizes, prompts = MODELS[model_name]
    print(f"\n{model_name} model {sizes or '(hidden 128, 4 layers)'}, GRPO, {prompts} prompts x 8 "
          f"completions, {steps} steps: {baseline.train_time / steps:.3f} s per step without a dashboard.\n")
    print("| dashboard | redraws | draw, wall (s) | draw, CPU (s) | train (s) | dashboard during steps (s) "
          "| overhead | @0.5 s/step | @1 s/step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, count, draw, draw_cpu, train, during, at_half, at_one in rows:
        print(f"| {name} | {count} | {draw:.3f} | {draw_cpu:.3f} | {train:.2f} | {during:.2f} "
              f"| {during / train:.0%} | {at_half:.1%} | {at_one:.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="steps per run on the tiny model")
    parser.add_argument("--lab-steps", type=int, default=60, help="steps per run on the lab model")
    parser.add_argument("--models", default="tiny,lab", help="comma-separated: tiny, lab")
    args = parser.parse_args()
    keep_freed_memory()  # the allocator tuning the CLI turns on (rlhf_lab/util/allocator.py)
    torch.set_num_threads(1)
    print(f"Machine: {machine()}")
    no_guard = dict(min_interval=0.0, max_overhead=None)
    for model_name in args.models.split(","):
        every = (5, 10) if model_name == "lab" else (1, 5, 10)  # every step: too slow, see the tiny table
        settings = [(f"refresh_every={k}, no time guard", dict(refresh_every=k, **no_guard)) for k in every]
        settings.append(("defaults: refresh_every=5, min_interval=1 s, max_overhead=10%", {}))
        table(model_name, args.lab_steps if model_name == "lab" else args.steps, settings)
    print("\nredraws include the first frame (on_train_begin) and the last (on_train_end); 'dashboard during "
          "steps' and 'overhead' count only the redraws between steps.")


if __name__ == "__main__":
    main()
