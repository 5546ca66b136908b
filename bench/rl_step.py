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
Its s/step is the whole train_step; the rounds' s/step is the trainer's own step_time (rollout +
update, without the snapshot, metrics row and weight check around them, ~2.5 ms that neither tree
made faster): the paired table gives both, so the two modes compare like with like.

    python bench/rl_step.py --trees before=/path/to/old/checkout after=. --algos grpo --paired 100 \
        --phases 31 61 --per-step paired.csv

Whether the ratio changes as training goes on: both modes add a table by phase of training
(`--phases`: the last step of each phase but the last; the trainer counts the warm-up as step 1),
the rounds mode from the same runs' steps, the paired mode with each phase's rollout, update and
other time, and a table by the step's mean completion length (the workload of the decode loop and of
the update). `--per-step CSV` (paired) writes every step's times, completion length and reward.

    python bench/rl_step.py --trees before=/path/to/old/checkout after=. --algos grpo --paired 100 --repeats 5

--repeats R (paired): R sets of fresh processes, one set after the other. The median paired ratio
moves from one set of processes to the next (eight sets of the same two trees in one hour: 2.24x to
2.42x; bench/RESULTS.md, eighth round): heap layout, which core each process runs on and the state
of the machine's host are fixed for a process's life, and the steps of one set share them. The table
pools all steps and adds the median and range of the R sets' medians: the spread to hold a small
difference against.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
from datetime import date
from pathlib import Path

from rlhf_lab.util.device import cpu_name

WORKER = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(int(sys.argv[4]))
from rlhf_lab.rl import Trainer, make_config
try:  # opt-in allocator tuning (rlhf_lab/util/allocator.py); older trees did it in the Trainer
    from rlhf_lab.util.allocator import keep_freed_memory
    keep_freed_memory()
except ImportError:
    pass
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
                  "rewards": [round(r, 6) for r in steps["reward_mean"]],
                  "per_step": [{"step": int(s), "step_time": t, "cpu_time": c}
                               for s, t, c in zip(steps["step"], steps["step_time"], cpu)]}))
