"""Seconds per RL step, two code trees against each other, interleaved so machine load cancels out.

    python bench/rl_step.py --trees before=/path/to/old/checkout after=.        # A B A B ... rounds
    python bench/rl_step.py --trees now=. --algos grpo --steps 30 --rounds 5

Each (round, tree, algorithm) is one fresh process that imports rlhf_lab from that tree, trains
`--steps` steps from the shipped checkpoint with the algorithm's defaults (seed 0, no held-out
evaluation) and reports the median step time. The trees take turns within every round, so a load
change on a shared machine hits both alike; the table gives, per algorithm, the median over rounds of
each tree's median step time and the median and range of the per-round ratio against the first tree.
The load average is printed with the table. "cpu s/step" is the process's CPU time per whole
train_step (1 thread: the time it computed, not the time it waited for a core), the steadier
measure on a shared machine; its ratio is given too. Same seed: when two trees compute the same
arithmetic their histories are identical, and the script checks that the reward column agrees
(code that changes float rounding may, after enough steps, sample one different token).

    python bench/rl_step.py --trees before=/path/to/old/checkout after=. --algos grpo --paired 60

--paired N: one long-lived process per tree instead, and the trees take turns step by step (A B B A
A B ...: the order flips every step) for N steps after one warm-up step. Each step of one tree has a
partner step of the other, taken a few tens of milliseconds apart, so a load change between rounds
cannot fall on one tree only: on a shared machine the median of the N paired ratios is much steadier
than the per-round medians above (an A/A run of the same tree gives ~1.00 where rounds swing by 30%).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import date
from pathlib import Path

WORKER = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(int(sys.argv[4]))
from rlhf_lab.rl import Trainer, make_config
trainer = Trainer(make_config(sys.argv[2], steps=int(sys.argv[3]) + 1, eval_every=0, eval_examples=1, seed=0))
trainer.train_step()  # warm-up: first-call allocations and lazy initialisation
cpu = []
for _ in range(int(sys.argv[3])):
    start = time.process_time()
    trainer.train_step()
    cpu.append(time.process_time() - start)
steps = trainer.history[trainer.history["step"] > 1]
print(json.dumps({"step_time": statistics.median(steps["step_time"]),
                  "rollout_time": statistics.median(steps["rollout_time"]),
                  "update_time": statistics.median(steps["update_time"]),
                  "cpu_time": statistics.median(cpu),
                  "rewards": [round(r, 6) for r in steps["reward_mean"]]}))
"""


PAIRED_WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(int(sys.argv[3]))
from rlhf_lab.rl import Trainer, make_config
trainer = Trainer(make_config(sys.argv[2], eval_every=0, eval_examples=1, seed=0))
trainer.train_step()  # warm-up
print("ready", flush=True)
for _ in sys.stdin:  # one step per line received
    cpu, wall = time.process_time(), time.perf_counter()
    row = trainer.train_step()
    print(json.dumps({"cpu_time": time.process_time() - cpu, "step_time": time.perf_counter() - wall,
                      "reward": round(row["reward_mean"], 6)}), flush=True)