"""


PAIRED_WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(int(sys.argv[3]))
from rlhf_lab.rl import Trainer, make_config
try:  # opt-in allocator tuning (rlhf_lab/util/allocator.py); older trees did it in the Trainer
    from rlhf_lab.util.allocator import keep_freed_memory
    keep_freed_memory()
except ImportError:
    pass
trainer = Trainer(make_config(sys.argv[2], eval_every=0, eval_examples=1, seed=0))
trainer.train_step()  # warm-up
print("ready", flush=True)
for _ in sys.stdin:  # one step per line received
    cpu, wall = time.process_time(), time.perf_counter()
    row = trainer.train_step()
    print(json.dumps({"cpu_time": time.process_time() - cpu, "step_time": time.perf_counter() - wall,
                      "reward": round(row["reward_mean"], 6), "step": row["step"],
                      "rollout_time": row["rollout_time"], "update_time": row["update_time"],
                      "completion_len_mean": row["completion_len_mean"]}), flush=True)
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


def report_paired(trees: dict[str, Path], algo: str, steps: int, threads: int, phases: list[int],
                  per_step: Path | None, repeats: int = 1) -> None:
    loads = [os.getloadavg()[0]]
    base = next(iter(trees))
    runs_of_pairs = []  # one {tree: records} per set of fresh processes
    for repeat in range(repeats):
        results = run_paired(trees, algo, steps, threads)
        for records in results.values():
            add_derived_times(records)
        runs_of_pairs.append(results)
        loads.append(os.getloadavg()[0])
        if repeats > 1:
            medians = ", ".join(f"{name} {run_medians([results], base, name, 'step_time')[0]:.3f}x"
                                for name in list(trees)[1:])
            print(f"processes {repeat + 1} of {repeats}: median paired step ratio vs {base}: {medians}; "
                  f"load {loads[-1]:.2f}", flush=True)
    results = pool_runs(runs_of_pairs)
    print(f"\nRL step time, paired, {date.today()}, {cpu_name()}, "
          f"{os.cpu_count()} cores, {threads} torch thread(s); 1-minute load average {min(loads):.2f}-{max(loads):.2f}; "
          f"{steps} steps per tree{f' in each of {repeats} sets of fresh processes (pooled below)' if repeats > 1 else ''}, "
          f"the trees taking turns step by step. s/step: the whole train_step; "
          f"rollout + update s: the trainer's own step_time, what the rounds table's s/step is\n")
    per_run = f" | vs {base}, per set of processes (median of {repeats} medians, range)" if repeats > 1 else ""
    print(f"| algorithm | tree | s/step | rollout + update s | cpu s/step | vs {base}, paired steps (median, quartiles) | "
          f"vs {base}, rollout + update | vs {base}, CPU time{per_run} | same rewards |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if repeats > 1 else "") + " --- |")
    for name in trees:
        runs, ref = results[name], results[base]
        cells = []
        for key in ("step_time", "trainer_time", "cpu_time"):
            ratios = [b[key] / r[key] for b, r in zip(ref, runs)]
            low, mid, high = statistics.quantiles(ratios, n=4)
            cells.append(f"{statistics.median(ratios):.3f}x ({low:.3f}-{high:.3f})")
        if repeats > 1:
            medians = run_medians(runs_of_pairs, base, name, "step_time")
            cells.append(f"{statistics.median(medians):.3f}x ({min(medians):.3f}-{max(medians):.3f})")
        same = all([r["reward"] for r in run[name]] == [r["reward"] for r in run[base]] for run in runs_of_pairs)
        times = " | ".join(f"{statistics.median(r[k] for r in runs):.4f}" for k in ("step_time", "trainer_time", "cpu_time"))
        print(f"| {algo} | {name} | {times} | {' | '.join(cells)} | {'yes' if same else 'NO'} |")
    print(f"\nBy phase of training ({algo}; wall ms, medians over the group's steps; ratios paired step by "
          f"step, median (quartiles); other = train_step minus rollout and update)\n")
    report_groups(results, base, phase_groups(results[base], phases))
    print(f"\nBy the step's mean completion length ({algo}; {base}'s lengths, three bands of equal count)\n")
    report_groups(results, base, length_groups(results[base]))
    if per_step is not None:
        write_per_step(results, per_step)
        print(f"\nper-step records: {per_step}")


def pool_runs(runs_of_pairs: list[dict[str, list[dict]]]) -> dict[str, list[dict]]:
    """The records of several sets of processes, one list per tree, in the same order for every tree
    (so that record i of one tree is still the partner of record i of another), each marked with the
    number of its set ("run", from 1)."""
    return {name: [{**record, "run": i + 1} for i, run in enumerate(runs_of_pairs) for record in run[name]]
            for name in runs_of_pairs[0]}


def run_medians(runs_of_pairs: list[dict[str, list[dict]]], base: str, name: str, key: str) -> list[float]:
    """Per set of processes, the median paired ratio base[key] / name[key]. Their spread is the noise of
    the median itself from one set of fresh processes to the next (heap layout, which core, the
    machine's state), which the quartiles of one set's steps do not show."""
    return [statistics.median(b[key] / r[key] for b, r in zip(run[base], run[name])) for run in runs_of_pairs]


PHASE_KEYS = {"step": "step_time", "rollout": "rollout_time", "update": "update_time", "other": "other_time"}


def add_derived_times(records: list[dict]) -> None:
    """trainer_time: the trainer's own step_time (rollout + update: what a history row and the rounds
    mode report); other_time: the whole train_step's wall time minus it, i.e. what train_step does
    around the two phases: the snapshot that makes a step atomic, the metrics row, the weight check."""
    for record in records:
        record["trainer_time"] = record["rollout_time"] + record["update_time"]
        record["other_time"] = record["step_time"] - record["trainer_time"]


def paired_ratio(ref: list[dict], runs: list[dict], key: str) -> str:
    """Median and quartiles of the step-by-step ratio ref[key] / runs[key]."""
    ratios = [b[key] / r[key] for b, r in zip(ref, runs)]
    if len(ratios) < 2:
        return f"{ratios[0]:.2f}x"
    low, _, high = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):.2f}x ({low:.2f}-{high:.2f})"


def report_groups(results: dict[str, list[dict]], base: str, groups: dict[str, list[int]]) -> None:
    """Per group of paired steps (a phase of training, a band of completion lengths): the mean
    completion length, each tree's median times (ms) and the paired ratios against `base`."""
    print(f"| steps | n | mean completion length | tree | step ms | rollout ms | update ms | other ms | "
          f"vs {base}: step | rollout | update | other |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, indices in groups.items():
        ref = [results[base][i] for i in indices]
        length = statistics.mean(r["completion_len_mean"] for r in ref)
        for name, records in results.items():
            runs = [records[i] for i in indices]
            times = " | ".join(f"{statistics.median(r[k] for r in runs) * 1000:.1f}" for k in PHASE_KEYS.values())
            ratios = " | ".join(paired_ratio(ref, runs, k) for k in PHASE_KEYS.values())
            print(f"| {label} | {len(indices)} | {length:.2f} | {name} | {times} | {ratios} |")


def phase_groups(records: list[dict], edges: list[int]) -> dict[str, list[int]]:
    """Indices of the paired steps in each phase of training: steps up to edges[0], up to edges[1], ...,
    then the rest (step numbers as the trainer counts them; step 1, the warm-up, is not in `records`)."""
    bounds = [1, *(e for e in edges if 1 < e < records[-1]["step"]), records[-1]["step"]]
    return {f"{lo + 1}-{hi}": [i for i, r in enumerate(records) if lo < r["step"] <= hi]
            for lo, hi in zip(bounds, bounds[1:])}


def length_groups(records: list[dict], bands: int = 3) -> dict[str, list[int]]:
    """Indices of the paired steps by the baseline's mean completion length, in `bands` bands of
    (nearly) equal count, shortest first."""
    order = sorted(range(len(records)), key=lambda i: records[i]["completion_len_mean"])
    chunks = [order[k * len(order) // bands: (k + 1) * len(order) // bands] for k in range(bands)]
    return {f"len {records[c[0]]['completion_len_mean']:.2f}-{records[c[-1]]['completion_len_mean']:.2f}": sorted(c)
            for c in chunks if c}


def write_per_step(results: dict[str, list[dict]], path: Path) -> None:
    """One CSV row per (tree, paired step): the step's times, completion length and reward."""
    columns = ["tree", "run", "step", "step_time", "cpu_time", "rollout_time", "update_time", "trainer_time", "other_time",
               "completion_len_mean", "reward"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for name, records in results.items():
            writer.writerows({"tree": name, **r} for r in records)


def report_round_phases(results: dict, trees: dict, algos: list[str], edges: list[int]) -> None:
    """Rounds mode, per phase of training: each run's median step time over the phase's steps, and
    the per-round ratio against the first tree (median, range). The same processes give every
    phase, so a ratio that differs between phases differs with the step index, not with the run."""
    base = next(iter(trees))
    print("\nBy phase of training (the same runs; per run the median over the phase's steps, then the "
          "median over rounds; ratios per round, median (range))\n")
    print(f"| algorithm | steps | tree | s/step | vs {base} | cpu s/step | vs {base}, CPU time |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for algo in algos:
        for label, indices in phase_groups(results[base, algo][0]["per_step"], edges).items():
            medians = {name: [{k: statistics.median(run["per_step"][i][k] for i in indices)
                               for k in ("step_time", "cpu_time")} for run in results[name, algo]]
                       for name in trees}
            for name in trees:
                cells = []
                for key in ("step_time", "cpu_time"):
                    ratios = [b[key] / r[key] for b, r in zip(medians[base], medians[name])]
                    cells.append(f"{statistics.median(r[key] for r in medians[name]):.3f} | "
                                 f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
                print(f"| {algo} | {label} | {name} | {cells[0]} | {cells[1]} |")


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
    parser.add_argument("--phases", type=int, nargs="*", default=[31, 61], metavar="STEP",
                        help="the last step of each phase of training but the last, for the tables by phase (default 31 61: steps 2-31 are a 30-step run's; "
                             "none: no such table)")
    parser.add_argument("--repeats", type=int, default=1, metavar="R",
                        help="with --paired: R sets of fresh processes, one after the other; the tables pool their "
                             "steps and add the median and range of the R sets' median ratios")
    parser.add_argument("--per-step", type=Path, metavar="CSV",
                        help="with --paired: write every paired step's times, completion length and reward")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be a whole number >= 1 (sets of fresh processes), got {args.repeats}")
    trees = dict(item.split("=", 1) for item in args.trees)
    trees = {name: Path(path).resolve() for name, path in trees.items()}
    if args.paired:
        for algo in args.algos:
            per_step = args.per_step
            if per_step is not None and len(args.algos) > 1:  # one file per algorithm
                per_step = per_step.with_name(f"{per_step.stem}_{algo}{per_step.suffix}")
            report_paired(trees, algo, args.paired, args.threads, args.phases, per_step, args.repeats)
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
    print(f"\nRL step time, {date.today()}, {cpu_name()}, {os.cpu_count()} cores, "
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
    if args.phases:
        report_round_phases(results, trees, args.algos, args.phases)


if __name__ == "__main__":
    main()