"""


def run_paired(trees: dict[str, Path], algo: str, steps: int, threads: int) -> dict[str, list[dict]]:
    """One worker process per tree; the trees take turns step by step (the order flips every step)."""
    workers = {name: subprocess.Popen([sys.executable, "-c", PAIRED_WORKER, str(tree), algo, str(threads)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tree,
                                      env={**os.environ, "PYTHONPATH": str(tree)})
               for name, tree in trees.items()}
    try:
        for worker in workers.values():
            if worker.stdout.readline().strip() != "ready":
                raise RuntimeError("a worker failed to start (run it alone to see its error)")
        results = {name: [] for name in workers}
        names = list(workers)
        for step in range(steps):
            for name in names if step % 2 == 0 else names[::-1]:
                workers[name].stdin.write("step\n")
                workers[name].stdin.flush()
                results[name].append(json.loads(workers[name].stdout.readline()))
        return results
    finally:
        for worker in workers.values():
            worker.stdin.close()
            worker.wait()


def report_paired(trees: dict[str, Path], algo: str, steps: int, threads: int) -> None:
    loads = [os.getloadavg()[0]]
    results = run_paired(trees, algo, steps, threads)
    loads.append(os.getloadavg()[0])
    base = next(iter(trees))
    print(f"\nRL step time, paired, {date.today()}, {platform.machine()} {platform.processor() or ''}, "
          f"{os.cpu_count()} cores, {threads} torch thread(s); 1-minute load average {min(loads):.2f}-{max(loads):.2f}; "
          f"{steps} steps per tree, the trees taking turns step by step\n")
    print(f"| algorithm | tree | s/step | cpu s/step | vs {base}, paired steps (median, quartiles) | "
          f"vs {base}, CPU time, paired steps (median, quartiles) | same rewards |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for name in trees:
        runs, ref = results[name], results[base]
        cells = []
        for key in ("step_time", "cpu_time"):
            ratios = [b[key] / r[key] for b, r in zip(ref, runs)]
            low, mid, high = statistics.quantiles(ratios, n=4)
            cells.append(f"{statistics.median(ratios):.3f}x ({low:.3f}-{high:.3f})")
        same = [r["reward"] for r in runs] == [r["reward"] for r in ref]
        print(f"| {algo} | {name} | {statistics.median(r['step_time'] for r in runs):.4f} | "
              f"{statistics.median(r['cpu_time'] for r in runs):.4f} | {cells[0]} | {cells[1]} | "
              f"{'yes' if same else 'NO'} |")


def run(tree: Path, algo: str, steps: int, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", WORKER, str(tree), algo, str(steps), str(threads)],
                         capture_output=True, text=True, env=env, cwd=tree, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", default=["now=."], help="NAME=PATH of a checkout (the first is the baseline)")
    parser.add_argument("--algos", nargs="+", default=["grpo", "gspo", "ppo"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--paired", type=int, default=0, metavar="N",
                        help="N steps per tree in long-lived processes taking turns step by step (see above)")
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.trees)
    trees = {name: Path(path).resolve() for name, path in trees.items()}
    if args.paired:
        for algo in args.algos:
            report_paired(trees, algo, args.paired, args.threads)
        return
    results = {(name, algo): [] for name in trees for algo in args.algos}
    loads = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        for algo in args.algos:
            for name, tree in trees.items():  # A B A B: the trees take turns
                results[name, algo].append(run(tree, algo, args.steps, args.threads))
                last = results[name, algo][-1]
                print(f"round {round_ + 1} {algo:5s} {name:8s} {last['step_time'] * 1000:7.1f} ms/step "
                      f"{last['cpu_time'] * 1000:7.1f} ms CPU/step, load {os.getloadavg()[0]:.2f}", flush=True)
        loads.append(os.getloadavg()[0])
    base = next(iter(trees))
    print(f"\nRL step time, {date.today()}, {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores, "
          f"{args.threads} torch thread(s); 1-minute load average {min(loads):.2f}-{max(loads):.2f}; "
          f"{args.rounds} interleaved rounds of {args.steps} steps (median per run, then median over rounds)\n")
    print("| algorithm | tree | s/step | rollout s | update s | vs " + base + " (median, range) | cpu s/step | "
          "vs " + base + ", CPU time (median, range) | same rewards |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for algo in args.algos:
        for name in trees:
            runs = results[name, algo]
            ratios = [b["step_time"] / r["step_time"] for b, r in zip(results[base, algo], runs)]
            cpu_ratios = [b["cpu_time"] / r["cpu_time"] for b, r in zip(results[base, algo], runs)]
            same = all(r["rewards"] == b["rewards"] for r, b in zip(runs, results[base, algo]))
            print(f"| {algo} | {name} | {statistics.median(r['step_time'] for r in runs):.3f} | "
                  f"{statistics.median(r['rollout_time'] for r in runs):.3f} | "
                  f"{statistics.median(r['update_time'] for r in runs):.3f} | "
                  f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
                  f"{statistics.median(r['cpu_time'] for r in runs):.3f} | "
                  f"{statistics.median(cpu_ratios):.2f}x ({min(cpu_ratios):.2f}-{max(cpu_ratios):.2f}) | "
                  f"{'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
